"""Perceiver resampler: learned latent queries cross-attend to a variable-length input (survey §5.7)."""

import keras
from keras import ops

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.feedforward.feed_forward import ACTIVATIONS
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.residual.residual import NORMALIZATIONS
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class PerceiverResampler(keras.layers.Layer):
    """Compresses `[B, m, d]` inputs to `r` vectors with learned latent queries (survey §5.7).

    Survey §5.7 (sequence compression): `r` learned hidden representations
    `U = {u_1 … u_r}` act as queries of a QKV attention whose keys and values are the inputs
    `X = {x_1 … x_m}`; the `r` outputs are a fixed-length input for downstream systems (e.g.
    image patch features compressed before a language model, §6.5). Each of the `num_layers`
    layers is pre-norm, with its own weights:

        `U ← U + MHA(LN_q(U), KV)`,   `KV = LN_x(X)`  (or `[LN_x(X); LN_q(U)]`)
        `U ← U + FFN(LN_f(U))`

    and the result is `LN_out(U)`. With `attend_to_latents=False` (default, the survey's and
    the Perceiver's form) the latents attend to the inputs only; `attend_to_latents=True` is
    Flamingo's variant, whose keys and values are the inputs followed by the (normalised)
    latents, so that each latent also sees the others. Padded inputs (`padding_mask` False)
    are never attended to; a fully padded input gives finite outputs (the attention term is
    zero, or covers only the latents with `attend_to_latents=True`).

    Args:
        num_latents: int `r`, the number of outputs.
        num_heads: int, attention heads (must divide the input width unless `head_dim` is set).
        intermediate_dim: int, hidden width of the feedforward.
        num_layers: int, cross-attention + feedforward layers.
        head_dim: optional int, width of each attention head.
        attend_to_latents: bool, keys and values are `[inputs; latents]` (Flamingo) instead of
            the inputs alone (Perceiver, survey §5.7).
        activation: feedforward activation (see `FeedForward`), default `"gelu"`.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"` (float32).
        dropout: float in [0, 1), on attention weights, feedforward hidden units and residual
            branches.
        epsilon: float, the normalisation epsilon.
        latent_initializer: initializer of the `[r, d]` latent table.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, m, d]`, `m` may vary between calls.
        padding_mask: optional boolean `[B, m]`, True for real inputs.
        training: bool.

    Returns:
        `[B, num_latents, d]`.

    Example:
    >>> resampler = PerceiverResampler(num_latents=4, num_heads=2, intermediate_dim=32)
    >>> latents = resampler(keras.random.normal((2, 10, 16)))  # (2, 4, 16)
    """

    def __init__(
        self,
        num_latents,
        num_heads,
        intermediate_dim,
        num_layers=1,
        head_dim=None,
        attend_to_latents=False,
        activation="gelu",
        normalization="layer_norm",
        dropout=0.0,
        epsilon=1e-5,
        latent_initializer="random_normal",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_latents = check_positive_int("num_latents", num_latents)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.intermediate_dim = check_positive_int("intermediate_dim", intermediate_dim)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.head_dim = None if head_dim is None else check_positive_int("head_dim", head_dim)
        check_bool("attend_to_latents", attend_to_latents)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}. Received: activation={activation!r}"
            )
        if normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}. Received: "
                f"normalization={normalization!r}"
            )
        check_rate("dropout", dropout)
        check_positive_number("epsilon", epsilon)
        self.attend_to_latents = attend_to_latents
        self.activation = activation
        self.normalization = normalization
        self.dropout = dropout
        self.epsilon = epsilon
        self.latent_initializer = get_initializer("latent_initializer", latent_initializer)

        def norm(name):
            return make_normalization(normalization, epsilon, self.dtype_policy, name)

        self.input_norms, self.latent_norms, self.attentions = [], [], []
        self.feedforward_norms, self.feedforwards = [], []
        for index in range(self.num_layers):
            self.input_norms.append(norm(f"input_norm_{index}"))
            self.latent_norms.append(norm(f"latent_norm_{index}"))
            self.attentions.append(
                MultiHeadAttention(
                    num_heads,
                    head_dim=head_dim,
                    dropout=dropout,
                    dtype=self.dtype_policy,
                    name=f"cross_attention_{index}",
                )
            )
            self.feedforward_norms.append(norm(f"feedforward_norm_{index}"))
            self.feedforwards.append(
                FeedForward(
                    intermediate_dim,
                    activation=activation,
                    dropout=dropout,
                    dtype=self.dtype_policy,
                    name=f"feedforward_{index}",
                )
            )
        self.output_norm = norm("output_norm")
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape, padding_mask_shape=None):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "PerceiverResampler expects inputs of rank 3 [batch, length, dim] with a known "
                f"dim. Received: inputs_shape={tuple(inputs_shape)}"
            )
        width = inputs_shape[-1]
        self.latents = self.add_weight(
            name="latents",
            shape=(self.num_latents, width),
            initializer=self.latent_initializer,
        )
        latent_shape = (inputs_shape[0], self.num_latents, width)
        kv_length = None
        if inputs_shape[1] is not None and self.attend_to_latents:
            kv_length = inputs_shape[1] + self.num_latents
        elif not self.attend_to_latents:
            kv_length = inputs_shape[1]
        kv_shape = (inputs_shape[0], kv_length, width)
        for index in range(self.num_layers):
            self.input_norms[index].build(inputs_shape)
            self.latent_norms[index].build(latent_shape)
            self.attentions[index].build(latent_shape, kv_shape)
            self.feedforward_norms[index].build(latent_shape)
            self.feedforwards[index].build(latent_shape)
        self.output_norm.build(latent_shape)

    def call(self, inputs, padding_mask=None, training=None):
        width = self.latents.shape[-1]
        if len(inputs.shape) != 3 or inputs.shape[-1] != width:
            raise ValueError(
                f"PerceiverResampler was built for inputs [batch, length, {width}]. "
                f"Received: inputs.shape={tuple(inputs.shape)}"
            )
        check_padding_mask(padding_mask, inputs)
        batch = ops.shape(inputs)[0]
        latents = ops.cast(self.latents, self.compute_dtype)
        latents = ops.broadcast_to(latents[None], (batch, self.num_latents, width))
        if padding_mask is not None:
            padding_mask = ops.cast(padding_mask, "bool")
            if self.attend_to_latents:
                padding_mask = ops.concatenate(
                    [padding_mask, ops.ones((batch, self.num_latents), dtype="bool")], axis=1
                )
        for index in range(self.num_layers):
            query = self.latent_norms[index](latents)
            context = self.input_norms[index](inputs)
            if self.attend_to_latents:
                context = ops.concatenate([context, ops.cast(query, context.dtype)], axis=1)
            attended = self.attentions[index](
                query, context, padding_mask=padding_mask, training=training
            )
            latents = latents + self.dropout_layer(attended, training=training)
            hidden = self.feedforwards[index](
                self.feedforward_norms[index](latents), training=training
            )
            latents = latents + self.dropout_layer(hidden, training=training)
        return self.output_norm(latents)

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return (inputs_shape[0], self.num_latents, inputs_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_latents": self.num_latents,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "num_layers": self.num_layers,
                "head_dim": self.head_dim,
                "attend_to_latents": self.attend_to_latents,
                "activation": self.activation,
                "normalization": self.normalization,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
                "latent_initializer": keras.initializers.serialize(self.latent_initializer),
            }
        )
        return config
