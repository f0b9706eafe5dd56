"""Multi-head, multi-query and grouped-query attention with a KV cache (survey §2.3, §2.6, §5.4)."""

import keras
import numpy as np
from keras import ops

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.attention.caches.rolling_cache import cache_kind
from keras_xf.layers.attention.fast_paths import FastPathsMixin
from keras_xf.layers.attention.position_hook import PositionHook
from keras_xf.layers.attention.score_bias import ScoreBias
from keras_xf.layers.attention.score_extensions import ScoreExtensionsMixin
from keras_xf.layers.attention.score_multiplier import ScoreMultiplier
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.head_projections import INTO_HEADS
from keras_xf.layers.head_projections import OUT_OF_HEADS
from keras_xf.layers.head_projections import head_projection
from keras_xf.layers.head_projections import project
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.attention import head_major_attention
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.masks import key_padding_to_attention_mask
from keras_xf.ops.masks import merge_masks


# The constructor arguments that `get_config` returns as they are, and the single hooks.
_ARGUMENTS = ("num_heads", "head_dim", "num_key_value_heads", "output_dim", "use_bias",
              "output_bias", "dropout", "causal", "scale", "guided_heads", "qk_dim")
_HOOKS = ("position", "multiplier", "pattern")


def _serialize(layer):
    return None if layer is None else keras.saving.serialize_keras_object(layer)


@keras.saving.register_keras_serializable(package="keras_xf")
class MultiHeadAttention(ScoreExtensionsMixin, FastPathsMixin, SequenceMixer):
    """Multi-head attention: `C = Merge(C₁ … C_τ) W_c`, `C_h = Softmax(Q_h K_hᵀ/√d_h + M) V_h`.

    Survey §2.3 (multi-head self-attention), §2.6 (cross-attention and the causal mask `M`)
    and §5.4 (multi-query / grouped-query attention: `num_key_value_heads` key/value heads,
    each shared by `num_heads / num_key_value_heads` query heads).

    The scores follow one pipeline with plug points for the attention variants:
    `q, k = position.rotate(q, k, …)`; `scores = q·kᵀ·scale + Σ bias(q, k, …)`;
    `scores = scores ⊙ multiplier(q, k, …)`; masked by padding ∧ attention_mask ∧ causal ∧
    `pattern(…)`; `α = masked_softmax(scores)` in float32; `out = α·v + Σ bias.value_term(α, …)`.
    Without multiplier, value terms, returned weights or training dropout, the fused
    `keras.ops.dot_product_attention` kernel computes the same numbers.

    Each hook subclasses a base layer that documents its protocol and declares its abilities
    as class attributes with defaults: `position` a `PositionHook` (`rotate(q, k, positions)`),
    each of `biases` a `ScoreBias` (additive, with optional value terms or weight mixing),
    `multiplier` a `ScoreMultiplier`, `pattern` an `AttentionPattern` (a boolean field).
    Banded patterns run block-sparsely in self-attention and decode with a rolling cache of
    their `cache_slots` (`keras_xf.layers.attention.fast_paths`, `caches.RollingCache`).

    Args:
        num_heads: int, query heads `τ`.
        head_dim: int, width of each head; defaults to `hidden_dim // num_heads`.
        num_key_value_heads: int dividing `num_heads` (1 = MQA); defaults to `num_heads`.
        output_dim: int, output width; defaults to the query width.
        use_bias: bool, biases in the four projections.
        output_bias: optional bool, a bias in the output projection; `use_bias` when `None`
            (Qwen2 has biases in the query, key and value projections only).
        dropout: float in [0, 1), dropout on the attention weights.
        causal: bool, default for `use_causal_mask`.
        scale: float, score scale; defaults to `1/√head_dim`.
        position, biases, multiplier, pattern: the plug points above (`biases` is a list).
        guided_heads: list of head indices that receive `attention_bias` /
            `attention_multiplier` (survey §3.3: syntax guides only some heads); `None` = all.
        qk_dim: int `d′`, width of each query and key head (survey §5.3.2, low-dimensional
            queries and keys); values keep `head_dim`. Scores are computed in the `d′` space
            and `scale` defaults to `1/√d′`. `None` means `head_dim`.
        kernel_initializer, bias_initializer: initializers of the projections.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query: `[B, T, d]`.
        value: `[B, S, d_kv]` for cross-attention; `None` for self-attention.
        key: `[B, S, d_kv]`, defaults to `value`.
        padding_mask: boolean `[B, S]`, `True` for real key/value tokens.
        attention_mask: boolean `[B, T, S]` or `[B, H, T, S]`.
        attention_bias: float `[B, T, S]` or `[B, H, T, S]`, the syntax matrix `M` added to the
            scores before masking: `Softmax(QKᵀ/√d + M)` (survey §3.2); `−inf` entries are
            clipped to −1e9. Only the `guided_heads` receive it.
        attention_multiplier: float `[B, T, S]` or `[B, H, T, S]`, the syntax matrix `M` that
            multiplies the scores: `Softmax(QKᵀ/√d ⊙ M)` (survey §3.2); explicit path.
        attention_weights: float `[B, H, T, S]` attention weights computed elsewhere (e.g. by
            an earlier layer, survey §5.4, attention-map sharing): the scores are not computed
            and `α·v` uses these weights (masked by this call's masks).
        use_causal_mask: bool, `None` means `causal`.
        cache: the pair `(keys [B, Hkv, S_max, d′], values [B, Hkv, S_max, Dh])` from
            `init_cache`. With `cache_index`, the new keys and
            values are written at `cache_index` and the queries attend to the cache; without
            it, the cache is filled from `value` (cross-attention computed once) or, when
            `value` is `None`, used as it is.
        cache_index: int or scalar int tensor, position of the first query token.
        return_attention_scores: bool, also return the float32 weights `[B, H, T, S]`.
        bias_terms: the terms of the `positions_only` score biases (in the order of
            `biases`) computed by an earlier layer over the same positions, used in place of
            computing them (`TransformerStack(share_score_biases=True)`).
        return_bias_terms: bool, also return the tuple of those terms as `"bias_terms"`.
        training: bool.

    Returns:
        `[B, T, output_dim]`, or `(outputs, new_cache)` when a cache is given. With
        `return_attention_scores=True`, one dict `{"outputs": …, "attention_scores": …}`
        (float32 `[B, H, T, S]`), plus `"cache": new_cache` when a cache is given (and
        `"bias_terms"` with `return_bias_terms=True`).

    Example:
    >>> mha = MultiHeadAttention(num_heads=4, num_key_value_heads=2)
    >>> y = mha(keras.random.normal((2, 6, 32)), use_causal_mask=True)  # (2, 6, 32)
    """

    cache_dtype = None  # keys and values stay in the dtype `init_cache` gave them
    # A subclass that narrows the mask by the scores (`_select_keys`) declares it: the
    # head-major reading of a cache computes no scores.
    masks_by_scores = False

    def __init__(
        self,
        num_heads,
        head_dim=None,
        num_key_value_heads=None,
        output_dim=None,
        use_bias=True,
        output_bias=None,
        dropout=0.0,
        causal=False,
        scale=None,
        position=None,
        biases=None,
        multiplier=None,
        pattern=None,
        guided_heads=None,
        qk_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        for name, value in (("head_dim", head_dim), ("output_dim", output_dim)):
            if value is not None:
                check_positive_int(name, value)
        if num_key_value_heads is None:
            num_key_value_heads = num_heads
        check_positive_int("num_key_value_heads", num_key_value_heads)
        if num_heads % num_key_value_heads:
            raise ValueError(
                "num_heads must be a multiple of num_key_value_heads. Received: "
                f"num_heads={num_heads}, num_key_value_heads={num_key_value_heads}"
            )
        check_rate("dropout", dropout)
        if scale is not None:
            check_positive_number("scale", scale)
        if output_bias is None:
            output_bias = use_bias
        for name, value in (("use_bias", use_bias), ("output_bias", output_bias),
                            ("causal", causal)):
            check_bool(name, value)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_key_value_heads = num_key_value_heads
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.output_bias = output_bias
        self.dropout = dropout
        self.causal = causal
        self.scale = scale
        self.position = as_layer(position, "position", optional=True, kind=PositionHook)
        if biases is not None and not isinstance(biases, (list, tuple)):
            raise ValueError(
                "biases must be a list of ScoreBias layers. Received: "
                f"biases={type(biases).__name__}"
            )
        self.biases = [
            as_layer(bias, f"biases[{index}]", kind=ScoreBias)
            for index, bias in enumerate(biases or [])
        ]
        self.multiplier = as_layer(multiplier, "multiplier", optional=True, kind=ScoreMultiplier)
        self.pattern = as_layer(pattern, "pattern", optional=True, kind=AttentionPattern)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        # Unseeded, as Keras's `Dropout` layer: on PyTorch a seeded generator takes Keras's
        # slow dropout path (a full tensor of keep probabilities and a Bernoulli draw per
        # element) instead of `torch.nn.functional.dropout`.
        self.seed_generator = keras.random.SeedGenerator()
        self._index_biases()
        self._init_score_extensions(guided_heads, qk_dim)

    def _projection(self, name, equation, output_shape, bias_axes, use_bias=None):
        return head_projection(
            name, equation, output_shape, bias_axes,
            use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=self.kernel_initializer, bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
        )

    def _project(self, dense, inputs):
        """`dense(inputs)` as one matmul (`keras_xf.layers.head_projections.project`)."""
        return project(dense, inputs)

    def _index_biases(self):
        self._value_term_biases = [b for b in self.biases if b.has_value_term]
        self._weight_mixers = [b for b in self.biases if b.mixes_weights]

    def share_biases(self, biases):
        """Uses the `ScoreBias` layers `biases` (another layer's, weights included) as this
        layer's own `biases`: `TransformerStack(share_score_biases=True)` gives every layer the
        bias table of its first layer (T5's one relative-position bias per stack)."""
        self.biases = list(biases)
        self._index_biases()

    def build(self, query_shape, value_shape=None, key_shape=None):
        if len(query_shape) != 3:
            raise ValueError(
                "MultiHeadAttention expects a query of rank 3 [batch, length, dim]. "
                f"Received: query_shape={tuple(query_shape)}"
            )
        hidden_dim = query_shape[-1]
        if self.head_dim is None:
            if hidden_dim % self.num_heads:
                raise ValueError(
                    "num_heads must divide hidden_dim when head_dim is not given. Received: "
                    f"num_heads={self.num_heads}, hidden_dim={hidden_dim}"
                )
            self.head_dim = hidden_dim // self.num_heads
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        for arg, shape in (("value_shape", value_shape), ("key_shape", key_shape)):
            if len(shape) != 3:
                raise ValueError(
                    f"MultiHeadAttention expects {arg[:-6]} of rank 3. Received: {arg}={tuple(shape)}"
                )
        heads, kv_heads, dim = self.num_heads, self.num_key_value_heads, self.head_dim
        out_dim = self.output_dim or hidden_dim
        qk = self.qk_dim or dim
        self.query_dense = self._projection("query", INTO_HEADS, (None, heads, qk), "hk")
        self.key_dense = self._projection("key", INTO_HEADS, (None, kv_heads, qk), "hk")
        self.value_dense = self._projection("value", INTO_HEADS, (None, kv_heads, dim), "hk")
        self.output_dense = self._projection("attention_output", OUT_OF_HEADS, (None, out_dim), "d",
                                             use_bias=self.output_bias)
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build((query_shape[0], query_shape[1], heads, dim))
        head_shape = (query_shape[0], query_shape[1], heads, qk)
        for hook in [self.position, self.multiplier, self.pattern] + self.biases:
            if hook is not None and not hook.built:
                hook.build(head_shape)

    @property
    def cache_is_rolling(self):
        """Whether decoding keeps a rolling cache (`RollingCache`): a pattern with `cache_slots`."""
        return self.pattern is not None and self.pattern.cache_slots is not None

    def init_cache(self, batch_size, max_length, dtype=None):
        """A zero cache, the head-major pair `(keys [batch_size, num_key_value_heads,
        max_length, qk_dim], values [batch_size, num_key_value_heads, max_length, head_dim])`
        (`qk_dim` is `head_dim` by default); with a pattern that has `cache_slots`,
        `min(max_length, cache_slots)` rolling slots (`RollingCache`)."""
        if self.head_dim is None:
            raise ValueError(
                "init_cache needs head_dim: pass head_dim to MultiHeadAttention or build it first."
            )
        return cache_kind(self.pattern).allocate(
            batch_size, max_length, self.num_key_value_heads, self.qk_dim or self.head_dim,
            self.head_dim, dtype or self.compute_dtype,
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        attention_bias=None,
        attention_multiplier=None,
        attention_weights=None,
        bias_terms=None,
        return_bias_terms=False,
        training=None,
    ):
        if len(query.shape) != 3:
            raise ValueError(
                f"query must have rank 3 [batch, length, dim]. Received: query.shape={tuple(query.shape)}"
            )
        self._check_width("query", query, self.query_dense.kernel.shape[0])
        self._check_call_masks(
            query, value, key, cache, cache_index, padding_mask, attention_mask,
            attention_bias, attention_multiplier, attention_weights,
        )
        kind = cache_kind(self.pattern, cache, cache_index, value)
        causal = self.causal if use_causal_mask is None else use_causal_mask
        query_length = ops.shape(query)[1]
        offset = 0 if cache_index is None else ops.cast(cache_index, "int32")
        query_positions = ops.arange(query_length, dtype="int32") + offset

        reuse_cache = cache is not None and cache_index is None and value is None
        head_major = self._attends_head_major(
            cache, cache_index, value, attention_bias, attention_multiplier, attention_weights,
            return_attention_scores, training,
        )
        # The first write into a full cache, from position 0, attends to the keys it writes
        # and to nothing else (the rest of the cache is empty): a prefill costs what the
        # uncached pass over its tokens costs, however long the cache.
        prefill = bool(head_major and padding_mask is None and attention_mask is None
                       and value is None and key is None
                       and type(cache_index) in (int, np.int32, np.int64) and cache_index == 0)
        head_major = head_major and not prefill
        # A cache read as it is gives the keys and values (the head-major path reads it itself).
        q, k, v = self._project_inputs(query, value, key, cache if reuse_cache else None,
                                       None if head_major else kind)
        k, v, padding_mask = self._compress_keys_and_values(k, v, padding_mask)
        key_positions = ops.arange(
            kind.length(cache) if k is None else ops.shape(k)[1], dtype="int32"
        ) + (offset if value is None else 0)
        if self.position is not None:
            if reuse_cache:
                q = self.position.rotate(q, q, query_positions, query_positions)[0]
            else:
                q, k = self.position.rotate(q, k, query_positions, key_positions)

        if self._block_sparse_applies(q, value, key, attention_mask, cache, cache_index,
                                      return_attention_scores, attention_bias,
                                      attention_multiplier, attention_weights):
            return self._project(self.output_dense, self._block_sparse(q, k, v, padding_mask,
                                                                        causal, training))
        valid_keys = None
        new_cache = None
        if cache is not None and cache_index is not None:
            kind.check_masks(padding_mask, attention_mask)
            new_cache, attended, key_positions, valid_keys = kind.write(
                cache, k, v, offset, query_length)
            if prefill:
                key_positions, valid_keys = query_positions, None
            else:
                k, v = (None, None) if head_major else kind.read(attended)
        elif cache is not None:
            new_cache = cache if reuse_cache else kind.fill(cache, k, v)

        mask = merge_masks(
            None if padding_mask is None else key_padding_to_attention_mask(padding_mask),
            attention_mask,
            self._causal_mask(query_positions, key_positions) if causal else None,
            valid_keys,
            self._pattern_mask(q, k, query_positions, key_positions, cache_index),
        )
        mask = self._select_keys(q, k, mask)
        if head_major:
            outputs = head_major_attention(q, *new_cache, mask=mask, scale=self.scale)
            return join_results(self._project(self.output_dense, outputs), new_cache, None, True)
        bias, terms = None, []
        for hook in self.biases:
            if hook.mixes_weights:
                continue
            if hook.positions_only and bias_terms is not None:
                term = bias_terms[len(terms)]
            else:
                term = hook(q, k, query_positions, key_positions)
            if hook.positions_only:
                terms.append(term)
            bias = term if bias is None else bias + term
        bias, syntax_multiplier = self._syntax_terms(bias, attention_bias, attention_multiplier, q, k)

        outputs, weights = self._attend(q, k, v, mask, bias, syntax_multiplier, attention_weights,
                                        return_attention_scores, training, query_positions,
                                        key_positions)
        outputs = self._project(self.output_dense, outputs)

        extras = {"attention_scores": weights} if return_attention_scores else None
        if return_bias_terms:
            extras = dict(extras or {}, bias_terms=tuple(terms))
        return join_results(outputs, new_cache, extras, cache is not None)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def compute_output_spec(self, query, value=None, key=None, cache=None, cache_index=None,
                            return_attention_scores=False, **kwargs):
        outputs, new_cache = self.output_specs(query, cache)
        extras = None
        if return_attention_scores:
            key_length = self._attended_keys(query, value, key, cache, cache_index)[0]
            extras = {"attention_scores": keras.KerasTensor(
                (query.shape[0], self.num_heads, query.shape[1], key_length), dtype="float32"
            )}
        return join_results(outputs, new_cache, extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in _ARGUMENTS})
        config.update({name: _serialize(getattr(self, name)) for name in _HOOKS})
        config.update(
            biases=[_serialize(bias) for bias in self.biases],
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
