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
from keras_xf.ops.checks import check_attention_mask
from keras_xf.ops.checks import check_attention_matrix
from keras_xf.ops.checks import check_key_padding_mask
from keras_xf.ops.checks import static_dim

# Additive syntax matrices may hold −inf ("never attend"); they are clipped to this value so
# that a row of −inf entries cannot turn the softmax into NaN.
_BIAS_FLOOR = -1e9


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

    def _needs_explicit_path(self, syntax_multiplier):
        # The fused kernels of some backends (JAX) need values as wide as queries and keys.
        return syntax_multiplier is not None or (
            self.qk_dim is not None and self.qk_dim != self.head_dim
        )

    def _cache_entry(self, key, value):
        """The cache entries of keys `[B, S, Hkv, d′]` and values `[B, S, Hkv, Dh]`: the pair
        `(keys [B, Hkv, S, d′], values [B, Hkv, S, Dh])`, head-major. Decoding reads every
        cached key at every step; head-major, each head's keys are the contiguous operand of
        its `q·kᵀ` product, and two tensors (not one stacked tensor) make each an operand
        without a slice copy."""
        return (ops.transpose(key, (0, 2, 1, 3)),
                ops.transpose(ops.cast(value, key.dtype), (0, 2, 1, 3)))

    def _read_cache(self, cache):
        """Keys and values of a cache as `[B, S, Hkv, ·]`, the layout of the other paths."""
        return tuple(ops.transpose(part, (0, 2, 1, 3)) for part in cache)

    @staticmethod
    def _check_cache(cache):
        """A `MultiHeadAttention` cache is the pair `(keys, values)` of `init_cache`."""
        if cache is None:
            return
        if not isinstance(cache, (tuple, list)) or len(cache) != 2 or any(
            len(getattr(part, "shape", ())) != 4 for part in cache
        ):
            shape = getattr(cache, "shape", None)
            received = (f"a tensor of shape {tuple(shape)}" if shape is not None else
                        f"{type(cache).__name__} of {len(cache) if isinstance(cache, (tuple, list)) else '?'} entries")
            raise ValueError(
                "cache must be the pair (keys [B, Hkv, L, d], values [B, Hkv, L, d]) of "
                f"init_cache. Received: {received}"
            )

    # Syntax matrices M (§3.2, §3.3) -------------------------------------------------------

    def _compressed_length_of(self, length):
        """The number of keys made from `length` key/value inputs: `length` itself here;
        `CompressedAttention` reduces it."""
        return length

    def _check_call_masks(self, query, value, key, cache, cache_index, padding_mask,
                          attention_mask, attention_bias, attention_multiplier,
                          attention_weights):
        """Checks the masks and matrices of a call against the queries and the keys they
        attend to, before any of them is used: a wrong length or rank raises the same
        `ValueError`, naming the argument, on every backend.

        The keys are the cache's positions when a cache is read (with `cache_index`, or
        without `value`), else those of `key`, `value` or `query`."""
        self._check_cache(cache)
        batch, query_length = static_dim(query.shape[0]), static_dim(query.shape[1])
        rolling = self._is_rolling(cache, cache_index, value)
        if rolling:
            # One new token attends to the slots; a prompt to the slots and its own keys.
            slots = cache[0].shape[2]
            key_length = slots if query_length == 1 else (
                None if query_length is None else slots + query_length)
            keys = f"the rolling cache of {slots} slots"
        elif cache is not None and (cache_index is not None or value is None):
            key_length = static_dim(cache[0].shape[2])
            keys = f"cache keys of shape {tuple(cache[0].shape)} (key_length = keys.shape[2])"
        else:
            name, source = next(
                (n, t) for n, t in (("key", key), ("value", value), ("query", query))
                if t is not None
            )
            key_length = self._compressed_length_of(static_dim(source.shape[1]))
            keys = f"{name}.shape={tuple(source.shape)}"
            if key_length != static_dim(source.shape[1]):
                keys += f" compressed to {key_length} keys"
        if not rolling:  # a rolling cache refuses both masks (`_rolling_cache_update`)
            check_key_padding_mask(padding_mask, batch, key_length, keys)
            check_attention_mask(attention_mask, batch, query_length, key_length, self.num_heads)
        for name, matrix in (
            ("attention_bias", attention_bias),
            ("attention_multiplier", attention_multiplier),
            ("attention_weights", attention_weights),
        ):
            check_attention_matrix(matrix, name, batch, query_length, key_length, self.num_heads)

    def _as_heads(self, matrix):
        """A float32 `[B, T, S]` or `[B, H|1, T, S]` matrix (checked by `_check_call_masks`)
        as `[B, H|1, T, S]`."""
        matrix = ops.cast(matrix, "float32")
        return matrix[:, None] if len(matrix.shape) == 3 else matrix

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
        batch, query_length = static_dim(query.shape[0]), static_dim(query.shape[1])
        key_length = static_dim(key.shape[1])
        if attention_bias is not None:
            check_attention_matrix(
                attention_bias, "attention_bias", batch, query_length, key_length, self.num_heads
            )
            matrix = self._guided(ops.maximum(self._as_heads(attention_bias), _BIAS_FLOOR), 0.0)
            bias = matrix if bias is None else ops.cast(bias, "float32") + matrix
        multiplier = None
        if attention_multiplier is not None:
            check_attention_matrix(
                attention_multiplier, "attention_multiplier", batch, query_length, key_length,
                self.num_heads,
            )
            multiplier = self._guided(self._as_heads(attention_multiplier), 1.0)
        return bias, multiplier

    # Given attention weights (§5.4) -------------------------------------------------------

    def _attend_given_weights(
        self, weights, value, mask, use_dropout, query_positions, key_positions
    ):
        """`α·v` (plus value terms) with weights `[B, H, T, S]` computed elsewhere; entries
        this call masks are zeroed. Weights `[B, T, S]` or `[B, 1, T, S]` are shared by the
        heads. Returns `(outputs [B, T, H, Dh], weights [B, H, T, S])`."""
        key_length = static_dim(value.shape[1])
        check_attention_matrix(
            weights, "attention_weights", static_dim(weights.shape[0]), None, key_length,
            self.num_heads,
        )
        weights = self._as_heads(weights)
        if weights.shape[1] == 1 and self.num_heads > 1:
            weights = ops.repeat(weights, self.num_heads, axis=1)
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
