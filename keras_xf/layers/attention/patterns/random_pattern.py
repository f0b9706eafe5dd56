"""Fixed random attention field (survey §5.1, hybrid methods: BigBird's random attention)."""

import keras
import numpy as np
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_seed
from keras_xf.layers.attention.patterns._validation import draw_seed


def draw_random_field(num_random, max_length, seed, causal=False):
    """`[max_length, num_random]` int32 key indices: row `i` holds `r` distinct keys drawn
    uniformly from `{0 … L−1}` (or `{0 … i}` when causal); `-1` fills rows with fewer keys."""
    rng = np.random.default_rng(seed)
    table = np.full((max_length, num_random), -1, dtype="int32")
    for i in range(max_length):
        candidates = i + 1 if causal else max_length
        count = min(num_random, candidates)
        table[i, :count] = rng.choice(candidates, size=count, replace=False)
    return table


@keras.saving.register_keras_serializable(package="keras_xf")
class RandomPattern(AttentionPattern):
    """Random attention: `π_i = R_i`, `r` keys drawn at random once for each position `i`.

    Survey §5.1 (hybrid methods): in BigBird each query also attends to a random set of
    positions. The sets `R_i ⊂ {0 … L−1}`, `|R_i| = r`, are drawn once, when the layer is
    built, from `seed` (a fresh seed when `None`), and kept as a non-trainable int32 weight
    `[max_length, num_random]`, so a saved model reloads exactly the same field. With
    `causal=True` the keys are drawn among `j ≤ i`, so none is wasted under the causal mask.
    Queries at positions `≥ max_length` get no random keys.

    The field depends on positions only, so cached decoding equals the full causal pass.

    Args:
        num_random: positive int `r`, random keys per query.
        max_length: positive int `L`, the longest sequence (positions `0 … L−1`).
        seed: int or `None`, the seed of the draw.
        causal: bool, draw the keys of query `i` among `0 … i`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.

    Returns:
        Boolean `[T, S]`.

    Example:
    >>> pattern = RandomPattern(num_random=2, max_length=16, seed=1)
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    uses_states = False
    supports_decoding = True

    def __init__(self, num_random, max_length, seed=None, causal=False, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("num_random", num_random)
        check_positive_int("max_length", max_length)
        seed = check_seed(seed)
        self.num_random = num_random
        self.max_length = max_length
        self.seed = seed
        self.causal = bool(causal)

    def build(self, input_shape=None):
        table = draw_random_field(
            self.num_random, self.max_length, draw_seed(self.seed), self.causal
        )
        self.random_keys = self.add_weight(
            name="random_keys",
            shape=table.shape,
            dtype="int32",
            initializer=lambda shape, dtype=None: ops.convert_to_tensor(table, "int32"),
            trainable=False,
        )
        self.built = True

    def call(self, query_positions, key_positions, query=None, key=None):
        query_positions = ops.cast(query_positions, "int32")
        key_positions = ops.cast(key_positions, "int32")
        rows = ops.take(
            ops.convert_to_tensor(self.random_keys),
            ops.clip(query_positions, 0, self.max_length - 1),
            axis=0,
        )  # [T, r]
        hits = ops.any(ops.equal(rows[:, :, None], key_positions[None, None, :]), axis=1)
        return ops.logical_and(hits, (query_positions < self.max_length)[:, None])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_random": self.num_random,
                "max_length": self.max_length,
                "seed": self.seed,
                "causal": self.causal,
            }
        )
        return config
