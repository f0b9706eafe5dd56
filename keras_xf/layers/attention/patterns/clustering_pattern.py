"""Attention field by clustering queries and keys (survey §5.1, Routing Transformer)."""

import keras
import numpy as np
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_seed
from keras_xf.layers.attention.patterns._validation import draw_seed
from keras_xf.layers.attention.patterns._validation import key_heads_like_query


@keras.saving.register_keras_serializable(package="keras_xf")
class ClusteringPattern(AttentionPattern):
    """Learned field by clustering: `π_i = {j : c(q_i) = c(k_j)}`, `c(x) = argmax_c x̂·μ̂_c`.

    Survey §5.1 (learning attention fields): queries and keys are grouped by k-means, the
    centroids being extra parameters of the attention model, and each query attends only
    to the keys of its own cluster (Routing Transformer). Here each head has `C` centroids
    `μ_c`; a unit-normalised query or key `x̂` goes to the centroid of largest cosine.

    The assignment is an argmax, through which no gradient flows, so the centroids are not
    trained by the loss: as in the Routing Transformer they follow an online k-means, an
    exponential moving average of the normalised queries and keys assigned to them,
    `μ_c ← λ μ_c + (1 − λ) mean{x̂ : c(x) = c}`, applied with `assign` on a non-trainable
    weight `[H, C, Dh]` during training only (clusters with no member keep their centroid).
    The average runs over every query and key of the batch, padding included (the pattern
    does not see the padding mask). The centroids start as unit vectors drawn from `seed`.

    The field of a pair depends on that query and key only, so cached decoding equals the
    full pass (`supports_decoding = True`).

    Args:
        num_clusters: int `C ≥ 2`.
        decay: float `λ` in [0, 1), the moving-average decay.
        seed: int or `None`, the seed of the initial centroids.
        epsilon: small float guarding the normalisation of zero vectors.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.
        query: `[B, T, H, Dh]`, the projected queries; key: `[B, S, Hkv, Dh]`.
        training: bool, update the centroids.

    Returns:
        Boolean `[B, H, T, S]`.

    Example:
    >>> pattern = ClusteringPattern(num_clusters=2, seed=0)
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    uses_states = True
    supports_decoding = True

    def __init__(self, num_clusters, decay=0.99, seed=None, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_clusters", num_clusters, minimum=2)
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay < 1:
            raise ValueError(f"decay must be a float in [0, 1). Received: decay={decay}")
        if not isinstance(epsilon, (int, float)) or epsilon <= 0:
            raise ValueError(f"epsilon must be a positive float. Received: epsilon={epsilon}")
        seed = check_seed(seed)
        self.num_clusters = num_clusters
        self.decay = float(decay)
        self.seed = seed
        self.epsilon = float(epsilon)

    def build(self, input_shape=None):
        if input_shape is None or len(input_shape) != 4 or None in tuple(input_shape)[2:]:
            raise ValueError(
                "ClusteringPattern is built with the attention's head shape [B, T, H, Dh] "
                f"(MultiHeadAttention does this). Received: input_shape={input_shape}"
            )
        rng = np.random.default_rng(draw_seed(self.seed))
        shape = (input_shape[2], self.num_clusters, input_shape[3])
        centroids = rng.standard_normal(shape)
        centroids /= np.linalg.norm(centroids, axis=-1, keepdims=True)
        centroids = centroids.astype("float32")
        self.centroids = self.add_weight(
            name="centroids",
            shape=shape,
            dtype="float32",
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(centroids, "float32"),
            trainable=False,
            autocast=False,
        )
        self.built = True

    def _normalize(self, x):
        return x / ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + self.epsilon**2)

    def _assign(self, states, centroids):
        """Cluster ids `[B, L, H]` of unit-normalised states `[B, L, H, Dh]`."""
        return ops.argmax(ops.einsum("blhd,hcd->blhc", states, centroids), axis=-1)

    def call(self, query_positions, key_positions, query=None, key=None, training=None):
        if query is None or key is None:
            raise ValueError(
                "ClusteringPattern needs the projected query and key. Received: "
                f"query={'None' if query is None else 'a tensor'}, "
                f"key={'None' if key is None else 'a tensor'}"
            )
        centroids = ops.cast(self.centroids, "float32")
        unit_centroids = self._normalize(centroids)
        queries = self._normalize(ops.stop_gradient(ops.cast(query, "float32")))
        keys = key_heads_like_query(query, key)
        keys = self._normalize(ops.stop_gradient(ops.cast(keys, "float32")))
        query_clusters = self._assign(queries, unit_centroids)
        key_clusters = self._assign(keys, unit_centroids)
        if training:
            self._update_centroids(centroids, (queries, keys), (query_clusters, key_clusters))
        query_clusters = ops.transpose(query_clusters, (0, 2, 1))  # [B, H, T]
        key_clusters = ops.transpose(key_clusters, (0, 2, 1))  # [B, H, S]
        return ops.equal(query_clusters[..., :, None], key_clusters[..., None, :])

    def _update_centroids(self, centroids, states, clusters):
        sums = ops.zeros_like(centroids)
        counts = ops.zeros(ops.shape(centroids)[:2], "float32")
        for x, ids in zip(states, clusters):
            one_hot = ops.one_hot(ids, self.num_clusters, dtype="float32")  # [B, L, H, C]
            sums = sums + ops.einsum("blhc,blhd->hcd", one_hot, x)
            counts = counts + ops.sum(one_hot, axis=(0, 1))
        means = sums / ops.maximum(counts, 1.0)[..., None]
        moved = self.decay * centroids + (1.0 - self.decay) * means
        self.centroids.assign(ops.where((counts > 0)[..., None], moved, centroids))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_clusters": self.num_clusters,
                "decay": self.decay,
                "seed": self.seed,
                "epsilon": self.epsilon,
            }
        )
        return config
