"""Product-key memory: a large key-value memory read through sub-space top-k search
(survey §5.3.2; Lample et al. 2019)."""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class ProductKeyMemory(FeedForwardLayer):
    """Product-key memory `m(x) = Σ_{i ∈ I} Softmax(s_I)_i · v_i`, a position-wise layer.

    Survey §5.3.2 (sub-space models): the `d_k`-dimensional query `q(x) = x W_q + b_q` is cut
    into `η = 2` halves `q₁, q₂`; each is scored against `√N = num_keys` sub-keys of its own
    sub-space and the `top_k` best are kept per half. Their Cartesian product gives `top_k²`
    product keys `(c_a, c′_b)` with scores `q₁·c_a + q₂·c′_b`, of which the `top_k` best form
    `I` (this is exactly the top-`k` of all `N = num_keys²` product keys, found without
    scoring them all). Key `(a, b)` reads row `a·num_keys + b` of the value table
    `V ∈ ℝ^{N×d_v}` (an `Embedding`); the output is the softmax-weighted (float32) sum of the
    `top_k` selected values. With `num_heads > 1`, each head has its own query projection and
    sub-keys and reads the shared values; the heads' outputs are summed.

    The layer maps `[..., d]` to `[..., output_dim]` (default `d`), so it serves as the
    feedforward of a `TransformerBlock` (`TransformerBlock(mixer, ProductKeyMemory(...))`),
    as in Lample et al., who replace some FFN layers with memories.

    Lample et al. batch-normalise the queries to spread the key usage; `query_batch_norm=True`
    adds a `BatchNormalization` over `q(x)` (its statistics include padding positions, which a
    position-wise layer cannot tell apart). The default leaves it out.

    Args:
        num_keys: int `√N`, sub-keys per half; the memory holds `num_keys²` values.
        top_k: int `k ≤ num_keys`, keys read per query (and per half).
        num_heads: int, memory heads.
        key_dim: even int `d_k`, query width per head; defaults to the input width rounded
            down to an even number.
        output_dim: int `d_v`, value width; defaults to the input width.
        query_batch_norm: bool, batch-normalise the queries.
        use_bias: bool, a bias in the query projection.
        kernel_initializer: initializer of the query projection.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[..., d]`.
        training: bool (batch-norm statistics).

    Returns:
        `[..., output_dim]`.

    Example:
    >>> memory = ProductKeyMemory(num_keys=16, top_k=4, num_heads=2)  # 256 values
    >>> y = memory(keras.random.normal((2, 5, 32)))  # (2, 5, 32)
    """

    def __init__(
        self,
        num_keys,
        top_k=8,
        num_heads=1,
        key_dim=None,
        output_dim=None,
        query_batch_norm=False,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_keys", num_keys)
        check_positive_int("top_k", top_k)
        check_positive_int("num_heads", num_heads)
        if top_k > num_keys:
            raise ValueError(
                f"top_k must be at most num_keys. Received: top_k={top_k}, num_keys={num_keys}"
            )
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
            if key_dim % 2:
                raise ValueError(
                    f"key_dim must be even (it is split into two halves). Received: key_dim={key_dim}"
                )
        if output_dim is not None:
            check_positive_int("output_dim", output_dim)
        self.num_keys = num_keys
        self.top_k = top_k
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.output_dim = output_dim
        self.query_batch_norm = query_batch_norm
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(
                f"ProductKeyMemory needs a known last dimension. Received: inputs_shape={inputs_shape}"
            )
        if self.key_dim is None:
            if width < 2:
                raise ValueError(
                    f"ProductKeyMemory needs key_dim for inputs of width {width}. Received: "
                    f"inputs_shape={tuple(inputs_shape)}"
                )
            self.key_dim = width - width % 2
        value_dim = self.output_dim or width
        half = self.key_dim // 2
        self.query_dense = keras.layers.Dense(
            self.num_heads * self.key_dim,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            dtype=self.dtype_policy,
            name="query",
        )
        self.query_dense.build(inputs_shape)
        query_shape = tuple(inputs_shape[:-1]) + (self.num_heads * self.key_dim,)
        self.query_norm = None
        if self.query_batch_norm:
            self.query_norm = keras.layers.BatchNormalization(
                dtype=self.dtype_policy, name="query_norm"
            )
            self.query_norm.build(query_shape)
        bound = half**-0.5  # Lample et al.: U(-1/√(d_k/2), 1/√(d_k/2)) sub-keys
        self.sub_keys = self.add_weight(
            shape=(self.num_heads, 2, self.num_keys, half),
            initializer=keras.initializers.RandomUniform(-bound, bound),
            name="sub_keys",
        )
        self.values = keras.layers.Embedding(
            self.num_keys**2,
            value_dim,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=value_dim**-0.5),
            dtype=self.dtype_policy,
            name="values",
        )
        self.values.build((None,))

    def call(self, inputs, training=None):
        check_width(inputs, self.query_dense.kernel.shape[0])
        heads, half, k, n = self.num_heads, self.key_dim // 2, self.top_k, self.num_keys
        queries = self.query_dense(inputs)
        if self.query_norm is not None:
            queries = self.query_norm(queries, training=training)
        lead = ops.shape(queries)[:-1]
        queries = ops.reshape(ops.cast(queries, "float32"), tuple(lead) + (heads, 2, half))
        sub_keys = ops.cast(self.sub_keys, "float32")
        # Per half: scores against the num_keys sub-keys, and the top_k of each.
        half_scores = ops.einsum("...hik,hink->...hin", queries, sub_keys)
        best_scores, best_index = ops.top_k(half_scores, k)  # [..., H, 2, k]
        # The k × k Cartesian candidates, scored as sums, then the top_k overall.
        candidate_scores = best_scores[..., 0, :, None] + best_scores[..., 1, None, :]
        candidate_index = best_index[..., 0, :, None] * n + best_index[..., 1, None, :]
        flat_shape = tuple(lead) + (heads, k * k)
        scores, position = ops.top_k(ops.reshape(candidate_scores, flat_shape), k)
        index = ops.take_along_axis(ops.reshape(candidate_index, flat_shape), position, axis=-1)
        weights = ops.softmax(scores, axis=-1)  # float32, [..., H, k]
        values = self.values(index)  # [..., H, k, d_v]
        weights = ops.cast(weights, values.dtype)
        return ops.einsum("...hk,...hkd->...d", weights, values)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_keys": self.num_keys,
                "top_k": self.top_k,
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "output_dim": self.output_dim,
                "query_batch_norm": self.query_batch_norm,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
