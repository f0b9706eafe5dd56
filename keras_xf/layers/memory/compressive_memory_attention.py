"""A local memory joined with a long-term memory of older positions, pooled (survey §5.2.2)."""

import keras
from keras import ops

from keras_xf.layers.memory.memory_attention import MemoryAttention
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_state

COMPRESSIONS = ("mean", "max", "running_mean")


@keras.saving.register_keras_serializable(package="keras_xf")
class CompressiveMemoryAttention(MemoryAttention):
    """Transformer-XL's local memory of `M` positions, and behind it a long-term memory of `N`
    slots that encodes the positions the local memory has let go, so that the whole history
    of the stream stays within reach at a fixed cost (Rae et al. 2019; Zhang et al. 2018).

    Survey §5.2.2 ("Encoding Long-term Memory"), with the combination of a cache-based
    short-term memory and a long-term memory that its last paragraph describes. With `x` the
    chunk `[T, d]`, `m` the local memory `[M, d]` and `c` the long-term memory `[N, d]`,

        h̃  = [SG(c) ; SG(m) ; x]                    (N + M + T positions)
        C   = MultiHeadAttention(h̃, causal)[N + M:]  (the chunk's T positions)
        m′  = [m ; x][T:]                            (the last M positions, as MemoryAttention)
        e   = [m ; x][:T]                            (the T positions m′ lets go)

    and the long-term memory takes in `e` by one of the `compression` rules:
    - `"mean"` or `"max"`: the compressive memory. `e` is pooled over groups of
      `compression_rate` positions (the last group shorter when `T` is not a multiple of
      it) into `⌈T / compression_rate⌉` slots, appended to `c`; `c′` keeps the latest `N`
      slots, so the oldest compressed slots are dropped and nothing raw is.
    - `"running_mean"`: one slot (`N = 1`) holding the average of every position let go so
      far, the survey's `k̄ = (1/(i−1)) Σ_j k_j` and `v̄` of eqs. (average-attention-k/v),
      updated incrementally as its recursive form `k̄[i] = KMem(k̄[i−1], k_{i−1})` with a
      weighted sum: `c′ = (n·c + Σ_{valid e} e) / (n + |valid e|)`, `n′ = n + |valid e|`.

    The memories hold this layer's inputs; the attention computes their keys and values
    with its own projections, which are affine, so the key and value of an averaged slot are
    the average of the keys and values of the positions it pools (exactly, when the
    attention's position hook does not rotate keys). Window positions run over
    `[0, N + M + T)` as in `MemoryAttention`. Each slot carries a count, the number of valid
    positions pooled into it: a slot with count 0 is masked out, and padded or empty
    positions never enter an average.

    The memories are carried as in `MemoryAttention`: explicitly (`memory`, `memory_mask`,
    `compressed`, `compressed_count` in; `return_memory=True` returns the next ones), or in
    non-trainable variables (`stateful=True`) that `fit`, `predict` and `evaluate` carry
    across the batches of a stream, emptied by `reset_memory()`, `reset_memories(model)` or
    the per-row `reset` argument. Decoding reads `[c ; m]` from its cache and leaves both
    memories unchanged.

    Args:
        attention: a `MultiHeadAttention` (or its config), always called causally.
        memory_length: int `M > 0`, raw positions in the local memory.
        compressed_length: int `N > 0`, slots in the long-term memory (`1` with
            `"running_mean"`).
        compression: `"mean"`, `"max"` or `"running_mean"`, how positions let go by the
            local memory enter the long-term memory.
        compression_rate: int, positions pooled into one slot by `"mean"` and `"max"`
            (`1` with `"running_mean"`, which pools every position into its one slot).
        stateful: bool, keep both memories in variables between calls.
        batch_size: int, the batch of every call when `stateful`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `MemoryAttention`, and
        compressed: `[B, N, d]`, the long-term memory (not with `stateful`); `None`: empty.
        compressed_count: float `[B, N]`, the positions pooled into each slot (default: one
            each, when `compressed` is given).

    Returns:
        `[B, T, d]`, `(outputs, new_cache)` with a cache, or with `return_memory=True` the
        dict `{"outputs", "memory", "memory_mask", "compressed", "compressed_count"}`.

    Example:
    >>> layer = CompressiveMemoryAttention(MultiHeadAttention(num_heads=2), memory_length=4,
    ...                                    compressed_length=2, compression_rate=2)
    >>> state = layer(keras.random.normal((2, 4, 8)), return_memory=True)
    >>> y = layer(keras.random.normal((2, 4, 8)), memory=state["memory"],
    ...           memory_mask=state["memory_mask"], compressed=state["compressed"],
    ...           compressed_count=state["compressed_count"])  # (2, 4, 8)
    """

    def __init__(self, attention, memory_length, compressed_length, compression="mean",
                 compression_rate=1, stateful=False, batch_size=None, **kwargs):
        super().__init__(attention, memory_length, stateful=stateful, batch_size=batch_size,
                         **kwargs)
        check_positive_int("compressed_length", compressed_length)
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}. Received: "
                             f"compression={compression!r}")
        check_positive_int("compression_rate", compression_rate)
        if compression == "running_mean" and (compressed_length, compression_rate) != (1, 1):
            raise ValueError(
                "compression='running_mean' averages every position let go into one slot: it "
                "takes compressed_length=1 and compression_rate=1. Received: "
                f"compressed_length={compressed_length}, compression_rate={compression_rate}"
            )
        self.compressed_length = compressed_length
        self.compression = compression
        self.compression_rate = compression_rate

    @property
    def prefix_length(self):
        """Positions before the chunk in the attention's window: `N + M`."""
        return self.compressed_length + self.memory_length

    def build(self, inputs_shape):
        super().build(inputs_shape)
        self.compressed = self.compressed_count = None
        if self.stateful:
            shape = (self.batch_size, self.compressed_length)
            self.compressed = self.add_weight(
                shape=shape + (self.input_dim,), initializer="zeros", trainable=False,
                dtype="float32", name="compressed")
            self.compressed_count = self.add_weight(
                shape=shape, initializer="zeros", trainable=False, dtype="float32",
                name="compressed_count")

    def reset_memory(self):
        """Empties both memories of a stateful layer (every row)."""
        super().reset_memory()
        self.compressed.assign(ops.zeros(self.compressed.shape, "float32"))
        self.compressed_count.assign(ops.zeros(self.compressed_count.shape, "float32"))

    def decoding_prefix(self, batch_size):
        """`[c ; m]` and its mask: the long-term memory's valid slots, then the local memory."""
        memory, memory_mask = self._current_memory(None, None, batch_size)
        compressed, count = self._current_compressed(None, None, batch_size)
        return (ops.concatenate([ops.cast(compressed, memory.dtype), memory], axis=1),
                ops.concatenate([count > 0, memory_mask], axis=1))

    def _current_compressed(self, compressed, count, batch):
        if self.stateful:
            return self.compressed, self.compressed_count
        shape = (batch, self.compressed_length)
        if compressed is None:
            return ops.zeros(shape + (self.input_dim,), "float32"), ops.zeros(shape, "float32")
        if count is None:
            count = ops.ones(shape, "float32")
        return ops.cast(compressed, "float32"), ops.cast(count, "float32")

    def call(self, inputs, padding_mask=None, memory=None, memory_mask=None, compressed=None,
             compressed_count=None, reset=None, use_causal_mask=None, cache=None,
             cache_index=None, return_memory=False, training=None):
        batch, length = self._check_call(inputs, padding_mask, memory, memory_mask, reset,
                                         use_causal_mask)
        self._check_compressed(inputs, compressed, compressed_count, cache)
        if cache is not None:
            return self._decode(inputs, padding_mask, memory, reset, return_memory, cache,
                                cache_index, training)
        memory, memory_mask = self._current_memory(memory, memory_mask, batch)
        compressed, count = self._current_compressed(compressed, compressed_count, batch)
        if reset is not None:
            keep = ops.logical_not(ops.cast(reset, "bool"))[:, None]
            memory_mask = ops.logical_and(memory_mask, keep)
            count = count * ops.cast(keep, "float32")
        if padding_mask is None:
            padding_mask = ops.ones((batch, length), "bool")
        raw = ops.concatenate([ops.stop_gradient(ops.cast(memory, inputs.dtype)), inputs],
                              axis=1)
        raw_mask = ops.concatenate([memory_mask, ops.cast(padding_mask, "bool")], axis=1)
        window = ops.concatenate(
            [ops.stop_gradient(ops.cast(compressed, inputs.dtype)), raw], axis=1)
        window_mask = ops.concatenate([count > 0, raw_mask], axis=1)
        outputs = self.attention(window, padding_mask=window_mask, use_causal_mask=True,
                                 training=training)[:, self.prefix_length:]
        next_memory = ops.stop_gradient(raw[:, -self.memory_length:])
        next_mask = raw_mask[:, -self.memory_length:]
        next_compressed, next_count = self.compress(
            compressed, count, ops.stop_gradient(raw[:, :length]), raw_mask[:, :length])
        if self.stateful:
            self.memory.assign(ops.cast(next_memory, "float32"))
            self.memory_mask.assign(ops.cast(next_mask, "float32"))
            self.compressed.assign(next_compressed)
            self.compressed_count.assign(next_count)
        if return_memory:
            return {"outputs": outputs, "memory": next_memory, "memory_mask": next_mask,
                    "compressed": next_compressed, "compressed_count": next_count}
        return outputs

    def compress(self, compressed, count, evicted, evicted_mask):
        """The next long-term memory and counts (float32) from the current ones and the
        positions `evicted [B, T, d]` (valid where `evicted_mask`) that the local memory lets
        go."""
        states = ops.cast(evicted, "float32")
        weights = ops.cast(evicted_mask, "float32")
        if self.compression == "running_mean":
            added = ops.sum(weights, axis=1, keepdims=True)
            total = count + added
            summed = ops.einsum("bt,btd->bd", weights, states)[:, None]
            mean = (compressed * count[..., None] + summed) / ops.maximum(total, 1.0)[..., None]
            return mean, total
        batch, width = ops.shape(states)[0], self.input_dim
        extra = (-ops.shape(states)[1]) % self.compression_rate  # a last, shorter group
        states = ops.pad(states, [[0, 0], [0, extra], [0, 0]])
        weights = ops.pad(weights, [[0, 0], [0, extra]])
        groups = ops.reshape(states, (batch, -1, self.compression_rate, width))
        group_weights = ops.reshape(weights, (batch, -1, self.compression_rate))
        pooled_count = ops.sum(group_weights, axis=2)
        if self.compression == "mean":
            pooled = (ops.einsum("bgr,bgrd->bgd", group_weights, groups)
                      / ops.maximum(pooled_count, 1.0)[..., None])
        else:
            valid = group_weights[..., None] > 0
            pooled = ops.max(ops.where(valid, groups, ops.full_like(groups, -3.0e38)), axis=2)
            pooled = ops.where(pooled_count[..., None] > 0, pooled, ops.zeros_like(pooled))
        keep = self.compressed_length
        return (ops.concatenate([compressed, pooled], axis=1)[:, -keep:],
                ops.concatenate([count, pooled_count], axis=1)[:, -keep:])

    def _check_compressed(self, inputs, compressed, compressed_count, cache):
        batch = inputs.shape[0]
        given = {"compressed": compressed, "compressed_count": compressed_count}
        for name, value in given.items():
            if value is None:
                continue
            if cache is not None or self.stateful:
                raise ValueError(
                    f"{name} is the long-term memory of a call without a cache and of a layer "
                    "with stateful=False (the others keep it in their cache or variables). "
                    f"Received: {name}.shape={tuple(value.shape)}, stateful={self.stateful}, "
                    f"cache given: {cache is not None}"
                )
        if compressed_count is not None and compressed is None:
            raise ValueError(
                "compressed_count counts the slots of a long-term memory: give compressed with "
                f"it. Received: compressed=None, compressed_count.shape="
                f"{tuple(compressed_count.shape)}"
            )
        if compressed is not None:
            check_state(compressed, "compressed",
                        (batch, self.compressed_length, self.input_dim))
        if compressed_count is not None:
            check_state(compressed_count, "compressed_count", (batch, self.compressed_length))

    def compute_output_spec(self, inputs, *args, cache=None, return_memory=False, **kwargs):
        spec = super().compute_output_spec(inputs, *args, cache=cache,
                                           return_memory=return_memory, **kwargs)
        if cache is not None or not return_memory:
            return spec
        shape = (inputs.shape[0], self.compressed_length)
        return {**spec, "compressed": keras.KerasTensor(shape + (inputs.shape[-1],), "float32"),
                "compressed_count": keras.KerasTensor(shape, "float32")}

    def get_config(self):
        config = super().get_config()
        config.update({"compressed_length": self.compressed_length,
                       "compression": self.compression,
                       "compression_rate": self.compression_rate})
        return config
