"""Global tokens attention field (survey §5.1, hybrid methods as in BigBird)."""

import keras
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.ops.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_xf")
class GlobalPattern(AttentionPattern):
    """Global tokens: `π_i = {1 … n}` for a global `i`, and `π_i = G` otherwise.

    Survey §5.1 (hybrid methods, global attention): a few positions `G` (typically special
    tokens at the start of the sequence) attend to every position, and every position
    attends to them: `(i, j)` is allowed when `i ∈ G` or `j ∈ G`. Combined with other fields
    by `HybridPattern`; with the causal mask a global query still only sees keys before it.

    The field depends on positions only, so cached decoding equals the full causal pass.

    Args:
        global_positions: list of non-negative ints, the global positions `G`.
        num_global: positive int `g`, shorthand for `global_positions=range(g)`. Give exactly
            one of the two.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query_positions: int32 `[T]`; key_positions: int32 `[S]`.

    Returns:
        Boolean `[T, S]`.

    Example:
    >>> pattern = GlobalPattern(num_global=1)
    >>> y = MultiHeadAttention(num_heads=2, pattern=pattern)(keras.random.normal((2, 8, 16)))
    """

    uses_states = False
    supports_decoding = True

    def __init__(self, global_positions=None, num_global=None, **kwargs):
        super().__init__(**kwargs)
        if (global_positions is None) == (num_global is None):
            raise ValueError(
                "Give exactly one of global_positions and num_global. Received: "
                f"global_positions={global_positions}, num_global={num_global}"
            )
        if num_global is not None:
            check_positive_int("num_global", num_global)
        else:
            if (
                not isinstance(global_positions, (list, tuple))
                or not global_positions
                or any(
                    isinstance(p, bool) or not isinstance(p, int) or p < 0
                    for p in global_positions
                )
            ):
                raise ValueError(
                    "global_positions must be a non-empty list of non-negative ints. "
                    f"Received: global_positions={global_positions}"
                )
            global_positions = sorted(set(int(p) for p in global_positions))
        self.global_positions = global_positions
        self.num_global = num_global

    def _is_global(self, positions):
        positions = ops.cast(positions, "int32")
        if self.num_global is not None:
            return positions < self.num_global
        table = ops.convert_to_tensor(self.global_positions, dtype="int32")
        return ops.any(ops.equal(positions[:, None], table[None, :]), axis=-1)

    def call(self, query_positions, key_positions, query=None, key=None):
        return ops.logical_or(
            self._is_global(query_positions)[:, None], self._is_global(key_positions)[None, :]
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "global_positions": None
                if self.global_positions is None
                else list(self.global_positions),
                "num_global": self.num_global,
            }
        )
        return config
