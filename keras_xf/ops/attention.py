"""Scaled dot-product attention and the float32 masked softmax (survey §2.3, §2.6).

Tensors follow the `keras.ops` layout: queries `[B, T, H, Dh]`, keys and values
`[B, S, Hkv, Dh]` with `H` a multiple of `Hkv` (multi-query and grouped-query attention,
survey §5.4). Masks are boolean and broadcastable to `[B, H, T, S]`, `True` meaning "attend".

The fused kernel (`dot_product_attention`) is backend-specific code kept beside the attention
it serves: on PyTorch it calls `torch.nn.functional.scaled_dot_product_attention` itself.
"""

import keras
from keras import ops

from keras_xf.ops.masks import causal_mask
from keras_xf.ops.masks import merge_masks

_LOWEST = {
    "float16": -65504.0,
    "bfloat16": -3.3895313892515355e38,
    "float32": -3.4028234663852886e38,
    "float64": -3.4028234663852886e38,
}


def lowest_value(dtype):
    """The most negative finite value of a floating `dtype` (float32's for float64)."""
    return _LOWEST[keras.backend.standardize_dtype(dtype)]


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax in float32 over `axis`, with masked entries given zero weight.

    `α = Softmax(scores + M)` with `M(i, j) = -inf` where the mask is `False` (survey §2.6),
    computed without infinities: masked scores are replaced by the most negative finite
    float32 value, and a row whose entries are all masked gives all zeros, never NaN.

    Args:
        scores: float tensor of any float dtype.
        mask: optional boolean tensor broadcastable to `scores`, `True` = keep.
        axis: the axis to normalise.

    Returns:
        float32 tensor with the shape of `scores`.

    Example:
    >>> masked_softmax(np.array([[0.0, 1.0]]), np.array([[True, False]]))  # [[1., 0.]]
    """
    scores = ops.cast(scores, "float32")
    if mask is None:
        return _softmax(scores, axis)
    mask = ops.cast(mask, "bool")
    weights = _softmax(ops.where(mask, scores, lowest_value("float32")), axis)
    return ops.where(mask, weights, ops.zeros_like(weights))


def _softmax(x, axis):
    """`ops.softmax`, or the same `exp(x − max) / Σ exp(x − max)` written out above rank 5:
    TensorFlow's oneDNN CPU kernel, used on CPUs where oneDNN is on, refuses more than 5 dims
    (the block-sparse scores are `[B, H, blocks, …]`, rank 6)."""
    if len(x.shape) <= 5:
        return ops.softmax(x, axis=axis)
    shifted = x - ops.stop_gradient(ops.max(x, axis=axis, keepdims=True))
    exponentials = ops.exp(shifted)
    return exponentials / ops.sum(exponentials, axis=axis, keepdims=True)


def repeat_kv_heads(tensor, num_heads):
    """Repeats `[B, S, Hkv, Dh]` key/value heads so that they match `num_heads` query heads."""
    kv_heads = tensor.shape[2]
    if kv_heads == num_heads:
        return tensor
    return ops.repeat(tensor, num_heads // kv_heads, axis=2)


def attention_scores(query, key, scale=None):
    """`q·kᵀ · scale` as float32 `[B, H, T, S]`; `scale` defaults to `1/√Dh` (survey §2.3).

    The product is formed in float32: in float16 a sum of `Dh` products overflows (to inf,
    then NaN after the softmax) once queries and keys reach a few hundred."""
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5
    key = repeat_kv_heads(key, query.shape[2])
    scores = ops.einsum("bthd,bshd->bhts", ops.cast(query, "float32"), ops.cast(key, "float32"))
    return scores * scale


def attend(weights, value):
    """`α·v`: weights `[B, H, T, S]` and values `[B, S, Hkv, Dh]` give `[B, T, H, Dh]`."""
    value = repeat_kv_heads(value, weights.shape[1])
    return ops.einsum("bhts,bshd->bthd", ops.cast(weights, value.dtype), value)


def head_major_attention(query, key, value, mask=None, scale=None):
    """`Softmax(Q·Kᵀ·scale, masked) · V` with keys and values in a head-major cache's layout.

    Decoding reads every cached key at every step. Kept as `[B, Hkv, S, Dh]` (the layout of
    `MultiHeadAttention.init_cache`), each head's keys are the contiguous operand of its
    `q·kᵀ` product; the `[B, S, Hkv, Dh]` layout of `scaled_dot_product_attention` makes
    the backends copy the whole cache transposed at every step. Grouped query heads (survey
    §5.4) attend to their shared key head without repeating it. Scores and softmax are
    float32; a query whose keys are all masked gets zeros.

    Args:
        query: `[B, T, H, Dq]`.
        key: `[B, Hkv, S, Dq]`, `H % Hkv == 0`.
        value: `[B, Hkv, S, Dv]`.
        mask: optional boolean mask broadcastable to `[B, H, T, S]` (as `merge_masks` gives).
        scale: score scale; defaults to `1/√Dq`.

    Returns:
        `[B, T, H, Dv]` in the dtype of `value`.
    """
    heads, kv_heads = query.shape[2], key.shape[1]
    if heads % kv_heads != 0:
        raise ValueError(
            "The number of query heads must be a multiple of the number of key/value heads. "
            f"Received: query heads={heads}, key/value heads={kv_heads}"
        )
    groups = heads // kv_heads
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5
    batch, length = ops.shape(query)[0], ops.shape(query)[1]
    grouped = ops.reshape(ops.cast(query, "float32"),
                          (batch, length, kv_heads, groups, query.shape[-1]))
    scores = ops.einsum("btkgd,bksd->bkgts", grouped, ops.cast(key, "float32")) * scale
    if mask is not None:
        mask = merge_masks(mask)
        if mask.shape[1] == 1:
            mask = ops.expand_dims(mask, 2)  # [B|1, 1, 1, T, S]
        else:
            mask = ops.reshape(mask, (ops.shape(mask)[0], kv_heads, groups) + tuple(
                ops.shape(mask)[2:]))
    weights = masked_softmax(scores, mask)
    outputs = ops.einsum("bkgts,bksd->btkgd", ops.cast(weights, value.dtype), value)
    return ops.reshape(outputs, (batch, length, heads, value.shape[-1]))


def dot_product_attention(query, key, value, mask, bias, scale):
    """The fused attention kernel on `[B, T, H, Dh]` queries and `[B, S, Hkv, Dh]` keys/values.

    Why not `keras.ops.dot_product_attention` alone: on PyTorch it makes contiguous copies of
    the transposed keys and values first; reading a cache `[B, 2, L, Hkv, Dh]` that costs two
    copies of the whole cache per layer and step. PyTorch's `scaled_dot_product_attention`
    takes the strided views as they are. Elsewhere it is `keras.ops.dot_product_attention`.
    `mask` and `bias` are not both given (PyTorch's kernel takes one of them).

    Flash kernels follow Keras's global switch, as Keras's and keras-hub's attention layers
    do: by default (and after `keras.config.enable_flash_attention()`) Keras takes its flash
    kernel where the platform has one (cuDNN on an Ampere or later GPU with bfloat16 or
    float16 inputs, Splash attention on a TPU) and its plain kernel elsewhere;
    `keras.config.disable_flash_attention()` keeps the plain kernel everywhere. PyTorch's
    `scaled_dot_product_attention` chooses among its own fused kernels (flash,
    memory-efficient, cuDNN) by the inputs and the device.
    """
    if keras.config.backend() == "torch":
        return _torch_attention(query, key, value, mask, bias, scale)
    # None (Keras's default) lets Keras choose; False is the user's `disable_flash_attention`.
    return ops.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale,
        flash_attention=keras.config.is_flash_attention_enabled(),
    )


def _torch_attention(query, key, value, mask, bias, scale):
    import torch.nn.functional as F

    key = repeat_kv_heads(key, query.shape[2])
    value = repeat_kv_heads(value, query.shape[2])
    query, key, value = (ops.transpose(t, (0, 2, 1, 3)) for t in (query, key, value))
    outputs = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask if bias is None else bias, scale=scale
    )
    return ops.transpose(outputs, (0, 2, 1, 3))


def _fused_attention(query, key, value, mask, bias, scale):
    """`keras.ops.dot_product_attention`, with fully masked rows giving zero outputs."""
    row_valid = None
    if mask is not None:
        # A row without any valid key gives NaN (PyTorch) or a uniform average (JAX, TF) in
        # the fused kernels. Such rows attend everywhere instead; their outputs are zeroed.
        row_valid = ops.any(mask, axis=-1, keepdims=True)  # [B|1, H|1, T, 1]
        mask = ops.logical_or(mask, ops.logical_not(row_valid))
    if bias is not None:
        bias = ops.cast(bias, query.dtype)
        if mask is not None:
            # PyTorch's kernel takes a bias or a mask, not both: fold the mask into the bias.
            bias = ops.where(mask, bias, lowest_value(query.dtype))
            mask = None
    if key.shape[2] == 1 and query.shape[2] > 1:
        # Keras's TensorFlow kernel mis-shapes a single key/value head (multi-query attention).
        key, value = repeat_kv_heads(key, query.shape[2]), repeat_kv_heads(value, query.shape[2])
    outputs = dot_product_attention(query, key, value, mask, bias, scale)
    if row_valid is not None:
        row_valid = ops.transpose(row_valid, (0, 2, 1, 3))  # [B|1, T, H|1, 1]
        # A scalar zero: no `[B, T, H, Dh]` block of zeros is filled (eager PyTorch would).
        outputs = ops.where(row_valid, outputs, ops.zeros((), outputs.dtype))
    return outputs


def scaled_dot_product_attention(
    query,
    key,
    value,
    *,
    mask=None,
    bias=None,
    scale=None,
    is_causal=False,
    dropout_rate=0.0,
    training=False,
    return_weights=False,
    seed_generator=None,
):
    """`Att_qkv(Q, K, V) = Softmax(Q·Kᵀ/√d_h + bias, masked) · V` (survey §2.3, §2.6).

    When only a boolean mask and/or an additive bias are needed (no weights returned, no
    dropout in training, inputs not float16) the fused `keras.ops.dot_product_attention`
    kernel is used;
    otherwise the explicit path computes float32 scores and `masked_softmax`. Both paths give
    the same numbers, including zeros for queries whose keys are all masked.

    Args:
        query: `[B, T, H, Dh]`.
        key: `[B, S, Hkv, Dh]`, `H % Hkv == 0`.
        value: `[B, S, Hkv, Dh]`.
        mask: optional boolean mask, rank 2 `[T, S]`, 3 `[B, T, S]` or 4 `[B, H, T, S]`.
        bias: optional additive bias broadcastable to `[B, H, T, S]`.
        scale: score scale; defaults to `1/√Dh`.
        is_causal: also apply the causal mask `j <= i` (survey §2.6).
        dropout_rate: dropout on the attention weights, applied when `training`.
        training: Python bool.
        return_weights: also return the `[B, H, T, S]` float32 attention weights.
        seed_generator: a `keras.random.SeedGenerator` for dropout.

    Returns:
        `[B, T, H, Dh]` outputs, and the weights when `return_weights`.

    Example:
    >>> q = k = v = keras.random.normal((2, 5, 4, 8))
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).shape  # (2, 5, 4, 8)
    """
    if dropout_rate < 0 or dropout_rate >= 1:
        raise ValueError(f"dropout_rate must be in [0, 1). Received: dropout_rate={dropout_rate}")
    if query.shape[2] % key.shape[2] != 0:
        raise ValueError(
            "The number of query heads must be a multiple of the number of key/value heads. "
            f"Received: query heads={query.shape[2]}, key/value heads={key.shape[2]}"
        )
    if is_causal:
        mask = merge_masks(mask, causal_mask(ops.shape(query)[1], ops.shape(key)[1]))
    elif mask is not None:
        mask = merge_masks(mask)
    use_dropout = bool(training) and dropout_rate > 0
    if scale is None:
        scale = 1.0 / float(query.shape[-1]) ** 0.5
    # float16 takes the explicit path, whose scores and softmax are float32: the fused
    # kernels form q·kᵀ in float16, which overflows once inputs reach a few hundred (and XLA
    # on CPU lacks the float16 x float16 -> float32 dot that JAX's kernel asks for).
    half = keras.backend.standardize_dtype(query.dtype) == "float16"
    if not return_weights and not use_dropout and not half:
        return _fused_attention(query, key, value, mask, bias, scale)

    scores = attention_scores(query, key, scale)
    if bias is not None:
        scores = scores + ops.cast(bias, "float32")
    weights = masked_softmax(scores, mask)
    attended = weights
    if use_dropout:
        attended = keras.random.dropout(weights, dropout_rate, seed=seed_generator)
    outputs = attend(attended, value)
    if return_weights:
        return outputs, weights
    return outputs
