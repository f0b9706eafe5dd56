"""One Transformer layer: a sequence mixer, optional cross-attention and a feedforward (survey §2.1)."""

import keras

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import first_positions
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.layers.residual.residual import Residual
from keras_xf.layers.residual.residual import validate_normalization
from keras_xf.layers.residual.residual import validate_residual_weights
from keras_xf.ops.checks import check_output_length
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_rank


@keras.saving.register_keras_serializable(package="keras_xf")
class TransformerBlock(PassesMixerArguments, keras.layers.Layer):
    """An encoder or decoder layer built from sub-layers, each wrapped in a `Residual`.

    Encoder layer: `H' = Layer_ffn(Layer_self(H))`; decoder layer:
    `S' = Layer_ffn(Layer_cross(H_enc, Layer_self(S)))` (survey §2.1, §2.6), where each
    `Layer_F` is post-norm `LNorm(F(x) + x)` or pre-norm `F(LNorm(x)) + x` (§2.4), or one
    of the deep-model forms of `Residual` (§4.2.1: weighted `LNorm(F(x) + β·x) + γ·x` and
    DeepNorm, the sandwich norm `"pre_and_post"`, ReZero).

    Args:
        mixer: a `SequenceMixer` (e.g. `MultiHeadAttention`), or its serialised config.
        feedforward: a `FeedForwardLayer` (`FeedForward`, `MixtureOfExperts`, …), or its
            config; `None` for a block without one, `H' = Layer_self(H)` (a Mamba block:
            pre-norm, the mixer, the residual; `feedforward_residual` is then `None`).
        cross_attention: optional `SequenceMixer` (a `MultiHeadAttention`) attending to
            `encoder_outputs`.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"` (see `Residual`).
        norm_placement: `"post"` (survey default), `"pre"`, `"weighted"`,
            `"pre_and_post"` or `"rezero"` (see `Residual`).
        dropout: residual dropout rate.
        epsilon: normalisation epsilon.
        inner_weight, outer_weight, learned_weights: β, γ and whether they are learned, for
            `norm_placement="weighted"` (see `Residual`); each sub-layer has its own.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`.
        attention_mask: boolean `[B, T, S]` for the mixer (with a cache, `S` is its length).
        encoder_outputs: `[B, S_enc, d]` for cross-attention; with a cache, give it on the
            first call to fill the cross-attention cache and leave it `None` afterwards.
        encoder_padding_mask: boolean `[B, S_enc]`.
        use_causal_mask: bool for the mixer (`None`: the mixer's own default).
        cache, cache_index: see `init_cache`; the cache is the mixer's cache, or a tuple
            `(mixer_cache, cross_attention_cache)` when the block has cross-attention.
        training: bool.
        **kwargs: mixer-specific arguments, passed to the mixer unchanged when not `None`
            (e.g. `attention_bias`, `attention_multiplier`, `attention_weights`,
            `return_attention_scores` of `MultiHeadAttention`); `PassesMixerArguments` moves
            the Python values among them into `mixer_options` for Keras.
        output_length: optional int `n ≤ T`: the block returns the first `n` positions only,
            `[B, n, d]`. Where `computes_first_positions` holds and no cache or
            mixer-specific argument is given, only those rows are computed: the mixer's
            queries, the residuals, the norms and the feedforward run on them, the keys and
            values on all `T` positions (an `attention_mask` loses its other query rows), so
            the rows equal those of the full block. Otherwise the full outputs are sliced.

    Returns:
        `[B, T, d]` (`[B, n, d]` with `output_length`), or `(outputs, new_cache)` when a
        cache is given. When the mixer returns a dict (e.g. with
        `return_attention_scores=True`), one dict: its entries (such as
        `"attention_scores"`), `"outputs"` the block's outputs, and `"cache"` the block's new
        cache when a cache is given.

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(4), FeedForward(64), norm_placement="pre")
    >>> y = block(keras.random.normal((2, 5, 16)), use_causal_mask=True)
    """

    def __init__(
        self,
        mixer,
        feedforward,
        cross_attention=None,
        normalization="layer_norm",
        norm_placement="post",
        dropout=0.0,
        epsilon=1e-5,
        inner_weight=1.0,
        outer_weight=0.0,
        learned_weights=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_normalization(normalization, norm_placement, dropout, epsilon)
        validate_residual_weights(norm_placement, inner_weight, outer_weight, learned_weights)
        mixer = as_layer(mixer, "mixer", kind=SequenceMixer)
        feedforward = as_layer(feedforward, "feedforward", optional=True, kind=FeedForwardLayer)
        cross_attention = as_layer(
            cross_attention, "cross_attention", optional=True, kind=SequenceMixer
        )
        # A dtype given to the block reaches the (unbuilt) sub-layers it was given.
        policy = self.dtype_policy if kwargs.get("dtype") is not None else None
        mixer = with_dtype_policy(mixer, policy)
        feedforward = with_dtype_policy(feedforward, policy)
        cross_attention = with_dtype_policy(cross_attention, policy)
        self.normalization = normalization
        self.norm_placement = norm_placement
        self.dropout = dropout
        self.epsilon = epsilon
        self.inner_weight = inner_weight
        self.outer_weight = outer_weight
        self.learned_weights = learned_weights

        residual = self.make_residual
        self.mixer_residual = residual(mixer, "mixer_residual")
        self.cross_attention_residual = None
        if cross_attention is not None:
            self.cross_attention_residual = residual(cross_attention, "cross_attention_residual")
        self.feedforward_residual = None
        if feedforward is not None:
            self.feedforward_residual = residual(feedforward, "feedforward_residual")

    def make_residual(self, layer, name):
        """The wrapper of one sub-layer, a `Residual`; a subclass may return another
        residual form with `Residual`'s call contract (`RungeKuttaBlock`)."""
        return Residual(
            layer,
            norm_placement=self.norm_placement,
            normalization=self.normalization,
            dropout=self.dropout,
            epsilon=self.epsilon,
            inner_weight=self.inner_weight,
            outer_weight=self.outer_weight,
            learned_weights=self.learned_weights,
            dtype=self.dtype_policy,
            name=name,
        )

    @property
    def mixer(self):
        return self.mixer_residual.layer

    @property
    def feedforward(self):
        residual = self.feedforward_residual
        return None if residual is None else residual.layer

    @property
    def computes_first_positions(self):
        """Whether `output_length` computes the first positions alone, exactly: the mixer is
        a `MultiHeadAttention` (not a subclass, which may reduce or select keys per call)
        without an attention pattern, whose rows depend on their own query and position
        only; there is no cross-attention; the feedforward is position-wise without a
        padding mask (a mixture of experts with capacity depends on the other tokens)."""
        mixer, feedforward = self.mixer, self.feedforward
        return (
            type(mixer) is MultiHeadAttention
            and mixer.pattern is None
            and self.cross_attention is None
            and (feedforward is None or not feedforward.uses_padding_mask)
        )

    @property
    def cross_attention(self):
        residual = self.cross_attention_residual
        return None if residual is None else residual.layer

    def build(self, inputs_shape, encoder_outputs_shape=None):
        if len(inputs_shape) != 3:
            raise ValueError(
                "TransformerBlock expects inputs of rank 3 [batch, length, dim]. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        self.mixer_residual.build(inputs_shape)
        if self.cross_attention is not None:
            encoder_outputs_shape = encoder_outputs_shape or inputs_shape
            if not self.cross_attention.built:
                self.cross_attention.build(inputs_shape, encoder_outputs_shape)
            self.cross_attention_residual.build(inputs_shape)
        if self.feedforward_residual is not None:
            self.feedforward_residual.build(inputs_shape)

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """The mixer's cache, paired with a cross-attention cache when there is one."""
        cache = self.mixer.init_cache(batch_size, max_length, dtype)
        if self.cross_attention is None:
            return cache
        if encoder_length is None:
            raise ValueError("init_cache of a block with cross-attention needs encoder_length.")
        return (cache, self.cross_attention.init_cache(batch_size, encoder_length, dtype))

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        encoder_outputs=None,
        encoder_padding_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
        mixer_options=None,
        output_length=None,
        **kwargs,
    ):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        check_output_length(output_length, inputs)
        self_cache, cross_cache = cache, None
        if cache is not None and self.cross_attention is not None:
            self_cache, cross_cache = cache
        mixer_kwargs = mixer_arguments(kwargs, mixer_options)
        rows = None
        if output_length is not None and cache is None and not mixer_kwargs and (
            self.computes_first_positions
        ):
            rows = output_length
            if attention_mask is not None:
                attention_mask = attention_mask[..., :rows, :]
        results = self.mixer_residual(
            inputs,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            cache=self_cache,
            cache_index=cache_index,
            training=training,
            output_length=rows,
            **mixer_kwargs,
        )
        outputs, new_self_cache, extras = split_results(results, self_cache is not None)

        new_cross_cache = None
        if self.cross_attention is not None:
            if encoder_outputs is None and cross_cache is None:
                raise ValueError(
                    "This block has cross-attention: pass encoder_outputs (or a filled cache)."
                )
            if encoder_outputs is not None:
                check_padding_mask(encoder_padding_mask, encoder_outputs,
                                   name="encoder_padding_mask", inputs_name="encoder_outputs")
            outputs = self.cross_attention_residual(
                outputs,
                encoder_outputs,
                padding_mask=encoder_padding_mask,
                cache=cross_cache,
                training=training,
            )
            if cross_cache is not None:
                outputs, new_cross_cache = outputs
        elif encoder_outputs is not None:
            raise ValueError(
                "encoder_outputs was given to a TransformerBlock without cross_attention."
            )

        if self.feedforward_residual is not None:
            outputs = self.feedforward_residual(
                outputs, training=training, **self._feedforward_kwargs(padding_mask, cache))
        if output_length is not None and rows is None:
            outputs = outputs[:, :output_length]
        new_cache = new_self_cache
        if self.cross_attention is not None:
            new_cache = (new_self_cache, new_cross_cache)
        return join_results(outputs, new_cache, extras, cache is not None)

    def fill_cache(self, inputs, padding_mask=None, attention_mask=None, encoder_outputs=None,
                   encoder_padding_mask=None, use_causal_mask=None, cache=None,
                   cache_index=None, training=None, **kwargs):
        """What the layer leaves behind for `inputs` without computing its outputs: only the
        mixer sub-layer runs, for its new cache and the extras asked of it (e.g.
        `return_attention_scores=True`). A stack fills a skipped layer's cache this way
        (survey §5.6: the state of an exited token copied upward); the mixer's outputs are
        unused, and XLA removes their computation. The arguments are `call`'s (the encoder
        ones are unused: a cross-attention cache is kept as it is).

        Returns:
            `(new_cache, extras)`: the block's new cache (`None` without a cache) and the
            mixer's extra results (a dict, or `None`).
        """
        self_cache, cross_cache = cache, None
        if cache is not None and self.cross_attention is not None:
            self_cache, cross_cache = cache
        results = self.mixer_residual(
            inputs,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            cache=self_cache,
            cache_index=cache_index,
            training=training,
            **kwargs,
        )
        _, new_cache, extras = split_results(results, self_cache is not None)
        if self.cross_attention is not None and cache is not None:
            new_cache = (new_cache, cross_cache)
        return new_cache, extras

    def _feedforward_kwargs(self, padding_mask, cache):
        """The padding mask for a feedforward that uses one (`uses_padding_mask = True`, e.g.
        `MixtureOfExperts`, where padding tokens must not take expert capacity)."""
        if padding_mask is None or cache is not None or not self.feedforward.uses_padding_mask:
            return {}
        return {"padding_mask": padding_mask}

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, mixer_options=None,
                            output_length=None, **kwargs):
        outputs = keras.KerasTensor(first_positions(inputs.shape, output_length),
                                    dtype=self.compute_dtype)
        extra = mixer_arguments(kwargs, mixer_options)
        extras = None
        if extra:
            self_cache = cache
            if cache is not None and self.cross_attention is not None:
                self_cache = cache[0]
            mixer_spec = self.mixer_residual.compute_output_spec(inputs, cache=self_cache, **extra)
            extras = split_results(mixer_spec, self_cache is not None)[2]
        return join_results(outputs, new_specs(cache), extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mixer": keras.saving.serialize_keras_object(self.mixer),
                "feedforward": None
                if self.feedforward is None
                else keras.saving.serialize_keras_object(self.feedforward),
                "cross_attention": None
                if self.cross_attention is None
                else keras.saving.serialize_keras_object(self.cross_attention),
                "normalization": self.normalization,
                "norm_placement": self.norm_placement,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
                "inner_weight": self.inner_weight,
                "outer_weight": self.outer_weight,
                "learned_weights": self.learned_weights,
            }
        )
        return config
