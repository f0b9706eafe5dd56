"""Residual connection: post-norm, pre-norm and the deep-model forms of survey §2.4, §4.2.1."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import first_positions
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.normalization.offset_rms_normalization import OffsetRMSNormalization
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_finite_number
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_output_length
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import check_rate

# "weighted": `LNorm(F(z) + β·z) + γ·z` (survey §4.2.1); "pre_and_post": the sandwich norm
# `z + LNorm(F(LNorm(z)))`; "rezero": `z + α·F(z)` without a norm.
NORM_PLACEMENTS = ("post", "pre", "weighted", "pre_and_post", "rezero")
# Placements whose identity path bypasses every norm: a stack of them ends with a final norm.
FINAL_NORM_PLACEMENTS = ("pre", "pre_and_post")
# "offset_rms_norm": RMSNorm with its scale stored as `1 + w` (`OffsetRMSNormalization`).
NORMALIZATIONS = ("layer_norm", "rms_norm", "offset_rms_norm")


def make_normalization(normalization, epsilon, dtype, name):
    """A Keras core `LayerNormalization` or `RMSNormalization` layer, or keras_xf's
    `OffsetRMSNormalization`."""
    if normalization == "layer_norm":
        return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
    if normalization == "offset_rms_norm":
        return OffsetRMSNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)


def validate_normalization(normalization, norm_placement, dropout, epsilon):
    if norm_placement not in NORM_PLACEMENTS:
        raise ValueError(
            f"norm_placement must be one of {NORM_PLACEMENTS}. Received: "
            f"norm_placement={norm_placement!r}"
        )
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"normalization must be one of {NORMALIZATIONS}. Received: "
            f"normalization={normalization!r}"
        )
    check_rate("dropout", dropout)
    # A zero, negative or non-finite epsilon turns the normalisation into NaN.
    check_positive_number("epsilon", epsilon)


def validate_residual_weights(norm_placement, inner_weight, outer_weight, learned_weights):
    """`β = inner_weight`, `γ = outer_weight` and `learned_weights` belong to the
    `"weighted"` placement; elsewhere they must keep their defaults (1, 0, False)."""
    check_finite_number("inner_weight", inner_weight)
    check_finite_number("outer_weight", outer_weight)
    check_bool("learned_weights", learned_weights)
    if norm_placement == "weighted":
        return
    given = {"inner_weight": (inner_weight, 1.0), "outer_weight": (outer_weight, 0.0),
             "learned_weights": (learned_weights, False)}
    for name, (value, default) in given.items():
        if value != default:
            raise ValueError(
                f"{name} is an argument of norm_placement='weighted' only. Received: "
                f"{name}={value!r} with norm_placement={norm_placement!r}"
            )


@keras.saving.register_keras_serializable(package="keras_xf")
class Residual(PassesMixerArguments, keras.layers.Layer):
    """Wraps a sub-layer `F` with a residual connection and a normalisation.

    Post-norm: `H_out = LNorm(F(H_in) + H_in)`; pre-norm: `H_out = F(LNorm(H_in)) + H_in`
    (survey §2.4). The deep-model forms of survey §4.2.1:

    - `"weighted"`: `z^l = LNorm(F(z^{l-1}) + β·z^{l-1}) + γ·z^{l-1}`, β = `inner_weight`,
      γ = `outer_weight`, fixed or learned (`learned_weights`). β = 1, γ = 0 is post-norm
      exactly; DeepNorm is β = α (its depth-derived constant), γ = 0 (`deep_norm(...)`
      gives the arguments). β = 0, γ = 1 is `LNorm(F(z)) + z`, which normalises `F`'s
      output rather than its input: pre-norm itself stays `"pre"`.
    - `"pre_and_post"` (the sandwich norm of CogView): `z^l = z^{l-1} +
      LNorm'(F(LNorm(z^{l-1})))`, a second norm (`output_norm`) on `F`'s output.
    - `"rezero"`: `z^l = z^{l-1} + α·F(z^{l-1})` with one learned scalar α initialised to 0
      and no norm (`normalization` and `epsilon` are then unused); the block starts as the
      identity.

    Dropout is applied to the branch (`F`'s output, after `LNorm'` for `"pre_and_post"`)
    before the addition. The generic call arguments below are passed to `F` when given; any
    other keyword argument (e.g. `attention_bias`, `return_attention_scores`, or one a new
    mixer adds) is passed to `F` unchanged, so a new sub-layer needs no change here.

    Args:
        layer: the sub-layer `F` (width-preserving), or its serialised config.
        norm_placement: `"post"` (survey default), `"pre"`, `"weighted"`, `"pre_and_post"`
            or `"rezero"`.
        normalization: `"layer_norm"`, `"rms_norm"` (Keras core layers) or
            `"offset_rms_norm"` (RMSNorm with scale `1 + w`, `OffsetRMSNormalization`); all
            computed in float32.
        dropout: float in [0, 1), residual dropout.
        epsilon: float, the normalisation epsilon.
        inner_weight: float β, the weight of the identity inside the norm (`"weighted"`).
        outer_weight: float γ, the weight of the identity outside the norm (`"weighted"`).
        learned_weights: bool; `True` makes β and γ trainable scalars initialised to
            `inner_weight` and `outer_weight` (`"weighted"`).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        context: optional second input of `F` (the encoder outputs of cross-attention).
        padding_mask, attention_mask, use_causal_mask, cache, cache_index: passed to `F` when
            not `None`.
        training: bool.
        mixer_options, **kwargs: passed to `F` when not `None` (`PassesMixerArguments`
            carries the Python values in `mixer_options`, the tensors in `kwargs`).
        output_length: optional int `n`: only the first `n` positions are computed, `F`
            taking their (normalised) states as its queries and all positions as its second
            input (keys and values; `F` must take one, as `MultiHeadAttention` does), so
            that the result equals the first `n` rows of the full one; `[B, n, d]`.

    Returns:
        As `F` under the block contract, with its outputs `y` replaced by the residual
        result: `[B, T, d]`, `(outputs, new_cache)`, or a dict whose `"outputs"` is replaced.

    Example:
    >>> block = Residual(FeedForward(64), norm_placement="pre")
    >>> y = block(keras.random.normal((2, 5, 16)))
    >>> deep = Residual(FeedForward(64), **deep_norm(decoder_layers=24)["decoder"].residual_arguments())
    """

    def __init__(
        self,
        layer,
        norm_placement="post",
        normalization="layer_norm",
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
        self.layer = as_layer(layer, "layer")
        self.norm_placement = norm_placement
        self.normalization = normalization
        self.dropout = dropout
        self.epsilon = epsilon
        self.inner_weight = inner_weight
        self.outer_weight = outer_weight
        self.learned_weights = learned_weights
        self.norm = None
        if norm_placement != "rezero":
            self.norm = make_normalization(normalization, epsilon, self.dtype_policy, "norm")
        self.output_norm = None
        if norm_placement == "pre_and_post":
            self.output_norm = make_normalization(
                normalization, epsilon, self.dtype_policy, "output_norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def _scalar(self, name, value):
        return self.add_weight(name=name, shape=(), dtype="float32",
                               initializer=keras.initializers.Constant(value))

    def build(self, inputs_shape, context_shape=None):
        # Scalars in float32 under any policy, as the norms' statistics.
        self.inner_scale = self.outer_scale = self.rezero_scale = None
        if self.learned_weights:
            self.inner_scale = self._scalar("inner_weight", self.inner_weight)
            self.outer_scale = self._scalar("outer_weight", self.outer_weight)
        if self.norm_placement == "rezero":
            self.rezero_scale = self._scalar("rezero_weight", 0.0)
        if self.norm is not None:
            self.norm.build(inputs_shape)
        if self.output_norm is not None:
            self.output_norm.build(inputs_shape)
        if not self.layer.built:
            if context_shape is None:
                self.layer.build(inputs_shape)
            else:
                # Cross-attention: the keys and values come from a context of its own width.
                self.layer.build(inputs_shape, context_shape)

    def call(
        self,
        inputs,
        context=None,
        padding_mask=None,
        attention_mask=None,
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
        normalizes_input = self.norm_placement in ("pre", "pre_and_post")
        hidden = self.norm(inputs) if normalizes_input else inputs
        args = () if context is None else (context,)
        if output_length is not None:
            # Queries and the residual path from the first positions; keys and values from all.
            args = args or (hidden,)
            hidden, inputs = hidden[:, :output_length], inputs[:, :output_length]
        named = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
            "cache": cache,
            "cache_index": cache_index,
        }
        named = {key: value for key, value in named.items() if value is not None}
        results = self.layer(
            hidden, *args, training=training, **named, **mixer_arguments(kwargs, mixer_options)
        )
        outputs, new_cache, extras = split_results(results, cache is not None)
        if self.output_norm is not None:
            outputs = self.output_norm(outputs)
        outputs = self._add_identity(self.dropout_layer(outputs, training=training), inputs)
        return join_results(outputs, new_cache, extras, cache is not None)

    def _weight(self, variable, value, like):
        """A residual weight in the dtype of `like`: the learned scalar, or the fixed float."""
        return value if variable is None else ops.cast(variable, like.dtype)

    def _add_identity(self, branch, inputs):
        """The branch (dropout already applied) joined with the identity path `z`."""
        placement = self.norm_placement
        if placement == "rezero":
            return inputs + self._weight(self.rezero_scale, 0.0, branch) * branch
        if placement == "weighted":
            beta = self._weight(self.inner_scale, self.inner_weight, inputs)
            gamma = self._weight(self.outer_scale, self.outer_weight, inputs)
            return self.norm(branch + beta * inputs) + gamma * inputs
        outputs = branch + inputs
        return self.norm(outputs) if placement == "post" else outputs

    def compute_output_shape(self, inputs_shape, context_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, context=None, cache=None, mixer_options=None,
                            output_length=None, **kwargs):
        outputs = keras.KerasTensor(first_positions(inputs.shape, output_length),
                                    dtype=self.compute_dtype)
        extra = mixer_arguments(kwargs, mixer_options)
        if not extra:
            return join_results(outputs, new_specs(cache), None, cache is not None)
        args = () if context is None else (context,)
        if cache is not None:
            extra["cache"] = cache
        layer_spec = self.layer.compute_output_spec(inputs, *args, **extra)
        _, new_cache, extras = split_results(layer_spec, cache is not None)
        return join_results(outputs, new_cache, extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.layer),
                "norm_placement": self.norm_placement,
                "normalization": self.normalization,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
                "inner_weight": self.inner_weight,
                "outer_weight": self.outer_weight,
                "learned_weights": self.learned_weights,
            }
        )
        return config
