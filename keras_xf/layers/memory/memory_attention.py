"""Transformer-XL chunk recurrence: attention over a memory of the previous chunk (survey §5.2.1)."""

import keras
from keras import ops

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import serialize_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import check_state


@keras.saving.register_keras_serializable(package="keras_xf")
class MemoryAttention(SequenceMixer):
    """Causal self-attention whose keys and values also cover a memory of the `M` positions
    before the chunk: Transformer-XL's recurrence across chunks (Dai et al. 2019).

    Survey §5.2.1 ("Cache-based Memory"): a long sequence is processed chunk by chunk, and
    each position of `chunk_k` attends to its predecessors in `chunk_k` and in the memory
    `m` (the inputs of this layer at the end of `chunk_{k−1}`, held fixed: no gradient flows
    into them). With `x` the chunk `[T, d]` and `m` the memory `[M, d]`,

        h̃ = [SG(m) ; x]                                   (M + T positions)
        C  = MultiHeadAttention(h̃, causal)[M:]             (the chunk's T positions)
        m′ = h̃[−M:]                                        (the memory of the next chunk)

    so query `i` of the chunk sees the `M` memory positions and chunk positions `≤ i`. The
    keys and values of the memory are computed again from `m` with the current weights, as
    in Transformer-XL; positions are those of the window `[0, M + T)`, so a relative
    position hook of the attention (`RotaryEmbedding`, `RelativePositionBias`, ALiBi) scores
    every pair as in one pass over the whole sequence. For a single layer, a pass over
    chunks with `M = T` equals one pass over the sequence in which each position attends to
    its own chunk and the previous one (`tests/layers/memory`).

    The memory is carried in one of two ways:
    - **explicitly**: `memory [B, M, d]` and `memory_mask [B, M]` are call arguments, and
      `return_memory=True` returns the next ones (`{"outputs", "memory", "memory_mask"}`);
    - **statefully** (`stateful=True`, a fixed `batch_size`): the layer keeps the memory in
      two non-trainable variables, reads them at each call and writes the next memory back,
      so that consecutive batches of a stream (row `b` of each batch continuing row `b` of
      the previous one) carry it through `fit`, `predict` and `evaluate` on every backend.
      `reset_memory()` empties it; the call argument `reset [B]` (boolean, `True` where a
      row starts a new document) empties it for those rows only, inside compiled functions.
    Positions that the padding mask leaves out enter the memory as invalid positions.

    Decoding (`init_cache`, then calls with `cache` and `cache_index`) continues from the
    memory: the cache holds the memory's keys and values before the decoded positions, and
    the memory itself is left as it was. A `CausalLM` of these blocks generates with the
    cache (`use_cache=False` is refused for a stateful layer, whose every full pass would
    advance the memory).

    Args:
        attention: a `MultiHeadAttention` (or its config) for self-attention: the scores,
            heads, position hooks and patterns of the layer. It is always called causally.
        memory_length: int `M > 0`, positions kept in the memory.
        stateful: bool, keep the memory in variables between calls.
        batch_size: int, the batch of every call when `stateful`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`, the chunk.
        padding_mask: boolean `[B, T]`.
        memory: `[B, M, d]`, the previous chunk's memory (not with `stateful`); `None`: an
            empty memory.
        memory_mask: boolean `[B, M]`, `True` for valid memory positions (default: all,
            when `memory` is given).
        reset: boolean `[B]`, `True` for rows whose memory is emptied before this chunk.
        use_causal_mask: `None` or `True` (the recurrence is causal).
        cache: the `(attention_cache, memory_mask)` of `init_cache`, for decoding.
        cache_index: int or scalar tensor, the position of the first token after the memory.
        return_memory: bool, also return the next memory.
        training: bool.

    Returns:
        `[B, T, d]`, `(outputs, new_cache)` with a cache, or with `return_memory=True` the dict `{"outputs": [B, T, d],
        "memory": [B, M, d], "memory_mask": [B, M]}`.

    Example:
    >>> layer = MemoryAttention(MultiHeadAttention(num_heads=2), memory_length=4)
    >>> result = layer(keras.random.normal((2, 4, 8)), return_memory=True)
    >>> y = layer(keras.random.normal((2, 4, 8)), memory=result["memory"])  # (2, 4, 8)
    """

    causal = True
    no_attention_mask = "the memory's mask is causal; use padding_mask and memory_mask"

    def __init__(self, attention, memory_length, stateful=False, batch_size=None, **kwargs):
        super().__init__(**kwargs)
        self.attention = with_dtype_policy(
            as_layer(attention, "attention", kind=MultiHeadAttention), self.dtype_policy)
        check_positive_int("memory_length", memory_length)
        check_bool("stateful", stateful)
        if stateful:
            check_positive_int("batch_size", batch_size)
        elif batch_size is not None:
            raise ValueError(
                "batch_size is the batch of the memory variables and needs stateful=True. "
                f"Received: batch_size={batch_size!r}, stateful=False"
            )
        self.memory_length = memory_length
        self.stateful = stateful
        self.batch_size = batch_size
        self.supports_masking = True

    @property
    def carries_memory(self):
        """Whether calls without a cache advance a memory kept in variables (`stateful`)."""
        return self.stateful

    def build(self, inputs_shape):
        width = self.check_inputs_shape(inputs_shape)
        if not self.attention.built:
            self.attention.build((inputs_shape[0], None, width))
        self.memory = self.memory_mask = None
        if self.stateful:
            shape = (self.batch_size, self.memory_length)
            self.memory = self.add_weight(shape=shape + (width,), initializer="zeros",
                                          trainable=False, dtype="float32", name="memory")
            self.memory_mask = self.add_weight(shape=shape, initializer="zeros",
                                               trainable=False, dtype="float32",
                                               name="memory_mask")
        self.built = True

    def reset_memory(self):
        """Empties the memory of a stateful layer (every row)."""
        if not self.stateful:
            raise ValueError(
                "reset_memory empties the memory variables of a stateful layer; this layer "
                "takes its memory as a call argument. Received: stateful=False"
            )
        self.memory.assign(ops.zeros(self.memory.shape, "float32"))
        self.memory_mask.assign(ops.zeros(self.memory_mask.shape, "float32"))

    @property
    def prefix_length(self):
        """Positions before the chunk in the attention's window: the memory's `M`."""
        return self.memory_length

    def decoding_prefix(self, batch_size):
        """The states `[B, P, d]` and boolean mask `[B, P]` (`P = prefix_length`) whose keys
        and values decoding reads before its own positions: the current memory."""
        return self._current_memory(None, None, batch_size)

    def init_cache(self, batch_size, max_length, dtype=None):
        """The decoding cache `(attention_cache, prefix_mask [B, P])`: the attention's cache
        over `P + max_length` positions (`P = prefix_length`), whose first `P` hold the keys
        and values of the current memory (the variables of a stateful layer; an empty memory
        otherwise), so that decoding continues from it. Decoding reads the memory and leaves
        it as it is."""
        self.check_cache_ready()
        if self.attention.cache_is_rolling:
            raise ValueError(
                f"{type(self).__name__} decodes with the attention's full cache: a pattern "
                "with a rolling cache keeps no room for the memory. Received: pattern="
                f"{type(self.attention.pattern).__name__}"
            )
        if self.stateful and batch_size != self.batch_size:
            raise ValueError(
                f"A stateful {type(self).__name__} decodes its {self.batch_size} rows of memory: "
                f"generate {self.batch_size} prompts at a time (batch_size={self.batch_size}). "
                f"Received: batch_size={batch_size}"
            )
        prefix, prefix_mask = self.decoding_prefix(batch_size)
        cache = self.attention.init_cache(batch_size, self.prefix_length + max_length, dtype)
        _, cache = self.attention(ops.cast(prefix, dtype or self.compute_dtype),
                                  use_causal_mask=True, cache=cache, cache_index=0)
        return cache, prefix_mask

    def _current_memory(self, memory, memory_mask, batch):
        if self.stateful:
            memory, memory_mask = self.memory, self.memory_mask
        elif memory is None:
            memory = ops.zeros((batch, self.memory_length, self.input_dim))
            memory_mask = ops.zeros((batch, self.memory_length), "bool")
        if memory_mask is None:
            memory_mask = ops.ones((batch, self.memory_length), "bool")
        return memory, ops.cast(memory_mask, "bool")

    def call(self, inputs, padding_mask=None, memory=None, memory_mask=None, reset=None,
             use_causal_mask=None, cache=None, cache_index=None, return_memory=False,
             training=None):
        batch, length = self._check_call(inputs, padding_mask, memory, memory_mask, reset,
                                         use_causal_mask)
        if cache is not None:
            return self._decode(inputs, padding_mask, memory, reset, return_memory, cache,
                                cache_index, training)
        memory, memory_mask = self._current_memory(memory, memory_mask, batch)
        if reset is not None:
            memory_mask = ops.logical_and(memory_mask,
                                          ops.logical_not(ops.cast(reset, "bool"))[:, None])
        if padding_mask is None:
            padding_mask = ops.ones((batch, length), "bool")
        window = ops.concatenate(
            [ops.stop_gradient(ops.cast(memory, inputs.dtype)), inputs], axis=1)
        window_mask = ops.concatenate([memory_mask, ops.cast(padding_mask, "bool")], axis=1)
        outputs = self.attention(window, padding_mask=window_mask, use_causal_mask=True,
                                 training=training)[:, self.memory_length:]
        next_memory = ops.stop_gradient(window[:, -self.memory_length:])
        next_mask = window_mask[:, -self.memory_length:]
        if self.stateful:
            self.memory.assign(ops.cast(next_memory, "float32"))
            self.memory_mask.assign(ops.cast(next_mask, "float32"))
        if return_memory:
            return {"outputs": outputs, "memory": next_memory, "memory_mask": next_mask}
        return outputs

    def _decode(self, inputs, padding_mask, memory, reset, return_memory, cache, cache_index,
                training):
        """A cached call at `cache_index` (positions after the prefix's `P`): the chunk's
        keys attend to the prefix slots its mask keeps and, causally, to the positions
        written before."""
        for name, value in (("padding_mask", padding_mask), ("memory", memory),
                            ("reset", reset), ("return_memory", return_memory or None)):
            if value is not None:
                raise ValueError(
                    f"A cached {type(self).__name__} call decodes from the memory in its cache "
                    f"(init_cache) and takes no {name}. Received: {name}={value!r}"
                )
        if cache_index is None:
            raise ValueError(f"A cached {type(self).__name__} call needs cache_index, the "
                             "position of its first token after the memory. Received: "
                             "cache_index=None")
        attention_cache, prefix_mask = cache
        batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        keys = ops.shape(attention_cache[0])[2] - self.prefix_length
        keep = ops.concatenate([
            ops.broadcast_to(ops.cast(prefix_mask, "bool")[:, None, :],
                             (batch, length, self.prefix_length)),
            ops.ones((batch, length, keys), "bool")], axis=-1)
        outputs, attention_cache = self.attention(
            inputs, attention_mask=keep, use_causal_mask=True, cache=attention_cache,
            cache_index=cache_index + self.prefix_length, training=training)
        return outputs, (attention_cache, prefix_mask)

    def _check_call(self, inputs, padding_mask, memory, memory_mask, reset, use_causal_mask):
        check_sequence_width(inputs, self.input_dim)
        check_padding_mask(padding_mask, inputs)
        batch, length = inputs.shape[0], inputs.shape[1]
        if use_causal_mask is not None and not use_causal_mask:
            raise ValueError(
                f"{type(self).__name__} is causal: the memory holds the positions before the "
                f"chunk. Received: use_causal_mask={use_causal_mask!r}"
            )
        if self.stateful:
            if memory is not None or memory_mask is not None:
                raise ValueError(
                    f"A stateful {type(self).__name__} keeps its memory in variables; give "
                    "memory and memory_mask only with stateful=False. Received: memory="
                    f"{None if memory is None else tuple(memory.shape)}, memory_mask="
                    f"{None if memory_mask is None else tuple(memory_mask.shape)}"
                )
            if batch is not None and batch != self.batch_size:
                raise ValueError(
                    f"A stateful {type(self).__name__} takes batches of "
                    f"batch_size={self.batch_size} (row b of each batch continues row b of the "
                    f"last one). Received: inputs.shape={tuple(inputs.shape)}"
                )
        if memory_mask is not None and memory is None:
            raise ValueError("memory_mask describes a memory: give memory with it. Received: "
                             f"memory=None, memory_mask.shape={tuple(memory_mask.shape)}")
        if memory is not None:
            check_state(memory, "memory", (batch, self.memory_length, self.input_dim))
        if memory_mask is not None:
            check_state(memory_mask, "memory_mask", (batch, self.memory_length))
        if reset is not None:
            check_state(reset, "reset", (batch,))
        return batch if batch is not None else ops.shape(inputs)[0], (
            length if length is not None else ops.shape(inputs)[1])

    def compute_output_spec(self, inputs, *args, cache=None, return_memory=False, **kwargs):
        outputs = keras.KerasTensor(tuple(inputs.shape), dtype=self.compute_dtype)
        if cache is not None:
            return outputs, new_specs(cache)
        if not return_memory:
            return outputs
        shape = (inputs.shape[0], self.memory_length)
        return {"outputs": outputs,
                "memory": keras.KerasTensor(shape + (inputs.shape[-1],), self.compute_dtype),
                "memory_mask": keras.KerasTensor(shape, "bool")}

    def get_config(self):
        config = super().get_config()
        config.update({"attention": serialize_layer(self.attention),
                       "memory_length": self.memory_length, "stateful": self.stateful,
                       "batch_size": self.batch_size})
        return config
