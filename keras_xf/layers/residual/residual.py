"""Residual connection with post-norm or pre-norm placement (survey §2.4)."""

import keras

from keras_xf.layers.cloning import clone_layer

NORM_PLACEMENTS = ("post", "pre")
NORMALIZATIONS = ("layer_norm", "rms_norm")


def make_normalization(normalization, epsilon, dtype, name):
    """A Keras core `LayerNormalization` or `RMSNormalization` layer."""
    if normalization == "layer_norm":
        return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
    return keras.layers.RMSNormalization(epsilon=epsilon, dtype=dtype, name=name)


def validate_normalization(normalization, norm_placement, dropout):
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
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")


@keras.saving.register_keras_serializable(package="keras_xf")
class Residual(keras.layers.Layer):
    """Wraps a sub-layer `F` with a residual connection and a normalisation.

    Post-norm: `H_out = LNorm(F(H_in) + H_in)`; pre-norm: `H_out = F(LNorm(H_in)) + H_in`
    (survey §2.4). Dropout is applied to `F`'s output before the addition. Extra call
    arguments are passed to `F`; if `F` returns a tuple (outputs, cache, …) the residual
    applies to the first element and the rest is passed through.

    Args:
        layer: the sub-layer `F` (width-preserving).
        norm_placement: `"post"` (survey default) or `"pre"`.
        normalization: `"layer_norm"` or `"rms_norm"` (Keras core layers; computed in float32).
        dropout: float in [0, 1), residual dropout.
        epsilon: float, the normalisation epsilon.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        context: optional second input of `F` (the encoder outputs of cross-attention).
        padding_mask, attention_mask, use_causal_mask, cache, cache_index, attention_bias,
            attention_multiplier, attention_weights, return_attention_scores: passed to `F`
            when given.
        training: bool.

    Returns:
        `[B, T, d]`, or a tuple whose first element is that when `F` returns a tuple.

    Example:
    >>> block = Residual(FeedForward(64), norm_placement="pre")
    >>> y = block(keras.random.normal((2, 5, 16)))
    """

    def __init__(
        self,
        layer,
        norm_placement="post",
        normalization="layer_norm",
        dropout=0.0,
        epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_normalization(normalization, norm_placement, dropout)
        if not isinstance(layer, keras.layers.Layer):
            layer = clone_layer(layer)
        self.layer = layer
        self.norm_placement = norm_placement
        self.normalization = normalization
        self.dropout = dropout
        self.epsilon = epsilon
        self.norm = make_normalization(normalization, epsilon, self.dtype_policy, "norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape, context_shape=None):
        self.norm.build(inputs_shape)
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
        attention_bias=None,
        attention_multiplier=None,
        attention_weights=None,
        return_attention_scores=None,
        training=None,
    ):
        hidden = self.norm(inputs) if self.norm_placement == "pre" else inputs
        args = () if context is None else (context,)
        kwargs = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
            "cache": cache,
            "cache_index": cache_index,
            "attention_bias": attention_bias,
            "attention_multiplier": attention_multiplier,
            "attention_weights": attention_weights,
            "return_attention_scores": return_attention_scores or None,
        }
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        outputs = self.layer(hidden, *args, training=training, **kwargs)
        rest = ()
        if isinstance(outputs, (tuple, list)):
            outputs, rest = outputs[0], tuple(outputs[1:])
        outputs = self.dropout_layer(outputs, training=training) + inputs
        if self.norm_placement == "post":
            outputs = self.norm(outputs)
        return (outputs,) + rest if rest else outputs

    def compute_output_shape(self, inputs_shape, context_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, context=None, cache=None, **kwargs):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if kwargs.get("return_attention_scores"):
            args = () if context is None else (context,)
            return (outputs,) + tuple(
                self.layer.compute_output_spec(inputs, *args, cache=cache, **kwargs)[1:]
            )
        if cache is None:
            return outputs
        return outputs, keras.KerasTensor(cache.shape, dtype=cache.dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.layer),
                "norm_placement": self.norm_placement,
                "normalization": self.normalization,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
            }
        )
        return config
