"""The score pipeline of `MultiHeadAttention` past its projections (survey §2.3, §2.6,
§3.2-3.3, §4.1, §5.3.2, §5.4).

- Syntax matrices `M` given at call time: `Softmax(QKᵀ/√d + M)` (additive) and
  `Softmax(QKᵀ/√d ⊙ M)` (multiplicative), optionally for a subset of heads only (§3.2, §3.3).
- Low-dimensional queries and keys (`qk_dim = d′`, §5.3.2).
- The weights and the outputs: the fused kernel, or the explicit path of scores, biases,
  multiplier, float32 softmax, weight mixers and value terms; or attention weights given from
  outside (attention-map sharing across layers, §5.4).
- The pattern and causal masks by absolute positions (§2.6, §5.1).
"""

from collections.abc import Iterable

import keras
import numpy as np
from keras import ops

from keras_xf.layers.attention.caches.full_cache import FullCache
from keras_xf.layers.attention.caches.rolling_cache import cache_kind
from keras_xf.ops.attention import attend
from keras_xf.ops.attention import attention_scores
from keras_xf.ops.attention import masked_softmax
from keras_xf.ops.attention import scaled_dot_product_attention
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
            if not isinstance(guided_heads, Iterable):
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

    # Syntax matrices M (§3.2, §3.3) -------------------------------------------------------

    def _compressed_length_of(self, length):
        """The number of keys made from `length` key/value inputs: `length` itself here;
        `CompressedAttention` reduces it."""
        return length

    def _attended_keys(self, query, value, key, cache, cache_index):
        """`(key_length, keys, input_length)`: the number of keys the queries attend to (static,
        or `None`), what they are (for error messages), and the length of the key/value inputs
        that a `padding_mask` covers (before `_compressed_length_of`). They are the cache's
        when a cache is read (with `cache_index`, or without `value`), else those of `key`,
        `value` or `query`."""
        if cache is not None and (cache_index is not None or value is None):
            kind = cache_kind(self.pattern, cache, cache_index, value)
            key_length = kind.key_length(cache, static_dim(query.shape[1]))
            return key_length, kind.describe(cache), key_length
        name, source = next(
            (n, t) for n, t in (("key", key), ("value", value), ("query", query)) if t is not None
        )
        length = static_dim(source.shape[1])
        key_length = self._compressed_length_of(length)
        keys = f"{name}.shape={tuple(source.shape)}"
        if key_length != length:
            keys += f" compressed to {key_length} keys"
        return key_length, keys, length

    def _check_width(self, arg, tensor, expected):
        """`tensor` `[..., expected]`, the width a projection was built for."""
        if expected is not None and tensor.shape[-1] is not None and tensor.shape[-1] != expected:
            raise ValueError(
                f"{arg} has width {tensor.shape[-1]}, but the layer was built for {expected}. "
                f"Received: {arg}.shape={tuple(tensor.shape)}"
            )

    def _check_call_masks(self, query, value, key, cache, cache_index, padding_mask,
                          attention_mask, attention_bias, attention_multiplier,
                          attention_weights):
        """Checks the masks and matrices of a call against the queries and the keys they
        attend to, before any of them is used: a wrong length or rank raises the same
        `ValueError`, naming the argument, on every backend (the keys: `_attended_keys`)."""
        FullCache.check(cache)
        batch, query_length = static_dim(query.shape[0]), static_dim(query.shape[1])
        key_length, keys, input_length = self._attended_keys(query, value, key, cache,
                                                             cache_index)
        kind = cache_kind(self.pattern, cache, cache_index, value)
        if cache is None or kind.takes_masks:  # a rolling cache refuses both masks
            check_key_padding_mask(padding_mask, batch, input_length, keys)
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

    # The weights and the outputs (§2.3, §4.1, §5.4) ----------------------------------------

    def _attend(self, q, k, v, mask, bias, syntax_multiplier, attention_weights,
                return_weights, training, query_positions, key_positions):
        """`(outputs [B, T, H, Dh], weights [B, H, T, S] or None)` of the score pipeline: the
        given `attention_weights`; the fused `scaled_dot_product_attention` when only masks
        and additive biases are needed; else the explicit path (float32 scores, biases, the
        multiplier, `masked_softmax`, the weight mixers, then `α·v` and the value terms)."""
        use_dropout = bool(training) and self.dropout > 0
        if attention_weights is not None:
            return self._attend_given_weights(
                attention_weights, v, mask, use_dropout, query_positions, key_positions
            )
        explicit = (
            return_weights
            or self.multiplier is not None
            or self._value_term_biases
            or self._weight_mixers
            or self._needs_explicit_path(syntax_multiplier)
        )
        if not explicit:
            outputs = scaled_dot_product_attention(
                q, k, v, mask=mask, bias=bias, scale=self.scale, dropout_rate=self.dropout,
                training=use_dropout, seed_generator=self.seed_generator,
            )
            return outputs, None
        scores = attention_scores(q, k, self.scale)
        if bias is not None:
            scores = scores + ops.cast(bias, "float32")
        if self.multiplier is not None:
            multiplier = self.multiplier(q, k, query_positions, key_positions)
            scores = scores * ops.cast(multiplier, "float32")
        if syntax_multiplier is not None:
            scores = scores * syntax_multiplier
        weights = self._mix_weights(masked_softmax(scores, mask), q, k, query_positions,
                                    key_positions, mask)
        outputs = self._weighted_values(weights, v, use_dropout, query_positions, key_positions)
        return outputs, weights

    def _mix_weights(self, weights, q, k, query_positions, key_positions, mask):
        """The softmax weights after the `mixes_weights` biases, in order."""
        for hook in self._weight_mixers:
            weights = hook.mix_weights(weights, q, k, query_positions, key_positions, mask)
        return weights

    def _weighted_values(self, weights, value, use_dropout, query_positions, key_positions):
        """`α·v` plus the value terms of the biases that have one, with dropout on the
        weights when `use_dropout`."""
        attended = weights
        if use_dropout:
            attended = keras.random.dropout(weights, self.dropout, seed=self.seed_generator)
        outputs = attend(attended, value)
        for hook in self._value_term_biases:
            term = hook.value_term(attended, value, query_positions, key_positions)
            outputs = outputs + ops.cast(term, outputs.dtype)
        return outputs

    def _attend_given_weights(
        self, weights, value, mask, use_dropout, query_positions, key_positions
    ):
        """`α·v` (plus value terms) with weights `[B, H, T, S]` computed elsewhere (attention-map
        sharing, §5.4); entries this call masks are zeroed. Weights `[B, T, S]` or
        `[B, 1, T, S]` are shared by the heads. Returns `(outputs [B, T, H, Dh], weights
        [B, H, T, S])`."""
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
        outputs = self._weighted_values(weights, value, use_dropout, query_positions,
                                        key_positions)
        return outputs, weights

    # Masks (§2.6, §5.1) and the keys attended to (§5.3.1) ------------------------------

    def _compress_keys_and_values(self, key, value, padding_mask):
        """`(keys, values, padding_mask)` that the queries attend to, made from the projected
        keys and values and the inputs' padding mask: themselves here; `CompressedAttention`
        reduces their length."""
        return key, value, padding_mask

    def _select_keys(self, q, k, mask):
        """The merged mask of the keys each query attends to: `mask` itself here;
        `CompressedAttention` narrows it by the scores (`masks_by_scores`)."""
        return mask

    def _pattern_mask(self, q, k, query_positions, key_positions, cache_index):
        if self.pattern is None:
            return None
        if cache_index is not None and not self.pattern.supports_decoding:
            raise ValueError(
                f"pattern={type(self.pattern).__name__} does not support cached decoding (the "
                "field of a query depends on later keys). Received: cache_index with this pattern"
            )
        if self.pattern.uses_states:
            return self.pattern(query_positions, key_positions, query=q, key=k)
        return self.pattern(query_positions, key_positions)

    def _causal_mask(self, query_positions, key_positions):
        """`j ≤ i` by absolute positions (keys of a rolling cache are not in position order)."""
        return ops.greater_equal(query_positions[:, None], key_positions[None, :])
