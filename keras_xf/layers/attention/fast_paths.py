"""The faster paths of `MultiHeadAttention` and when each applies (survey §5.1, §5.4).

Each path computes the numbers of the plain score pipeline with less work, and applies only
where nothing the pipeline offers beyond it is needed:
- one fused matmul for the query, key and value projections of self-attention
  (`_project_inputs` chooses it or the three projections);
- `head_major_attention` reading a cache in its own `[B, Hkv, S, ·]` layout (decoding);
- block-sparse self-attention for banded patterns (`keras_xf.ops.block_sparse_attention`,
  memory `O(n·w)`).
"""

import keras

from keras_xf.layers.attention.caches.rolling_cache import cache_kind
from keras_xf.layers.head_projections import fusable
from keras_xf.layers.head_projections import project_fused
from keras_xf.ops.block_sparse_attention import block_sparse_attention


class FastPathsMixin:
    """Mixed into `MultiHeadAttention`; reads its declared ability `masks_by_scores`, which
    a subclass that narrows the mask by the scores sets."""

    def _fuses_qkv(self):
        """Whether self-attention projects `q, k, v` with one matmul (`project_fused`): kernels
        that `fusable` accepts (not quantised, no LoRA, one dtype), and no `ModelParallel`
        distribution (the kernels are sharded by heads there, and joining them along the
        sharded axis would gather them across devices)."""
        return (
            not isinstance(keras.distribution.distribution(), keras.distribution.ModelParallel)
            and fusable([self.query_dense, self.key_dense, self.value_dense])
        )

    def _project_inputs(self, query, value, key, cache, kind):
        """`q, k, v` `[B, ·, H|Hkv, ·]`: by one fused matmul for self-attention where
        `_fuses_qkv` allows it; else by three projections of `query`, `value` and `key`
        (`value` and `key` default to `query`). With `cache` (a cache read as it is), the keys
        and values are the cache's, read by `kind`, or `None` without a `kind` (the
        head-major path reads the cache itself)."""
        if cache is not None:
            q = self._project(self.query_dense, query)
            k, v = (None, None) if kind is None else kind.read(cache)
            return q, k, v
        if value is None and key is None and self._fuses_qkv():
            return project_fused([self.query_dense, self.key_dense, self.value_dense], query)
        q = self._project(self.query_dense, query)
        value_input = query if value is None else value
        key_input = value_input if key is None else key
        self._check_width("value", value_input, self.value_dense.kernel.shape[0])
        return q, self._project(self.key_dense, key_input), self._project(self.value_dense,
                                                                          value_input)

    def _attends_head_major(self, cache, cache_index, value, attention_bias,
                            attention_multiplier, attention_weights, return_attention_scores,
                            training):
        """Whether this call reads a cache (decoding, or cross-attention to a filled cache)
        and needs nothing but masks, so that `head_major_attention` attends to the cache in
        its own `[B, Hkv, S, ·]` layout: no score hooks, pattern, matrices, returned weights
        or attention dropout."""
        reads_cache = cache is not None and (
            cache_index is not None or value is None
        ) and cache_kind(self.pattern, cache, cache_index, value).reads_in_place
        return (
            reads_cache
            and not self.masks_by_scores
            and self.pattern is None
            and self.multiplier is None
            and not self.biases
            and attention_bias is None
            and attention_multiplier is None
            and attention_weights is None
            and not return_attention_scores
            and not (bool(training) and self.dropout > 0)
        )

    def _block_sparse_applies(self, q, value, key, attention_mask, cache, cache_index,
                              return_attention_scores, attention_bias=None,
                              attention_multiplier=None, attention_weights=None):
        """Whether self-attention with `pattern` runs block-sparsely: the pattern offers it
        (`block_sparse` and `block_layout`), the length is static, and nothing needs dense
        scores (no multiplier, no additive biases or syntax matrices, no given or returned
        weights, no attention_mask, no cache, queries and keys as wide as the values).
        Otherwise the dense masked path computes the same numbers."""
        pattern = self.pattern
        return bool(
            pattern is not None
            and pattern.block_sparse
            and not pattern.uses_states
            and value is None
            and key is None
            and attention_mask is None
            and cache is None
            and cache_index is None
            and not return_attention_scores
            and self.multiplier is None
            and not self.biases
            and isinstance(q.shape[1], int)
            and attention_bias is None
            and attention_multiplier is None
            and attention_weights is None
            and not self._needs_explicit_path(None)
        )

    def _block_sparse(self, q, k, v, padding_mask, causal, training):
        block_size, offsets = self.pattern.block_layout(q.shape[1])
        return block_sparse_attention(
            q,
            k,
            v,
            field=self.pattern.field,
            block_size=block_size,
            block_offsets=offsets,
            padding_mask=padding_mask,
            causal=causal,
            scale=self.scale,
            dropout_rate=self.dropout,
            training=bool(training) and self.dropout > 0,
            seed_generator=self.seed_generator,
        )
