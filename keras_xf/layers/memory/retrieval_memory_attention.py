"""Retrieval memory: each query also attends to the top-p pairs of a memory of past positions
(survey §5.2.3)."""

import keras
from keras import ops

from keras_xf.layers.attention.compressed_attention import CompressedAttention
from keras_xf.layers.memory.memory_attention import MemoryAttention
from keras_xf.ops.checks import check_positive_int


@keras.saving.register_keras_serializable(package="keras_xf")
class RetrievalMemoryAttention(MemoryAttention):
    """Causal attention over the chunk, joined through a learned gate with attention over
    the `top_k` pairs retrieved from a memory of the `S` positions before it: a kNN memory
    (Wu et al. 2022, the Memorizing Transformer).

    Survey §5.2.3 ("Retrieval-based Methods"): past key-value pairs are kept in a store;
    each query `q` finds the set `Ω_p` of the `p` pairs whose keys score highest by the dot
    product `q·k`, and attends to `Ω_p` as in self-attention. With `x` the chunk `[T, d]` and
    `m` the memory `[S, d]` (this layer's inputs at the `S` positions before the chunk, held
    fixed),

        L   = Attention(x, causal)                       (local attention over the chunk)
        R_i = Att(q_i, Ω_p(q_i)),  Ω_p(q) = top-p of SG(m) by q·k   (retrieval)
        C   = L + σ(g) ⊙ (R − L)                          (g ∈ ℝ^d learned, 0 at the start)
        m′  = the last S positions of [m ; x]

    and `C = L` for a row whose memory holds no valid position yet. The retrieval is a
    `CompressedAttention(method="selection", compressed_length=top_k)` built with the local
    attention's heads, cross-attending from the chunk to the memory: the search is exact and
    inside the compiled graph (`top_k` over the `S` scores of each query), and the memory
    enters with no positions (its keys are not rotated), as in the Memorizing Transformer.
    The memory holds layer inputs, whose keys and values are computed with the current
    weights at each call (`O(S·d²)` a chunk).

    The memory is carried as `MemoryAttention`'s is (this layer is one, with another way of
    reading it): explicitly (`memory`, `memory_mask` in, `return_memory=True` returns the
    next ones), or in non-trainable variables (`stateful=True`, a fixed `batch_size`)
    carried by `fit`, `predict` and `evaluate` across the batches of a stream, emptied by
    `reset_memory()`, `reset_memories(model)` or the per-row `reset` argument. Decoding
    (`init_cache`) takes a copy of the memory into the cache, retrieves from it at every step
    and leaves the memory as it was.

    Args:
        attention: a `MultiHeadAttention` (or its config), the local attention, always called
            causally.
        memory_length: int `S > 0`, positions kept in the memory.
        top_k: int `p > 0`, pairs retrieved for each query, at most `S`.
        stateful: bool, keep the memory in variables between calls.
        batch_size: int, the batch of every call when `stateful`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `MemoryAttention`, with `cache` the `(attention_cache, memory, memory_mask)` of
        `init_cache` and `cache_index` the position of the first token in it.

    Returns:
        `[B, T, d]`, `(outputs, new_cache)` with a cache, or with `return_memory=True` the
        dict `{"outputs", "memory", "memory_mask"}`.

    Example:
    >>> layer = RetrievalMemoryAttention(MultiHeadAttention(num_heads=2), memory_length=8,
    ...                                  top_k=2)
    >>> state = layer(keras.random.normal((2, 4, 8)), return_memory=True)
    >>> y = layer(keras.random.normal((2, 4, 8)), memory=state["memory"],
    ...           memory_mask=state["memory_mask"])  # (2, 4, 8)
    """

    no_attention_mask = "the memory is searched as a whole; use padding_mask and memory_mask"

    @property
    def cache_is_rolling(self):
        """The local attention's cache is the one decoding writes in order."""
        return self.attention.cache_is_rolling

    def __init__(self, attention, memory_length, top_k, stateful=False, batch_size=None,
                 **kwargs):
        super().__init__(attention, memory_length, stateful=stateful, batch_size=batch_size,
                         **kwargs)
        check_positive_int("top_k", top_k)
        if top_k > memory_length:
            raise ValueError(
                "top_k pairs are retrieved from the memory_length positions of the memory: "
                f"it is at most memory_length. Received: top_k={top_k}, "
                f"memory_length={memory_length}"
            )
        self.top_k = top_k
        self.retrieval = CompressedAttention(
            num_heads=self.attention.num_heads, head_dim=self.attention.head_dim,
            num_key_value_heads=self.attention.num_key_value_heads,
            output_dim=self.attention.output_dim, use_bias=self.attention.use_bias,
            method="selection", compressed_length=top_k, dtype=self.dtype_policy,
            name="retrieval")

    def build(self, inputs_shape):
        super().build(inputs_shape)
        shape = (inputs_shape[0], None, self.input_dim)
        self.retrieval.build(shape, shape)
        self.gate = self.add_weight(shape=(self.input_dim,), initializer="zeros", name="gate")

    def init_cache(self, batch_size, max_length, dtype=None):
        """The decoding cache `(attention_cache, memory [B, S, d], memory_mask [B, S])`: the
        local attention's cache and a copy of the current memory (the variables of a stateful
        layer; an empty memory otherwise), which decoding retrieves from and leaves as it
        is."""
        self.check_cache_ready()
        if self.stateful and batch_size != self.batch_size:
            raise ValueError(
                f"A stateful RetrievalMemoryAttention decodes its {self.batch_size} rows of "
                f"memory: generate {self.batch_size} prompts at a time. Received: "
                f"batch_size={batch_size}"
            )
        memory, memory_mask = self._current_memory(None, None, batch_size)
        dtype = dtype or self.compute_dtype
        return (self.attention.init_cache(batch_size, max_length, dtype),
                ops.cast(memory, dtype), memory_mask)

    def call(self, inputs, padding_mask=None, memory=None, memory_mask=None, reset=None,
             use_causal_mask=None, cache=None, cache_index=None, return_memory=False,
             training=None):
        batch, length = self._check_call(inputs, padding_mask, memory, memory_mask, reset,
                                         use_causal_mask)
        if cache is not None:
            return self._decode_with_retrieval(inputs, padding_mask, memory, reset,
                                               return_memory, cache, cache_index, training)
        memory, memory_mask = self._current_memory(memory, memory_mask, batch)
        if reset is not None:
            memory_mask = ops.logical_and(memory_mask,
                                          ops.logical_not(ops.cast(reset, "bool"))[:, None])
        local = self.attention(inputs, padding_mask=padding_mask, use_causal_mask=True,
                               training=training)
        # One new tensor holds the memory and the chunk: the retrieval reads its first `S`
        # rows, not the variable that the assignment below overwrites (on PyTorch, in place,
        # while the backward pass still needs the memory).
        extended = ops.stop_gradient(
            ops.concatenate([ops.cast(memory, inputs.dtype), inputs], axis=1))
        outputs = self._join(inputs, local, extended[:, :self.memory_length], memory_mask,
                             training)
        if padding_mask is None:
            padding_mask = ops.ones((batch, length), "bool")
        next_memory = extended[:, -self.memory_length:]
        next_mask = ops.concatenate([memory_mask, ops.cast(padding_mask, "bool")],
                                    axis=1)[:, -self.memory_length:]
        if self.stateful:
            self.memory.assign(ops.cast(next_memory, "float32"))
            self.memory_mask.assign(ops.cast(next_mask, "float32"))
        if return_memory:
            return {"outputs": outputs, "memory": next_memory, "memory_mask": next_mask}
        return outputs

    def _decode_with_retrieval(self, inputs, padding_mask, memory, reset, return_memory,
                               cache, cache_index, training):
        for name, value in (("memory", memory), ("reset", reset),
                            ("return_memory", return_memory or None)):
            if value is not None:
                raise ValueError(
                    "A cached RetrievalMemoryAttention call retrieves from the memory in its "
                    f"cache (init_cache) and takes no {name}. Received: {name}={value!r}"
                )
        attention_cache, memory, memory_mask = cache
        local, attention_cache = self.attention(
            inputs, padding_mask=padding_mask, use_causal_mask=True, cache=attention_cache,
            cache_index=cache_index, training=training)
        outputs = self._join(inputs, local, memory, memory_mask, training)
        return outputs, (attention_cache, memory, memory_mask)

    def _join(self, inputs, local, memory, memory_mask, training):
        """`L + σ(g) ⊙ (R − L)` where the row's memory holds a valid position, `L` elsewhere."""
        retrieved = self.retrieval(inputs, value=memory, padding_mask=memory_mask,
                                   training=training)
        found = ops.cast(ops.any(memory_mask, axis=1), local.dtype)[:, None, None]
        gate = ops.cast(ops.sigmoid(self.gate), local.dtype)
        return local + found * gate * (retrieved - local)

    def get_config(self):
        config = super().get_config()
        config["top_k"] = self.top_k
        return config
