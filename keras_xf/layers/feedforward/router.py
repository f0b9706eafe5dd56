"""Top-k gating network of a mixture of experts (survey §4.4, §5.6)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer

ORDERS = ("softmax_then_topk", "topk_then_softmax")


@keras.saving.register_keras_serializable(package="keras_xf")
class Router(keras.layers.Layer):
    """Top-k routing `g(h) = Softmax(h · W_g)` over `M` experts (survey §4.4, §5.6).

    Two orders of §4.4: `"softmax_then_topk"` computes `g = Softmax(h · W_g)` over all `M`
    experts and keeps the `k` largest entries `π` (optionally renormalised to sum to one);
    `"topk_then_softmax"` selects the `k` largest logits of `h · W_g` and applies the softmax
    to those `k` only. With `noise_std > 0`, Gaussian noise of that standard deviation is
    added to the logits during training (noisy gating). The logits, softmax and gates are
    computed in float32 whatever the layer's dtype policy: `W_g` is the kernel of a float32
    `Dense` sub-layer `gate`, which `model.quantize` may quantise (its int8 or int4 matmul
    still returns float32 logits).

    Args:
        num_experts: int, `M`.
        top_k: int in `[1, M]`, `k`.
        order: `"softmax_then_topk"` (default) or `"topk_then_softmax"`.
        normalize_top_k: bool, renormalise the `k` kept probabilities to sum to one
            (`"softmax_then_topk"` only; the other order always sums to one).
        noise_std: float >= 0, standard deviation of the logit noise in training.
        use_bias: bool, a bias in the gating projection.
        kernel_initializer: initializer of `W_g [d, M]`.
        seed: int, seed of the gating noise.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[..., d]`.
        training: bool (noise is added only in training).

    Returns:
        A tuple `(expert_index, gates, probabilities, logits)`: int32 `[..., k]` expert ids
        (best first), float32 `[..., k]` gate values `g_i, i ∈ π`, float32 `[..., M]`
        `Softmax(h · W_g)` over all experts and the float32 `[..., M]` logits (used by the
        load-balancing and z losses).

    Example:
    >>> router = Router(num_experts=4, top_k=2)
    >>> index, gates, probs, logits = router(keras.random.normal((2, 5, 16)))
    """

    def __init__(
        self,
        num_experts,
        top_k=1,
        order="softmax_then_topk",
        normalize_top_k=True,
        noise_std=0.0,
        use_bias=False,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_routing(num_experts, top_k, order, noise_std)
        self.num_experts = num_experts
        self.top_k = top_k
        self.order = order
        self.normalize_top_k = bool(normalize_top_k)
        self.noise_std = float(noise_std)
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.noise_std > 0 else None

    # Sub-layers kept float32 whatever the layer's policy.
    float32_sublayers = ("gate",)

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(
                f"Router needs a known last dimension. Received: inputs_shape={inputs_shape}"
            )
        self.input_dim = width
        # The gate is float32 whatever the layer's policy (routing decisions are sensitive to
        # rounding); a `Dense`, so `model.quantize` reaches it and its logits stay float32.
        self.gate = keras.layers.Dense(
            self.num_experts, use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer, dtype="float32",
            name="gate",
        )
        self.gate.build((None, width))

    @property
    def kernel(self):
        """The gate's kernel `W_g [d, M]`."""
        return self.gate.kernel

    @property
    def bias(self):
        return self.gate.bias

    def call(self, inputs, training=None):
        check_width(inputs, self.input_dim)
        logits = ops.cast(self.gate(ops.cast(inputs, "float32")), "float32")
        if training and self.noise_std > 0:
            noise = keras.random.normal(
                ops.shape(logits), stddev=self.noise_std, dtype="float32",
                seed=self.seed_generator,
            )
            logits = logits + noise
        probabilities = ops.softmax(logits, axis=-1)
        if self.order == "softmax_then_topk":
            gates, expert_index = ops.top_k(probabilities, self.top_k)
            if self.normalize_top_k:
                gates = gates / ops.maximum(ops.sum(gates, axis=-1, keepdims=True), 1e-9)
        else:
            top_logits, expert_index = ops.top_k(logits, self.top_k)
            gates = ops.softmax(top_logits, axis=-1)
        return ops.cast(expert_index, "int32"), gates, probabilities, logits

    def compute_output_shape(self, inputs_shape):
        lead = tuple(inputs_shape[:-1])
        return (lead + (self.top_k,), lead + (self.top_k,), lead + (self.num_experts,),
                lead + (self.num_experts,))

    def compute_output_spec(self, inputs, training=None):
        shapes = self.compute_output_shape(inputs.shape)
        dtypes = ("int32", "float32", "float32", "float32")
        return tuple(keras.KerasTensor(s, dtype=t) for s, t in zip(shapes, dtypes))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "top_k": self.top_k,
                "order": self.order,
                "normalize_top_k": self.normalize_top_k,
                "noise_std": self.noise_std,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
            }
        )
        return config


def validate_routing(num_experts, top_k, order, noise_std, order_name="order"):
    """Raises `ValueError` for a bad routing configuration."""
    check_positive_int("num_experts", num_experts)
    check_positive_int("top_k", top_k)
    if top_k > num_experts:
        raise ValueError(
            f"top_k must not exceed num_experts. Received: top_k={top_k}, "
            f"num_experts={num_experts}"
        )
    if order not in ORDERS:
        raise ValueError(
            f"{order_name} must be one of {ORDERS}. Received: {order_name}={order!r}")
    check_positive_number("noise_std", noise_std, allow_zero=True)
