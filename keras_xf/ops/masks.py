"""Boolean attention masks: causal, padding, and their merge (survey §2.6, §2.7).

All masks are boolean with `True` meaning "may attend". They are merged once into a single
mask broadcastable to `[batch, heads, query_length, key_length]`; they are never turned into
`-inf` arithmetic (see `masked_softmax`).
"""

from keras import ops


def causal_mask(query_length, key_length=None, offset=0):
    """Lower-triangular mask `M(i, j) = j <= i + offset` (survey §2.6).

    Query `i` sits at absolute position `offset + i` and may attend to every key at a
    position not after it. With a KV cache, `offset` is the cache index.

    Args:
        query_length: int, number of queries `T`.
        key_length: int, number of keys `S`; defaults to `query_length`.
        offset: int or scalar tensor, absolute position of the first query.

    Returns:
        Boolean tensor `[T, S]`.

    Example:
    >>> causal_mask(3)  # [[T, F, F], [T, T, F], [T, T, T]]
    """
    key_length = query_length if key_length is None else key_length
    query_positions = ops.arange(query_length, dtype="int32") + ops.cast(offset, "int32")
    key_positions = ops.arange(key_length, dtype="int32")
    return ops.greater_equal(query_positions[:, None], key_positions[None, :])


def padding_mask(token_ids, pad_token_id=0):
    """Marks real tokens: `True` where `token_ids != pad_token_id` (survey §2.7).

    Args:
        token_ids: integer tensor `[batch, length]`.
        pad_token_id: int, the padding id.

    Returns:
        Boolean tensor `[batch, length]`.
    """
    return ops.not_equal(token_ids, pad_token_id)


def key_padding_to_attention_mask(key_padding_mask):
    """Turns a key padding mask `[B, S]` into an attention mask `[B, 1, 1, S]`."""
    return ops.cast(key_padding_mask, "bool")[:, None, None, :]


def expand_attention_mask(mask):
    """Brings a mask of rank 2 (`[T, S]`), 3 (`[B, T, S]`) or 4 to rank 4 `[B|1, H|1, T, S]`."""
    mask = ops.cast(mask, "bool")
    rank = len(mask.shape)
    if rank == 2:
        return mask[None, None, :, :]
    if rank == 3:
        return mask[:, None, :, :]
    if rank == 4:
        return mask
    raise ValueError(
        "An attention mask must have rank 2 ([T, S]), 3 ([B, T, S]) or 4 ([B, H, T, S]). "
        f"Received: mask with shape {tuple(mask.shape)}"
    )


def merge_masks(*masks):
    """Logical AND of boolean masks, each brought to rank 4; `None` entries are skipped.

    Each mask may be rank 2 `[T, S]`, rank 3 `[B, T, S]` or rank 4 `[B, H, T, S]`.

    Returns:
        A boolean tensor broadcastable to `[B, H, T, S]`, or `None` when every input is `None`.
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = expand_attention_mask(mask)
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def zero_padded(values, padding_mask):
    """`values` `[B, n, ...]` with zeros at the positions that `padding_mask` `[B, n]` marks
    as padding (false)."""
    valid = ops.cast(padding_mask, "bool")
    for _ in range(len(values.shape) - 2):
        valid = valid[..., None]
    return ops.where(valid, values, ops.zeros_like(values))


def compressed_length(length, stride):
    """`⌈n / s⌉`, the length of a sequence of `n` positions downsampled with stride `s` (an
    int for a static `n`, a scalar tensor otherwise)."""
    return -(-length // stride)


def window_starts(length, kernel_size, stride):
    """Indices `[n′, k]` of the positions read by each of the `n′ = ⌈n / s⌉` windows of a
    strided convolution, window `i` covering `i·s … i·s + k − 1` (the sequence right-padded
    to `(n′ − 1)·s + k` positions)."""
    windows = compressed_length(length, stride)
    starts = ops.arange(windows, dtype="int32") * stride
    return starts[:, None] + ops.arange(kernel_size, dtype="int32")[None, :]


def downsample_padding_mask(padding_mask, kernel_size, stride):
    """A padding mask `[B, n]` downsampled to `[B, ⌈n / s⌉]`: a compressed position is real
    when any of the `k` positions its window covers is real (positions past the end are
    padding)."""
    valid = ops.cast(padding_mask, "bool")
    length = valid.shape[1] if isinstance(valid.shape[1], int) else ops.shape(valid)[1]
    windows = compressed_length(length, stride)
    extra = (windows - 1) * stride + kernel_size - length
    valid = ops.pad(valid, ((0, 0), (0, extra)), constant_values=False)
    return ops.any(ops.take(valid, window_starts(length, kernel_size, stride), axis=1), axis=-1)


def masked_mean(values, padding_mask=None):
    """`Σ_j m_j h_j / max(1, Σ_j m_j)` over the tokens of `values` `[B, T, d]`, in float32:
    the mean of the real tokens (`padding_mask` `[B, T]`, `None`: every token), `[B, d]`;
    zeros for a fully padded row."""
    values = ops.cast(values, "float32")
    if padding_mask is None:
        return ops.mean(values, axis=1)
    mask = ops.cast(padding_mask, "float32")[:, :, None]
    return ops.sum(values * mask, axis=1) / ops.maximum(ops.sum(mask, axis=1), 1.0)
