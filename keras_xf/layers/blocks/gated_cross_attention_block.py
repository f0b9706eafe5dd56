"""Flamingo-style tanh-gated cross-attention in front of a decoder layer (survey §6.5)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class GatedCrossAttentionBlock(PassesMixerArguments, keras.layers.Layer):
    """A decoder layer preceded by gated cross-attention to image (or other) states.

    Multimodal decoders can feed visual representations into the attention layers of a text
    decoder (survey §6.5). In the Flamingo form the cross-attention and its feedforward are
    inserted in front of a language-model layer `Block`, each behind a `tanh` gate:

        y   = x + tanh(α_xattn) · CrossAttn(LNorm(x), H_img)
        z   = y + tanh(α_ffn) · FFN(LNorm(y))
        out = Block(z)

    With `α_xattn = α_ffn = 0` (the initial value) both gates are closed and
    `out = Block(x)`: the decoder starts as a pure language model and learns how much image
    information to let in.

    Args:
        block: the decoder layer (a `TransformerBlock` without `cross_attention`).
        cross_attention: a `MultiHeadAttention` attending from the text to `encoder_outputs`.
        feedforward: optional gated feedforward (e.g. `FeedForward`); `None` for none.
        gate_initializer: initializer of the two scalar gates `α` (default zeros).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]` text states.
        encoder_outputs: `[B, S, d]` image states; with a cache, give them on the first call
            (filling the cross-attention cache) and leave them `None` afterwards.
        encoder_padding_mask: boolean `[B, S]`.
        padding_mask, attention_mask, use_causal_mask, cache_index, training: passed to
            `block`.
        cache: `(block_cache, cross_attention_cache)` from `init_cache`.
        **kwargs: mixer-specific arguments (e.g. `attention_bias`), passed to `block`.

    Returns:
        As `block`: `[B, T, d]`, or `(outputs, new_cache)` when a cache is given, or a dict
        when the block's mixer returns one (e.g. with `return_attention_scores=True`).

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(2), FeedForward(32), norm_placement="pre")
    >>> gated = GatedCrossAttentionBlock(block, MultiHeadAttention(2), FeedForward(32))
    >>> y = gated(keras.random.normal((2, 5, 16)), encoder_outputs=keras.random.normal((2, 4, 16)),
    ...           use_causal_mask=True)
    """

    def __init__(self, block, cross_attention, feedforward=None, gate_initializer="zeros",
                 **kwargs):
        super().__init__(**kwargs)
        policy = self.dtype_policy if kwargs.get("dtype") is not None else None
        self.block = with_dtype_policy(as_layer(block, "block", kind=TransformerBlock), policy)
        if self.block.cross_attention is not None:
            raise ValueError(
                "The block of a GatedCrossAttentionBlock must not have its own cross_attention. "
                f"Received: block with cross_attention={type(self.block.cross_attention).__name__}"
            )
        self.cross_attention = with_dtype_policy(
            as_layer(cross_attention, "cross_attention", kind=SequenceMixer), policy
        )
        self.feedforward = with_dtype_policy(
            as_layer(feedforward, "feedforward", optional=True, kind=FeedForwardLayer), policy
        )
        self.gate_initializer = get_initializer("gate_initializer", gate_initializer)
        self.cross_attention_norm = make_normalization(
            self.normalization, self.epsilon, self.dtype_policy, "cross_attention_norm"
        )
        self.feedforward_norm = None
        if self.feedforward is not None:
            self.feedforward_norm = make_normalization(
                self.normalization, self.epsilon, self.dtype_policy, "feedforward_norm"
            )

    # The stack's final normalisation follows the decoder layer's own settings.
    @property
    def normalization(self):
        return self.block.normalization

    @property
    def norm_placement(self):
        return self.block.norm_placement

    @property
    def epsilon(self):
        return self.block.epsilon

    @property
    def mixer(self):
        return self.block.mixer

    def build(self, inputs_shape, encoder_outputs_shape=None):
        encoder_outputs_shape = encoder_outputs_shape or inputs_shape
        self.cross_attention_gate = self.add_weight(
            name="cross_attention_gate", shape=(), initializer=self.gate_initializer,
            dtype="float32",
        )
        self.cross_attention_norm.build(inputs_shape)
        if not self.cross_attention.built:
            self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        if self.feedforward is not None:
            self.feedforward_gate = self.add_weight(
                name="feedforward_gate", shape=(), initializer=self.gate_initializer,
                dtype="float32",
            )
            self.feedforward_norm.build(inputs_shape)
            if not self.feedforward.built:
                self.feedforward.build(inputs_shape)
        if not self.block.built:
            self.block.build(inputs_shape)

    def _gate(self, gate, outputs):
        return ops.cast(ops.tanh(gate), outputs.dtype) * outputs

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """`(block_cache, cross_attention_cache)`; the latter holds the image keys/values."""
        if encoder_length is None:
            raise ValueError(
                "init_cache of a GatedCrossAttentionBlock needs encoder_length. Received: "
                "encoder_length=None"
            )
        return (
            self.block.init_cache(batch_size, max_length, dtype),
            self.cross_attention.init_cache(batch_size, encoder_length, dtype),
        )

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
        **kwargs,
    ):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        block_cache, cross_cache = (None, None) if cache is None else cache
        hidden, new_cross_cache = self._gated_cross_attention(
            inputs, encoder_outputs, encoder_padding_mask, cross_cache, training)
        results = self.block(
            hidden,
            padding_mask=padding_mask,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            cache=block_cache,
            cache_index=cache_index,
            training=training,
            **mixer_arguments(kwargs, mixer_options),
        )
        outputs, new_block_cache, extras = split_results(results, cache is not None)
        return join_results(outputs, (new_block_cache, new_cross_cache), extras, cache is not None)

    def fill_cache(self, inputs, padding_mask=None, attention_mask=None, encoder_outputs=None,
                   encoder_padding_mask=None, use_causal_mask=None, cache=None,
                   cache_index=None, training=None, **kwargs):
        """What the layer leaves behind for `inputs` without its outputs: the gated
        cross-attention and feedforward, then the decoder layer's `fill_cache` (see
        `TransformerBlock.fill_cache`). Returns `(new_cache, extras)`."""
        if not isinstance(inputs, keras.KerasTensor):
            inputs = ops.convert_to_tensor(inputs, dtype=self.compute_dtype)
        block_cache, cross_cache = (None, None) if cache is None else cache
        hidden, new_cross_cache = self._gated_cross_attention(
            inputs, encoder_outputs, encoder_padding_mask, cross_cache, training)
        new_block_cache, extras = self.block.fill_cache(
            hidden, padding_mask=padding_mask, attention_mask=attention_mask,
            use_causal_mask=use_causal_mask, cache=block_cache, cache_index=cache_index,
            training=training, **kwargs)
        return (None if cache is None else (new_block_cache, new_cross_cache)), extras

    def _gated_cross_attention(self, inputs, encoder_outputs, encoder_padding_mask, cross_cache,
                               training):
        """`z` from `x` (the class docstring's equations) and the new cross-attention cache."""
        if encoder_outputs is None and cross_cache is None:
            raise ValueError(
                "GatedCrossAttentionBlock attends to encoder_outputs: pass them (or a filled "
                "cache). Received: encoder_outputs=None"
            )
        if encoder_outputs is not None:
            check_padding_mask(encoder_padding_mask, encoder_outputs,
                               name="encoder_padding_mask", inputs_name="encoder_outputs")
        cross_kwargs = {} if encoder_padding_mask is None else {"padding_mask": encoder_padding_mask}
        if cross_cache is not None:
            cross_kwargs["cache"] = cross_cache
        attended = self.cross_attention(
            self.cross_attention_norm(inputs), encoder_outputs, training=training, **cross_kwargs
        )
        new_cross_cache = None
        if cross_cache is not None:
            attended, new_cross_cache = attended
        hidden = inputs + self._gate(self.cross_attention_gate, attended)
        if self.feedforward is not None:
            transformed = self.feedforward(self.feedforward_norm(hidden), training=training)
            hidden = hidden + self._gate(self.feedforward_gate, transformed)
        return hidden, new_cross_cache

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, mixer_options=None, **kwargs):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        extra = mixer_arguments(kwargs, mixer_options)
        extras = None
        if extra:
            block_cache = None if cache is None else cache[0]
            spec = self.block.compute_output_spec(inputs, cache=block_cache, **extra)
            extras = split_results(spec, cache is not None)[2]
        return join_results(outputs, new_specs(cache), extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "block": keras.saving.serialize_keras_object(self.block),
                "cross_attention": keras.saving.serialize_keras_object(self.cross_attention),
                "feedforward": None
                if self.feedforward is None
                else keras.saving.serialize_keras_object(self.feedforward),
                "gate_initializer": keras.initializers.serialize(self.gate_initializer),
            }
        )
        return config
