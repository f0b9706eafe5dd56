"""Block-sparse attention for banded attention fields: memory O(n·w), not O(n²) (survey §5.1).

Survey §5.1 computes sparse attention "only for pairs with non-zero attention weights". For
fields that lie inside a band around the diagonal (local, chunked and strided attention) the
sequence is split into blocks of `block_size` positions; query block `q` attends to the key
blocks `q + o` for the few offsets `o` that cover its field, and an in-block mask built from
absolute positions keeps exactly the field. Every shape is static: the key blocks are static
slices of the zero-padded block tensor, so no `[n, n]` tensor exists anywhere and the scores
take `B · H · n · (len(offsets) · block_size)` floats.
"""

import math

import keras
from keras import ops

from keras_xf.ops.attention import masked_softmax


def _shifted_blocks(blocks, offsets, axis=1):
    """Concatenates, along `axis + 1`, the blocks `q + o` (zero blocks outside the sequence)
    for each offset `o`, for every block `q` along `axis`."""
    left = max(0, -min(offsets))
    right = max(0, max(offsets))
    num_blocks = blocks.shape[axis]
    padding = [(0, 0)] * len(blocks.shape)
    padding[axis] = (left, right)
    padded = ops.pad(blocks, padding) if left or right else blocks
    pieces = []
    for offset in offsets:
        index = [slice(None)] * len(blocks.shape)
        index[axis] = slice(left + offset, left + offset + num_blocks)
        pieces.append(padded[tuple(index)])
    return pieces[0] if len(pieces) == 1 else ops.concatenate(pieces, axis=axis + 1)


def block_sparse_attention(
    query,
    key,
    value,
    *,
    field,
    block_size,
    block_offsets,
    padding_mask=None,
    causal=False,
    scale=None,
    dropout_rate=0.0,
    training=False,
    seed_generator=None,
):
    """`Softmax(q·kᵀ·scale, masked to the field π_i) · v` computed block by block (§5.1).

    Query `i` attends to key `j` when `field(i, j)` holds, `j` lies in one of the key blocks
    `⌊i / block_size⌋ + o` (`o ∈ block_offsets`), the key is not padded and, with `causal`,
    `j ≤ i`. The caller chooses `block_size` and `block_offsets` so that the blocks cover the
    whole field; the result then equals dense masked attention with the mask `field(i, j)`.
    Scores and softmax are float32; a query whose field is entirely masked gives zeros.

    Args:
        query: `[B, T, H, Dh]`, `T` a static int.
        key: `[B, T, Hkv, Dh]`, `H % Hkv == 0` (grouped-query attention, survey §5.4).
        value: `[B, T, Hkv, Dh]`.
        field: callable `(query_positions, key_positions) -> bool`, elementwise over
            broadcastable int32 tensors of absolute positions.
        block_size: int, positions per block.
        block_offsets: ints, the key blocks (relative to the query block) that cover the field.
        padding_mask: optional boolean `[B, T]`, `True` for real key tokens.
        causal: bool, also mask `j > i`; key blocks after the query block are then skipped.
        scale: score scale; defaults to `1/√Dh`.
        dropout_rate, training, seed_generator: dropout on the attention weights.

    Returns:
        `[B, T, H, Dh]` in the dtype of `value`.

    Example:
    >>> q = k = v = keras.random.normal((1, 10, 2, 8))
    >>> band = lambda i, j: keras.ops.abs(i - j) <= 2
    >>> block_sparse_attention(q, k, v, field=band, block_size=2, block_offsets=(-1, 0, 1))
    """
    length = query.shape[1]
    if not isinstance(length, int):
        raise ValueError(
            "block_sparse_attention needs a static sequence length. "
            f"Received: query.shape={tuple(query.shape)}"
        )
    if key.shape[1] != length or value.shape[1] != length:
        raise ValueError(
            "block_sparse_attention is self-attention: keys and values need the query length. "
            f"Received: query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)}"
        )
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int. Received: block_size={block_size}")
    heads, kv_heads, head_dim = query.shape[2], key.shape[2], query.shape[3]
    if heads % kv_heads:
        raise ValueError(
            "The number of query heads must be a multiple of the number of key/value heads. "
            f"Received: query heads={heads}, key/value heads={kv_heads}"
        )
    if scale is None:
        scale = 1.0 / float(head_dim) ** 0.5
    num_blocks = math.ceil(length / block_size)
    padded_length = num_blocks * block_size
    offsets = sorted(
        {int(o) for o in block_offsets if -num_blocks < o < num_blocks and not (causal and o > 0)}
    )
    if not offsets:
        raise ValueError(
            "block_offsets must contain an offset that reaches a key block. "
            f"Received: block_offsets={tuple(block_offsets)}"
        )
    batch = ops.shape(query)[0]
    extra = padded_length - length

    def blocked(tensor, *inner):
        if extra:
            tensor = ops.pad(tensor, [(0, 0), (0, extra)] + [(0, 0)] * (len(tensor.shape) - 2))
        return ops.reshape(tensor, (batch, num_blocks, block_size) + inner)

    group = heads // kv_heads
    q = blocked(query, kv_heads, group, head_dim)  # [B, nb, b, Hkv, G, Dh]
    k = _shifted_blocks(blocked(key, kv_heads, head_dim), offsets)  # [B, nb, K, Hkv, Dh]
    v = _shifted_blocks(blocked(value, kv_heads, head_dim), offsets)

    query_positions = ops.reshape(ops.arange(padded_length, dtype="int32"), (num_blocks, block_size))
    key_positions = ops.concatenate(
        [query_positions + offset * block_size for offset in offsets], axis=1
    )  # [nb, K]
    i, j = query_positions[:, :, None], key_positions[:, None, :]
    mask = ops.logical_and(ops.cast(field(i, j), "bool"), ops.logical_and(j >= 0, j < length))
    if causal:
        mask = ops.logical_and(mask, j <= i)
    mask = mask[None, :, None, None]  # [1, nb, 1, 1, b, K]
    if padding_mask is not None:
        # int32 while padding: some backends cannot pad boolean tensors.
        keys = blocked(ops.cast(padding_mask, "int32"))  # [B, nb, b]
        keys = ops.greater(_shifted_blocks(keys, offsets), 0)  # [B, nb, K]
        mask = ops.logical_and(mask, keys[:, :, None, None, None, :])

    # Scores in float32: a float16 q·kᵀ overflows once inputs reach a few hundred.
    scores = ops.einsum("bnqhgd,bnkhd->bnhgqk", ops.cast(q, "float32"), ops.cast(k, "float32"))
    weights = masked_softmax(scores * scale, mask)
    if training and dropout_rate > 0:
        weights = keras.random.dropout(weights, dropout_rate, seed=seed_generator)
    outputs = ops.einsum("bnhgqk,bnkhd->bnqhgd", ops.cast(weights, value.dtype), v)
    outputs = ops.reshape(outputs, (batch, padded_length, heads, head_dim))
    return outputs[:, :length] if extra else outputs
