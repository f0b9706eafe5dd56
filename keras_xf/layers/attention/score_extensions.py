"""Private score-pipeline extensions of `MultiHeadAttention` (survey §3.2-3.3, §5.3.2, §5.4).

- Syntax matrices `M` given at call time: `Softmax(QKᵀ/√d + M)` (additive) and
  `Softmax(QKᵀ/√d ⊙ M)` (multiplicative), optionally for a subset of heads only (§3.2, §3.3).
- Low-dimensional queries and keys (`qk_dim = d′`, §5.3.2) and the cache layout they need.
- Attention weights given from outside (attention-map sharing across layers, §5.4).
"""

import keras
import numpy as np
from keras import ops

from keras_xf.ops.attention import attend

# Additive syntax matrices may hold −inf ("never attend"); they are clipped to this value so
# that a row of −inf entries cannot turn the softmax into NaN.
_BIAS_FLOOR = -1e9


def _static(dim):
    return dim if isinstance(dim, int) else None


class ScoreExtensionsMixin:
    """Mixed into `MultiHeadAttention`; all methods are private to it."""

    def _init_score_extensions(self, guided_heads, qk_dim):
        if guided_heads is not None:
            if isinstance(guided_heads, int) or not hasattr(guided_heads, "__iter__"):
                raise ValueError(
                    "guided_heads must be a list of head indices or None. Received: "
                    f"guided_heads={guided_heads}"
                )
            guided_heads = list(guided_heads)
            bad = [
                h
                for h in guided_heads
                if isinstance(h, bool) or not isinstance(h, (int, np.integer))
                or not 0 <= h < self.num_heads
            ]
            if bad or not guided_heads or len(set(guided_heads)) != len(guided_heads):
                raise ValueError(
                    f"guided_heads must be distinct indices in [0, num_heads={self.num_heads}). "
                    f"Received: guided_heads={guided_heads}"
                )
            guided_heads = sorted(int(h) for h in guided_heads)
        if qk_dim is not None and (
            isinstance(qk_dim, bool) or not isinstance(qk_dim, int) or qk_dim <= 0
        ):
            raise ValueError(f"qk_dim must be a positive int. Received: qk_dim={qk_dim}")
        if (
            qk_dim is not None
            and qk_dim % 2
            and self.position is not None
            and self.position.rotates_pairs
        ):
            raise ValueError(
                "qk_dim must be even with a rotary position (RoPE rotates pairs of features). "
                f"Received: qk_dim={qk_dim}"
            )
        self.guided_heads = guided_heads
        self.qk_dim = qk_dim

    # Low-dimensional queries and keys (§5.3.2) -------------------------------------------

    def _cache_width(self):
        """Keys and values share one cache tensor; both are zero-padded to the wider one."""
        return self.head_dim if self.qk_dim is None else max(self.qk_dim, self.head_dim)

    def _needs_explicit_path(self, syntax_multiplier):
        # The fused kernels of some backends (JAX) need values as wide as queries and keys.
        return syntax_multiplier is not None or (
            self.qk_dim is not None and self.qk_dim != self.head_dim
        )

    def _pad_to_cache(self, tensor):
        missing = self._cache_width() - tensor.shape[-1]
        if missing == 0:
            return tensor
        return ops.pad(tensor, [[0, 0], [0, 0], [0, 0], [0, missing]])

    def _cache_entry(self, key, value):
        """`[B, 2, S, Hkv, width]`: keys and values stacked, each zero-padded to the width."""
        value = ops.cast(value, key.dtype)
        return ops.stack([self._pad_to_cache(key), self._pad_to_cache(value)], axis=1)

    def _read_cache(self, cache):
        key, value = cache[:, 0], cache[:, 1]
        if self.qk_dim is None or self.qk_dim == self.head_dim:
            return key, value
        return key[..., : self.qk_dim], value[..., : self.head_dim]

    # Syntax matrices M (§3.2, §3.3) -------------------------------------------------------

    def _check_syntax_matrix(self, name, matrix, query_length, key_length):
        shape = tuple(matrix.shape)
        expected = {2: query_length, 3: key_length}
        problem = len(shape) not in (3, 4)
        if not problem:
            offset = 1 if len(shape) == 4 else 0
            dims = {2: shape[1 + offset], 3: shape[2 + offset]}
            for axis, want in expected.items():
                have = _static(dims[axis])
                if want is not None and have is not None and have != want:
                    problem = True
            if len(shape) == 4 and _static(shape[1]) not in (None, self.num_heads):
                problem = True
        if problem:
            raise ValueError(
                f"{name} must have shape [batch, query_length, key_length] or [batch, "
                f"num_heads={self.num_heads}, query_length, key_length] with query_length="
                f"{query_length} and key_length={key_length}. Received: {name}.shape={shape}"
            )
        matrix = ops.cast(matrix, "float32")
        return matrix[:, None] if len(shape) == 3 else matrix

    def _guided(self, matrix, neutral):
        """`M` on the guided heads, `neutral` (0 or 1) on the others."""
        if self.guided_heads is None:
            return matrix
        selected = np.zeros((1, self.num_heads, 1, 1), dtype=bool)
        selected[0, self.guided_heads] = True
        return ops.where(ops.convert_to_tensor(selected), matrix, neutral)

    def _syntax_terms(self, bias, attention_bias, attention_multiplier, query, key):
        """The running additive bias plus the additive `M`, and the multiplicative `M`
        (float32 `[B, H|1, T, S]`, or `None`)."""
        query_length, key_length = _static(query.shape[1]), _static(key.shape[1])
        if attention_bias is not None:
            matrix = self._check_syntax_matrix(
                "attention_bias", attention_bias, query_length, key_length
            )
            matrix = self._guided(ops.maximum(matrix, _BIAS_FLOOR), 0.0)
            bias = matrix if bias is None else ops.cast(bias, "float32") + matrix
        multiplier = None
        if attention_multiplier is not None:
            matrix = self._check_syntax_matrix(
                "attention_multiplier", attention_multiplier, query_length, key_length
            )
            multiplier = self._guided(matrix, 1.0)
        return bias, multiplier

    # Given attention weights (§5.4) -------------------------------------------------------

    def _attend_given_weights(
        self, weights, value, mask, use_dropout, query_positions, key_positions
    ):
        """`α·v` (plus value terms) with weights `[B, H, T, S]` computed elsewhere; entries
        this call masks are zeroed. Returns `(outputs [B, T, H, Dh], weights)`."""
        shape = tuple(weights.shape)
        key_length = _static(value.shape[1])
        if (
            len(shape) != 4
            or _static(shape[1]) not in (None, self.num_heads)
            or (key_length is not None and _static(shape[3]) not in (None, key_length))
        ):
            raise ValueError(
                f"attention_weights must have shape [batch, num_heads={self.num_heads}, "
                f"query_length, key_length={key_length}]. Received: attention_weights.shape={shape}"
            )
        weights = ops.cast(weights, "float32")
        if mask is not None:
            weights = ops.where(mask, weights, ops.zeros_like(weights))
        attended = weights
        if use_dropout:
            attended = keras.random.dropout(weights, self.dropout, seed=self.seed_generator)
        outputs = attend(attended, value)
        for hook in self._value_term_biases:
            term = hook.value_term(attended, value, query_positions, key_positions)
            outputs = outputs + ops.cast(term, outputs.dtype)
        return outputs, weights
