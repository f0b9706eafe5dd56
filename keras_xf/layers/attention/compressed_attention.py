"""Attention over keys and values reduced from `n` to `n′` (survey §5.3.1, "Reducing n")."""

import keras
from keras import ops

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.ops.attention import attention_scores
from keras_xf.ops.attention import lowest_value
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.masks import downsample_padding_mask
from keras_xf.ops.masks import merge_masks

METHODS = ("projection", "convolution", "selection")
_LENGTH_METHODS = ("projection", "convolution")


@keras.saving.register_keras_serializable(package="keras_xf")
class CompressedAttention(MultiHeadAttention):
    """Multi-head attention whose keys and values are reduced from `n` to `n′` positions.

    Survey §5.3.1: with `K′, V′ ∈ ℝ^{n′×d}` in place of `K, V ∈ ℝ^{n×d}`,
    `Att_self(S) = A V′`, `A = Softmax(Q K′ᵀ/√d + M)`, which costs `O(n′·n·d)` instead of
    `O(n²·d)`. Queries are not reduced (the output keeps `n` rows). `method` picks how
    `K′, V′` are obtained from the projected keys and values (per head):

    - `"projection"` (Linformer, Wang et al. 2020): `K′ = Uᵏ K`, `V′ = Uᵛ V` with learned
      `Uᵏ, Uᵛ ∈ ℝ^{n′×n}` (shared by the heads), `n = max_length`. A sequence of `S < n`
      positions uses the first `S` columns (the same as zero-padding it to `n`); padding keys
      and values are zeroed before the projection, and the `n′` compressed positions are
      valid when the sequence has any real token.
    - `"convolution"` (memory-compressed attention, Liu et al. 2018):
      `K′ = Conv(K, W_c, size_r, stride)` with `size_r = stride` (non-overlapping windows), a
      1-D convolution along the length mixing all key/value channels; `V′` uses its own
      filters. `stride` is given, or `max_length / compressed_length`. The sequence is zero-
      padded to a multiple of `stride` (`n′ = ⌈S / stride⌉`); padding positions are zeroed
      first, and a compressed position is valid when any of its inputs was.
    - `"selection"`: "select the keys and values that are thought to be important", the
      importance of a key being measured by query-key dot products. Each query keeps the
      `n′ = compressed_length` keys of highest score `q·kᵀ·scale` among the keys it may
      attend to (by `top_k`, a static `n′`) and the others are masked. Keys tied with the
      `n′`-th score are all kept. The selection is a mask, so it reduces the keys attended
      to, not the cost of computing the scores.

    Causality: compressing along the length (`"projection"`, `"convolution"`) mixes every
    position, future ones included, into each compressed key, so these methods refuse
    `causal=True`, `use_causal_mask=True`, a KV cache and `cache_index`; they also refuse an
    `attention_mask` `[B, T, S]` (its key axis no longer exists) and the `position`, `biases`,
    `multiplier` and `pattern` hooks (the compressed keys have no positions). `"selection"`
    selects among the keys that the causal, padding and attention masks allow, so it is causal
    and supports cached decoding (token-by-token decoding equals the full causal pass), and it
    composes with every hook (the selection uses the rotated queries and keys).

    Args:
        num_heads: int, query heads.
        compressed_length: int `n′`, the number of keys kept (`"projection"`, `"selection"`;
            for `"convolution"` either it or `stride`), at most `max_length`.
        method: `"projection"` (default), `"convolution"` or `"selection"`.
        max_length: int `n`, the longest key/value sequence. Required by `"projection"`; for
            `"convolution"` without `stride`, `compressed_length` must divide it; optional for
            `"selection"` (checks `compressed_length <= max_length`).
        stride: int, window and step of the `"convolution"` method.
        compression_initializer: initializer of `Uᵏ, Uᵛ` or of the convolution filters.
        **kwargs: `MultiHeadAttention` arguments (`head_dim`, `num_key_value_heads`,
            `output_dim`, `use_bias`, `dropout`, `causal`, `scale`, hooks, initializers, …).

    Call arguments:
        As `MultiHeadAttention`: `query [B, T, d]`, `value`/`key [B, S, d_kv]` (cross-
        attention), `padding_mask [B, S]`, `attention_mask`, `use_causal_mask`, `cache`,
        `cache_index` (the last four only with `"selection"`), `return_attention_scores`,
        `training`.

    Returns:
        As `MultiHeadAttention`: `[B, T, output_dim]`, or `(outputs, new_cache)` with a cache;
        with `return_attention_scores=True`, one dict whose `"attention_scores"` are the
        float32 weights `[B, H, T, n′]` (`[B, H, T, S]` for `"selection"`).

    Example:
    >>> layer = CompressedAttention(num_heads=2, compressed_length=4, max_length=16)
    >>> y = layer(keras.random.normal((2, 16, 32)))  # (2, 16, 32), keys reduced to 4
    """

    masks_by_scores = True  # "selection" narrows the mask by the scores (`_select_keys`)

    def __init__(
        self,
        num_heads,
        compressed_length=None,
        method="projection",
        max_length=None,
        stride=None,
        compression_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(num_heads, **kwargs)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
        if compressed_length is not None:
            check_positive_int("compressed_length", compressed_length)
        if max_length is not None:
            check_positive_int("max_length", max_length)
        if stride is not None:
            check_positive_int("stride", stride)
            if method != "convolution":
                raise ValueError(
                    "stride is used by method='convolution' only. Received: "
                    f"stride={stride}, method={method!r}"
                )
        if method == "convolution":
            if stride is not None and compressed_length is not None:
                raise ValueError(
                    "method='convolution' takes either stride or compressed_length (with "
                    f"max_length). Received: stride={stride}, compressed_length={compressed_length}"
                )
            if stride is None and (compressed_length is None or max_length is None):
                raise ValueError(
                    "method='convolution' needs stride, or compressed_length and max_length. "
                    f"Received: stride=None, compressed_length={compressed_length}, "
                    f"max_length={max_length}"
                )
        elif compressed_length is None:
            raise ValueError(
                f"method={method!r} needs compressed_length. Received: compressed_length=None"
            )
        if method == "projection" and max_length is None:
            raise ValueError(
                "method='projection' needs max_length (the n of Uᵏ ∈ ℝ^{n′×n}). "
                "Received: max_length=None"
            )
        if compressed_length is not None and max_length is not None:
            if compressed_length > max_length:
                raise ValueError(
                    "compressed_length must be at most max_length. Received: "
                    f"compressed_length={compressed_length}, max_length={max_length}"
                )
            if method == "convolution" and max_length % compressed_length:
                raise ValueError(
                    "compressed_length must divide max_length when stride is not given. "
                    f"Received: compressed_length={compressed_length}, max_length={max_length}"
                )
        if method in _LENGTH_METHODS:
            if self.causal:
                raise ValueError(
                    f"method={method!r} compresses keys along the length, mixing future "
                    "positions into every compressed key, so it cannot be causal. "
                    "Received: causal=True"
                )
            hooks = {
                "position": self.position,
                "biases": self.biases or None,
                "multiplier": self.multiplier,
                "pattern": self.pattern,
            }
            for name, hook in hooks.items():
                if hook is not None:
                    raise ValueError(
                        f"method={method!r} leaves the compressed keys without positions, so "
                        f"it takes no {name} hook. Received: {name}={hook}"
                    )
        self.compressed_length = compressed_length
        self.method = method
        self.max_length = max_length
        self.stride = stride
        self.compression_initializer = get_initializer(
            "compression_initializer", compression_initializer
        )

    @property
    def window(self):
        """The stride (and window) of the `"convolution"` method."""
        if self.stride is not None:
            return self.stride
        return self.max_length // self.compressed_length

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        if self.method == "projection":
            shape = (self.compressed_length, self.max_length)
            for name in ("key", "value"):
                weight = self.add_weight(
                    shape=shape,
                    initializer=self._fresh_compression_initializer(),
                    name=f"{name}_compression",
                )
                setattr(self, f"{name}_compression", weight)
        elif self.method == "convolution":
            channels = self.num_key_value_heads * self.head_dim
            for name in ("key", "value"):
                kernel = self.add_weight(
                    shape=(self.window, channels, channels),
                    initializer=self._fresh_compression_initializer(),
                    name=f"{name}_compression_kernel",
                )
                setattr(self, f"{name}_compression", kernel)
                bias = None
                if self.use_bias:
                    bias = self.add_weight(
                        shape=(channels,), initializer="zeros", name=f"{name}_compression_bias"
                    )
                setattr(self, f"{name}_compression_bias", bias)

    def _fresh_compression_initializer(self):
        initializer = self.compression_initializer
        return initializer.__class__.from_config(initializer.get_config())

    # Reducing the keys and values along the length ------------------------------------------
    def _compress_keys_and_values(self, key, value, padding_mask):
        """`K′, V′` `[B, n′, Hkv, Dh]` of the projected keys and values `[B, S, Hkv, Dh]`
        (`"projection"`, `"convolution"`), padding positions zeroed first, and the padding
        mask of the compressed positions; the inputs unchanged for `"selection"`."""
        if self.method not in _LENGTH_METHODS:
            return key, value, padding_mask
        valid = None if padding_mask is None else ops.cast(padding_mask, "bool")
        return (self._compress(key, "key", valid), self._compress(value, "value", valid),
                None if valid is None else self._compressed_padding_mask(valid))

    def _compress(self, states, name, valid):
        """`[B, S, Hkv, Dh]` keys or values -> `[B, n′, Hkv, Dh]`."""
        if valid is not None:
            states = ops.where(valid[:, :, None, None], states, ops.zeros_like(states))
        weight = getattr(self, f"{name}_compression")
        if self.method == "projection":
            matrix = weight[:, : ops.shape(states)[1]]
            return ops.einsum("ms,bshd->bmhd", ops.cast(matrix, states.dtype), states)
        batch, length = ops.shape(states)[0], ops.shape(states)[1]
        heads, dim = states.shape[2], states.shape[3]
        states = ops.pad(states, ((0, 0), (0, (-length) % self.window), (0, 0), (0, 0)))
        windows = ops.reshape(states, (batch, -1, self.window, heads * dim))
        outputs = ops.einsum("bnrc,rcf->bnf", windows, ops.cast(weight, states.dtype))
        bias = getattr(self, f"{name}_compression_bias")
        if bias is not None:
            outputs = outputs + ops.cast(bias, outputs.dtype)
        return ops.reshape(outputs, (batch, -1, heads, dim))

    def _compressed_padding_mask(self, valid):
        """A compressed position is valid when any of the positions it reads was."""
        if self.method == "projection":
            any_valid = ops.any(valid, axis=1, keepdims=True)
            return ops.broadcast_to(any_valid, (ops.shape(valid)[0], self.compressed_length))
        return downsample_padding_mask(valid, self.window, self.window)

    # Selecting keys by score -----------------------------------------------------------------
    def _select_keys(self, q, k, mask):
        """`"selection"`: `mask` (the keys each query may attend to) narrowed to the
        `n′ = compressed_length` keys of highest score `q·kᵀ·scale` among them, ties kept."""
        key_length = k.shape[1]
        if self.method != "selection" or (
            key_length is not None and key_length <= self.compressed_length
        ):
            return mask  # every key is kept
        scores = ops.stop_gradient(attention_scores(q, k, self.scale))  # [B, H, T, S]
        lowest = lowest_value("float32")
        if mask is not None:
            scores = ops.where(mask, scores, lowest)
        candidates = scores
        if key_length is None:  # unknown length: pad so that top_k always has n′ entries
            pad = ((0, 0), (0, 0), (0, 0), (0, self.compressed_length))
            candidates = ops.pad(scores, pad, constant_values=lowest)
        threshold = ops.top_k(candidates, self.compressed_length)[0][..., -1:]
        return merge_masks(mask, ops.greater_equal(scores, threshold))

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
        training=None,
    ):
        causal = self.causal if use_causal_mask is None else use_causal_mask
        kwargs = dict(return_attention_scores=return_attention_scores, training=training)
        if self.method == "selection":
            return super().call(
                query, value, key, padding_mask=padding_mask, attention_mask=attention_mask,
                use_causal_mask=causal, cache=cache, cache_index=cache_index, **kwargs,
            )
        self._check_length_compression_call(query, value, attention_mask, causal, cache, cache_index)
        # Checked here, against the inputs: the attention sees the compressed mask.
        check_padding_mask(
            padding_mask, query if value is None else value,
            inputs_name="query" if value is None else "value",
        )
        return super().call(query, value, key, padding_mask=padding_mask, use_causal_mask=False,
                            **kwargs)

    def _check_length_compression_call(self, query, value, attention_mask, causal, cache, cache_index):
        method = self.method
        if causal:
            raise ValueError(
                f"method={method!r} compresses keys along the length, mixing future positions "
                "into every compressed key, so it cannot be causal. Received: use_causal_mask=True"
            )
        if cache is not None or cache_index is not None:
            raise ValueError(
                f"method={method!r} cannot decode with a KV cache (the compressed keys depend "
                f"on the whole sequence). Received: cache_index={cache_index}, "
                f"cache={'given' if cache is not None else None}"
            )
        if attention_mask is not None:
            raise ValueError(
                f"method={method!r} removes the key axis that an attention_mask [B, T, S] "
                "refers to; use padding_mask. Received: an attention_mask"
            )
        length = (query if value is None else value).shape[1]
        if self.max_length is not None and length is not None and length > self.max_length:
            raise ValueError(
                f"The key/value sequence is longer than max_length={self.max_length}. "
                f"Received: length {length}"
            )

    def _compressed_length_of(self, length):
        if self.method == "projection":
            return self.compressed_length
        if self.method == "convolution":
            return None if length is None else -(-length // self.window)
        return length

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "compressed_length": self.compressed_length,
                "method": self.method,
                "max_length": self.max_length,
                "stride": self.stride,
                "compression_initializer": keras.initializers.serialize(
                    self.compression_initializer
                ),
            }
        )
        return config
