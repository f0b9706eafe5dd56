"""Position-wise feed-forward network with ReLU, GELU, SiLU and gated (GLU) variants (survey §2.5)."""

import keras

from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.layers.lora.lora_dense import LoRADense
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
# The gated activations and the function applied to their gate projection.
GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def apply_activation(activation, inputs):
    """The elementwise function of `activation` (of its gate for a gated one): ReLU, exact
    GELU `x Φ(x)`, its tanh approximation `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`, SiLU."""
    name = GATED.get(activation, activation)
    if name == "gelu_tanh":
        return keras.activations.gelu(inputs, approximate=True)
    if name == "gelu":
        return keras.activations.gelu(inputs, approximate=False)
    return getattr(keras.activations, name)(inputs)


def _clone_initializer(initializer):
    return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="keras_xf")
class FeedForward(FeedForwardLayer):
    """`FFN(H) = σ(H W_h + b_h) W_f + b_f` (survey §2.5), or its gated form.

    With `activation="swiglu"`, `"geglu"` or `"geglu_tanh"` the hidden layer is the gated
    linear unit `σ(H W_g + b_g) ⊙ (H W_h + b_h)` with `σ` = SiLU, exact GELU or the tanh
    approximation of GELU, which adds a third matrix.

    Args:
        hidden_dim: int, `d_ffn` (commonly `4d`).
        activation: one of `"relu"` (default, as in the survey), `"gelu"` (exact, with erf,
            as BERT and ViT), `"gelu_tanh"` (the tanh approximation of GPT-2), `"silu"`,
            `"swiglu"` (SiLU gate: Llama, Mistral), `"geglu"` (exact GELU gate) or
            `"geglu_tanh"` (tanh-approximated GELU gate: T5 1.1, Gemma).
        use_bias: bool, biases in the projections.
        dropout: float in [0, 1), dropout on the hidden layer.
        output_dim: int, output width; defaults to the input width.
        kernel_initializer, bias_initializer: initializers.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[..., d]`.
        training: bool.

    Returns:
        `[..., output_dim]`.

    Example:
    >>> ffn = FeedForward(hidden_dim=64, activation="swiglu")
    >>> y = ffn(keras.random.normal((2, 5, 16)))  # (2, 5, 16)
    """

    def __init__(
        self,
        hidden_dim,
        activation="relu",
        use_bias=True,
        dropout=0.0,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}. Received: activation={activation!r}"
            )
        check_rate("dropout", dropout)
        if output_dim is not None:
            output_dim = check_positive_int("output_dim", output_dim)
        self.hidden_dim = hidden_dim
        self.activation = activation
        self.use_bias = use_bias
        self.dropout = dropout
        self.output_dim = output_dim
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def _dense(self, units, name):
        # A fresh initializer per projection: an unseeded Keras initializer instance draws its
        # seed once, so sharing it would give the gate and hidden kernels identical values.
        # `LoRADense`: LoRA adapters survive a `.keras` save.
        return LoRADense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=_clone_initializer(self.kernel_initializer),
            bias_initializer=_clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(
                f"FeedForward needs a known last dimension. Received: inputs_shape={inputs_shape}"
            )
        self.hidden_dense = self._dense(self.hidden_dim, "hidden")
        self.hidden_dense.build(inputs_shape)
        self.gate_dense = None
        if self.activation in GATED:
            self.gate_dense = self._dense(self.hidden_dim, "gate")
            self.gate_dense.build(inputs_shape)
        self.output_dense = self._dense(self.output_dim or width, "output")
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.hidden_dim,))

    def call(self, inputs, training=None):
        check_width(inputs, self.hidden_dense.kernel.shape[0])
        hidden = self.hidden_dense(inputs)
        if self.gate_dense is not None:
            hidden = apply_activation(self.activation, self.gate_dense(inputs)) * hidden
        else:
            hidden = apply_activation(self.activation, hidden)
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_dense(hidden)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "activation": self.activation,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
