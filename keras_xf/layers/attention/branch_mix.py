"""Two attention branches, a plain one and a syntax-aware one, mixed by α (survey §3.3)."""

import math

import keras
from keras import ops

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool


@keras.saving.register_keras_serializable(package="keras_xf")
class BranchMix(SequenceMixer):
    """`H_self = α · Att_self(H) + (1 − α) · AttSyn_self(H)` (survey §3.3, multi-branch models).

    `Att_self` is a standard multi-head self-attention; `AttSyn_self` is a second one that
    receives the syntax matrix `M` of survey §3.2 at call time, either additively,
    `Softmax(QKᵀ/√d + M)V`, or multiplicatively, `Softmax(QKᵀ/√d ⊙ M)V`. The two branches have
    their own weights. `α` is fixed, or learned as `α = sigmoid(w)` (a scalar kept in (0, 1)).
    The layer takes the call arguments a `TransformerBlock` gives its mixer, so it can be a
    block's `mixer`; with a cache, its cache is the pair of the two branches' caches
    `(plain, syntax)`.

    Args:
        attention: a `MultiHeadAttention` (or its config), the plain branch `Att_self`.
        syntax_attention: a `MultiHeadAttention` for `AttSyn_self`; `None` clones the config
            of `attention` (fresh weights). Both branches need the same output width and the
            same cache shape.
        alpha: float in [0, 1], the weight of the plain branch; or `"learned"` (starting at
            0.5).
        learn_alpha: bool, learn `α` starting from the float `alpha`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        query: `[B, T, d]`.
        value, key: optional `[B, S, d_kv]` (cross-attention), as `MultiHeadAttention`.
        padding_mask, attention_mask, use_causal_mask: as `MultiHeadAttention`, both branches.
        attention_bias: float `[B, T, S]` or `[B, H, T, S]`, additive `M` (syntax branch).
        attention_multiplier: float `[B, T, S]` or `[B, H, T, S]`, multiplicative `M`
            (syntax branch).
        cache: the pair `(plain, syntax)` from `init_cache`; cache_index: as
            `MultiHeadAttention`.
        training: bool.

    Returns:
        `[B, T, d_out]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> mix = BranchMix(MultiHeadAttention(num_heads=2), alpha="learned")
    >>> x = keras.random.normal((2, 5, 16))
    >>> m = keras.ops.ones((2, 5, 5))  # e.g. a dependency-tree adjacency
    >>> y = mix(x, attention_multiplier=m)  # (2, 5, 16)
    """

    cache_dtype = None  # the branches' caches keep the dtype `init_cache` gave them

    def __init__(self, attention, syntax_attention=None, alpha=0.5, learn_alpha=False, **kwargs):
        super().__init__(**kwargs)
        attention = as_layer(attention, "attention", kind=MultiHeadAttention)
        if syntax_attention is None:
            syntax_attention = clone_layer(attention, name="syntax_attention")
        syntax_attention = as_layer(syntax_attention, "syntax_attention", kind=MultiHeadAttention)
        if alpha == "learned":
            initial = 0.5
            learn_alpha = True
        elif isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 <= alpha <= 1:
            initial = float(alpha)
        else:
            raise ValueError(
                f"alpha must be a float in [0, 1] or 'learned'. Received: alpha={alpha!r}"
            )
        check_bool("learn_alpha", learn_alpha)
        policy = self.dtype_policy if kwargs.get("dtype") is not None else None
        self.attention = with_dtype_policy(attention, policy)
        self.syntax_attention = with_dtype_policy(syntax_attention, policy)
        self.alpha = alpha if alpha == "learned" else float(alpha)
        self.learn_alpha = learn_alpha
        self._initial_alpha = initial
        self.alpha_logit = None

    def build(self, query_shape, value_shape=None, key_shape=None):
        for branch in (self.attention, self.syntax_attention):
            if not branch.built:
                branch.build(query_shape, value_shape, key_shape)
        shapes = [
            branch.compute_output_shape(query_shape)
            for branch in (self.attention, self.syntax_attention)
        ]
        if shapes[0] != shapes[1]:
            raise ValueError(
                "The two branches must give outputs of the same shape. Received: "
                f"attention output {shapes[0]}, syntax_attention output {shapes[1]}"
            )
        if self.learn_alpha:
            p = min(max(self._initial_alpha, 1e-4), 1 - 1e-4)
            self.alpha_logit = self.add_weight(
                name="alpha_logit",
                shape=(),
                initializer=keras.initializers.Constant(math.log(p / (1 - p))),
                dtype="float32",
            )

    def mixing_weight(self):
        """`α` as a float32 scalar tensor."""
        if self.alpha_logit is None:
            return ops.convert_to_tensor(self._initial_alpha, dtype="float32")
        return ops.sigmoid(ops.cast(self.alpha_logit, "float32"))

    def init_cache(self, batch_size, max_length, dtype=None):
        """The pair of the branches' caches `(plain, syntax)`, each `MultiHeadAttention`'s."""
        caches = [
            branch.init_cache(batch_size, max_length, dtype)
            for branch in (self.attention, self.syntax_attention)
        ]
        shapes = [tuple(tuple(part.shape) for part in cache) for cache in caches]
        if shapes[0] != shapes[1]:
            raise ValueError(
                f"BranchMix needs branches with equal cache shapes. Received: {shapes[0]} and "
                f"{shapes[1]}"
            )
        return tuple(caches)

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
        attention_bias=None,
        attention_multiplier=None,
        training=None,
    ):
        common = {
            "value": value,
            "key": key,
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
            "cache_index": cache_index,
            "training": training,
        }
        plain_cache = syntax_cache = None
        if cache is not None:
            if not isinstance(cache, (tuple, list)) or len(cache) != 2:
                raise ValueError(
                    "cache must be the pair (plain, syntax) of BranchMix.init_cache. Received: "
                    f"{type(cache).__name__}"
                )
            plain_cache, syntax_cache = cache
        plain = self.attention(query, cache=plain_cache, **common)
        syntax = self.syntax_attention(
            query,
            cache=syntax_cache,
            attention_bias=attention_bias,
            attention_multiplier=attention_multiplier,
            **common,
        )
        if cache is not None:
            (plain, plain_cache), (syntax, syntax_cache) = plain, syntax
        alpha = ops.cast(self.mixing_weight(), plain.dtype)
        outputs = alpha * plain + (1 - alpha) * ops.cast(syntax, plain.dtype)
        if cache is None:
            return outputs
        return outputs, (plain_cache, syntax_cache)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return self.attention.compute_output_shape(query_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention": keras.saving.serialize_keras_object(self.attention),
                "syntax_attention": keras.saving.serialize_keras_object(self.syntax_attention),
                "alpha": self.alpha,
                "learn_alpha": self.learn_alpha,
            }
        )
        return config
