"""Padding, shifted windows, the rolling cache and the FFT convolution of sequence convolutions
(survey §5.5.1, §5.5.3)."""

from keras import ops


def convolution_padding(kernel_size, causal):
    """`(left, right)` zero padding that keeps the length of a size-`K` convolution.

    Causal: `(K − 1, 0)`, so the output at `t` reads `x_{t−K+1} … x_t`. Centred: `left =
    ⌊(K − 1)/2⌋`, `right = K − 1 − left` (for an even `K` the extra tap is on the right, as
    in Keras' and PyTorch's `"same"` padding), so the output at `t` reads `x_{t−left} …
    x_{t+right}`.
    """
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size <= 0:
        raise ValueError(f"kernel_size must be a positive int. Received: kernel_size={kernel_size}")
    if causal:
        return kernel_size - 1, 0
    left = (kernel_size - 1) // 2
    return left, kernel_size - 1 - left


def pad_sequence(inputs, kernel_size, causal, history=None):
    """`inputs` `[B, T, C]` padded to `[B, T + K − 1, C]` for a "valid" size-`K` convolution.

    `history` `[B, K − 1, C]` (causal only) replaces the left zeros: the last `K − 1` inputs
    of the preceding tokens, i.e. the rolling cache.
    """
    left, right = convolution_padding(kernel_size, causal)
    if history is not None:
        if not causal:
            raise ValueError("history (a rolling cache) needs causal=True. Received: causal=False")
        return ops.concatenate([ops.cast(history, inputs.dtype), inputs], axis=1)
    return ops.pad(inputs, ((0, 0), (left, right), (0, 0)))


def shifted_windows(padded, kernel_size):
    """The `K` shifted copies of a padded sequence, `[B, T, K, C]` with `T = L − K + 1`:
    entry `[b, t, j]` is `padded[b, t + j]`. Memory `O(T·K·C)`, linear in `T`."""
    length = ops.shape(padded)[1] - (kernel_size - 1)
    return ops.stack([padded[:, j:j + length] for j in range(kernel_size)], axis=2)


def rolling_cache(padded, kernel_size, padding_mask=None):
    """The last `K − 1` entries of a padded (history + new tokens) sequence, `[B, K − 1, C]`,
    in float32: the cache for the next call.

    With `padding_mask` `[B, T]` over the new tokens, each row's window ends at its last
    valid token instead, so that right padding never enters the cache (entry `j` of row `b`
    is `padded[b, e_b + j]`, `e_b` the number of positions up to its last valid token).
    """
    batch, length, channels = ops.shape(padded)
    start = length - (kernel_size - 1)
    if padding_mask is None or kernel_size == 1:
        window = ops.slice(padded, (0, start, 0), (batch, kernel_size - 1, channels))
        return ops.cast(window, "float32")
    steps = ops.arange(1, ops.shape(padding_mask)[1] + 1, dtype="int32")
    end = ops.max(ops.where(ops.cast(padding_mask, "bool"), steps[None, :], 0), axis=1)
    indices = end[:, None] + ops.arange(kernel_size - 1, dtype="int32")[None, :]
    indices = ops.expand_dims(indices, -1) + ops.zeros_like(padded[:, : kernel_size - 1],
                                                            dtype="int32")
    return ops.cast(ops.take_along_axis(padded, indices, axis=1), "float32")


def valid_depthwise_convolution(padded, kernel):
    """`y_{t,c} = Σ_j W_{j,c} p_{t+j,c}`: a "valid" depthwise convolution of a padded
    `[B, T + K − 1, C]` sequence (`pad_sequence`) with a kernel `[K, C]`, giving `[B, T, C]`."""
    kernel = ops.cast(kernel, padded.dtype)
    return ops.depthwise_conv(padded, kernel[:, :, None], strides=1, padding="valid")


def glu(x):
    """The gated linear unit over the last axis: `a ⊙ σ(b)` for `x = [a | b]`."""
    a, b = ops.split(x, 2, axis=-1)
    return a * ops.sigmoid(b)


def causal_fft_convolution(x, kernel):
    """`y_t = Σ_{i≤t} K_{t−i} s_i` per channel, by FFT over `2T` points (at least; a power of
    two), for a kernel as long as the sequence (the convolution form of a time-invariant
    state-space model, survey §5.5.3): `O(T log T)` instead of the `O(T²)` of the sum.

    Args:
        x: `[B, T, d]` with a static `T`.
        kernel: `[T, d]`, `K_0 … K_{T−1}` per channel.

    Returns:
        `[B, T, d]`.

    Example:
    >>> y = causal_fft_convolution(ops.ones((1, 3, 1)), ops.ones((3, 1)))  # 1, 2, 3
    """
    length = int(x.shape[1])  # an int also while PyTorch traces (a shape tensor there)
    fft_length = 1 << max(1, (2 * length - 1).bit_length())
    signal = ops.transpose(x, (0, 2, 1))  # [B, d, T]
    filt = ops.transpose(kernel, (1, 0))  # [d, T]
    pad = fft_length - length
    signal = ops.pad(signal, ((0, 0), (0, 0), (0, pad)))
    filt = ops.pad(filt, ((0, 0), (0, pad)))
    s_re, s_im = ops.rfft(signal)
    f_re, f_im = ops.rfft(filt)
    # The product of the two spectra, (s_re + i·s_im)(f_re + i·f_im).
    product = (s_re * f_re - s_im * f_im, s_re * f_im + s_im * f_re)
    y = ops.irfft(product, fft_length=fft_length)
    return ops.transpose(y[..., :length], (0, 2, 1))
