"""A reversible residual layer (RevNet, Reformer; survey §5.4)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.layers.residual.residual import validate_normalization
from keras_xf.ops.checks import check_rank


def couple(inputs, f, g):
    """`[y1, y2]` from `[x1, x2]` (halves of the last axis): `y1 = x1 + f(x2)`,
    `y2 = x2 + g(y1)`."""
    x1, x2 = ops.split(inputs, 2, axis=-1)
    y1 = x1 + f(x2)
    return ops.concatenate([y1, x2 + g(y1)], axis=-1)


@keras.saving.register_keras_serializable(package="keras_xf")
class ReversibleBlock(PassesMixerArguments, keras.layers.Layer):
    """A reversible Transformer layer on two streams `x = [x1, x2]` (survey §5.4; Gomez et
    al. 2017, Reformer):

        y1 = x1 + F(x2),    y2 = x2 + G(y1),
        F = mixer∘LNorm,    G = feedforward∘LNorm (pre-norm sub-layers).

    Its inputs follow from its outputs, `x2 = y2 − G(y1)`, `x1 = y1 − F(x2)`, so a stack of
    such layers need not keep any layer's activations for the backward pass:
    `ReversibleStack` keeps the last outputs only and recomputes each layer's inputs (and
    the sub-layers' gradients) on the way back. The two streams are the halves of the last
    axis, `[B, T, 2d]`, so the block maps one tensor to one tensor as every block does.

    `F` and `G` must be deterministic functions for the inverse to hold in training (no
    dropout inside the mixer or the feedforward).

    Args:
        mixer: a `SequenceMixer` of width `d` (e.g. `MultiHeadAttention`), or its config.
        feedforward: a `FeedForwardLayer` of width `d`, or its config.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"`.
        epsilon: normalisation epsilon.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, 2d]`, the streams `[x1, x2]`.
        padding_mask, attention_mask, use_causal_mask, cache, cache_index, training: for the
            mixer, as in `TransformerBlock`; the cache is the mixer's.
        **kwargs: mixer-specific arguments, passed to the mixer unchanged.

    Returns:
        `[B, T, 2d]` (`[y1, y2]`), or `(outputs, new_cache)` with a cache, or the mixer's
        dict with `"outputs"` replaced.

    Example:
    >>> block = ReversibleBlock(MultiHeadAttention(4), FeedForward(64))
    >>> y = block(keras.random.normal((2, 5, 32)), use_causal_mask=True)
    """

    def __init__(self, mixer, feedforward, normalization="layer_norm", epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        validate_normalization(normalization, "pre", 0.0, epsilon)
        # A dtype given to the block reaches the (unbuilt) sub-layers it was given.
        policy = self.dtype_policy if kwargs.get("dtype") is not None else None
        self.mixer = with_dtype_policy(as_layer(mixer, "mixer", kind=SequenceMixer), policy)
        self.feedforward = with_dtype_policy(
            as_layer(feedforward, "feedforward", kind=FeedForwardLayer), policy)
        self.normalization = normalization
        self.epsilon = epsilon
        self.mixer_norm = make_normalization(normalization, epsilon, self.dtype_policy,
                                             "mixer_norm")
        self.feedforward_norm = make_normalization(normalization, epsilon, self.dtype_policy,
                                                   "feedforward_norm")

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None or inputs_shape[-1] % 2:
            raise ValueError(
                "ReversibleBlock expects inputs [batch, length, 2 * dim] (two streams). "
                f"Received: inputs_shape={tuple(inputs_shape)}")
        stream_shape = tuple(inputs_shape[:-1]) + (inputs_shape[-1] // 2,)
        for layer in (self.mixer_norm, self.mixer, self.feedforward_norm, self.feedforward):
            if not layer.built:
                layer.build(stream_shape)

    def feedforward_kwargs(self, padding_mask):
        """The padding mask for a feedforward that takes one (`uses_padding_mask`)."""
        if padding_mask is None or not self.feedforward.uses_padding_mask:
            return {}
        return {"padding_mask": padding_mask}

    def branch_variables(self, branch):
        """The trainable variables of `F` (`branch` 0) or `G` (`branch` 1), in the order
        `apply_branch` takes their values."""
        norm, layer = self._branch_layers(branch)
        return list(norm.trainable_variables) + list(layer.trainable_variables)

    def _branch_layers(self, branch):
        if branch == 0:
            return self.mixer_norm, self.mixer
        return self.feedforward_norm, self.feedforward

    def apply_branch(self, branch, values, x, **kwargs):
        """`F(x)` (`branch` 0) or `G(x)` (`branch` 1) with the trainable variables replaced by
        `values` (stateless: the custom gradient of `ReversibleStack` differentiates with
        respect to them); `kwargs` go to the mixer or the feedforward."""
        norm, layer = self._branch_layers(branch)
        count = len(norm.trainable_variables)
        hidden, _ = norm.stateless_call(list(values[:count]), _values(norm.non_trainable_variables),
                                        x)
        # In the compute dtype whether or not a caller's autocast scope is active (the
        # backward pass of `ReversibleStack` runs outside the stack's call).
        hidden = ops.cast(hidden, layer.compute_dtype)
        outputs, _ = layer.stateless_call(list(values[count:]),
                                          _values(layer.non_trainable_variables), hidden, **kwargs)
        return ops.cast(outputs, x.dtype)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
        mixer_options=None,
        **kwargs,
    ):
        check_rank("inputs", inputs, 3, "[batch, length, 2 * dim]")
        named = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
            "cache": cache,
            "cache_index": cache_index,
        }
        named = {key: value for key, value in named.items() if value is not None}
        named.update(mixer_arguments(kwargs, mixer_options))
        results = {}

        def f(x2):
            results["mixer"] = self.mixer(self.mixer_norm(x2), training=training, **named)
            return split_results(results["mixer"], cache is not None)[0]

        def g(y1):
            ff_kwargs = {} if cache is not None else self.feedforward_kwargs(padding_mask)
            return self.feedforward(self.feedforward_norm(y1), training=training, **ff_kwargs)

        outputs = couple(inputs, f, g)
        _, new_cache, extras = split_results(results["mixer"], cache is not None)
        return join_results(outputs, new_cache, extras, cache is not None)

    def init_cache(self, batch_size, max_length, dtype=None):
        """The mixer's cache."""
        return self.mixer.init_cache(batch_size, max_length, dtype)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, cache=None, mixer_options=None, **kwargs):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        extra = mixer_arguments(kwargs, mixer_options)
        extras = None
        if extra:
            stream = keras.KerasTensor(tuple(inputs.shape[:-1]) + (inputs.shape[-1] // 2,),
                                       dtype=inputs.dtype)
            if cache is not None:
                extra["cache"] = cache
            extras = split_results(self.mixer.compute_output_spec(stream, **extra),
                                   cache is not None)[2]
        return join_results(outputs, new_specs(cache), extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "mixer": keras.saving.serialize_keras_object(self.mixer),
                "feedforward": keras.saving.serialize_keras_object(self.feedforward),
                "normalization": self.normalization,
                "epsilon": self.epsilon,
            }
        )
        return config


def _values(variables):
    """The current values of `variables` (inside an outer stateless scope, its values)."""
    return [variable.value for variable in variables]
