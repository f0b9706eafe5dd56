"""Position encodings as pure functions: the sinusoid table, the rotary rotation, and the
relative positions of attention biases.

Survey §2.2 and Appendix A for the sinusoidal encoding; rotary position embeddings (RoPE)
are listed in the survey's summary of position models (§6); clipped relative distances are
those of relative positional representations (§4.1.3), T5 buckets and ALiBi slopes are the
relative-position biases the survey cites there and in its summary.
"""

import math

import numpy as np

from keras import ops


def sinusoid_inverse_frequencies(dim, base=10000.0):
    """`ω_k = 1 / base^(2k/d)` for `k = 0 … d/2 - 1`, as float32 `[ceil(d/2)]`."""
    exponents = ops.arange(0, dim, 2, dtype="float32") / float(dim)
    return ops.power(float(base), -exponents)


def sinusoid_table(positions, dim, base=10000.0):
    """The interleaved sinusoidal encoding of survey §2.2 (eqs. for PE(j, 2k) and PE(j, 2k+1)).

    `PE(j, 2k) = sin(j · ω_k)` and `PE(j, 2k+1) = cos(j · ω_k)` with `ω_k = base^(-2k/d)`.

    Args:
        positions: int or float tensor of any shape `[...]`.
        dim: int, the encoding width `d` (odd widths drop the last cosine).
        base: the base `b` (10000 in the original Transformer).

    Returns:
        float32 tensor `[..., d]`.

    Example:
    >>> sinusoid_table(ops.arange(4), 6).shape  # (4, 6)
    """
    frequencies = sinusoid_inverse_frequencies(dim, base)
    angles = ops.cast(positions, "float32")[..., None] * frequencies
    table = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)
    table = ops.reshape(table, tuple(ops.shape(angles)[:-1]) + (2 * frequencies.shape[0],))
    return table[..., :dim]


def sinusoid_table_2d(rows, cols, dim, base=10000.0):
    """The 2-D sinusoidal table of a `rows × cols` patch grid (survey §6.4 with §2.2).

    Patch `n = r · cols + c` (row-major, as `PatchEmbedding` orders patches) is encoded by
    the 1-D sinusoid of its row in the first `d/2` features and of its column in the last
    `d/2`: `PE₂(n) = [PE_{d/2}(r), PE_{d/2}(c)]`, each half interleaving `sin` / `cos` as in
    `sinusoid_table` (with `ω_k = base^(-2k/(d/2))`).

    Args:
        rows: int, the grid height `H/P`.
        cols: int, the grid width `W/P`.
        dim: even int, the encoding width `d`.
        base: the base `b`.

    Returns:
        float32 tensor `[rows · cols, d]`.

    Example:
    >>> sinusoid_table_2d(2, 3, 8).shape  # (6, 8)
    """
    for name, value in (("rows", rows), ("cols", cols), ("dim", dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    if dim % 2:
        raise ValueError(f"dim must be even (half for rows, half for columns). Received: dim={dim}")
    half = dim // 2
    row_ids = ops.repeat(ops.arange(rows, dtype="int32"), cols)
    col_ids = ops.tile(ops.arange(cols, dtype="int32"), [rows])
    return ops.concatenate(
        [sinusoid_table(row_ids, half, base), sinusoid_table(col_ids, half, base)], axis=-1
    )


FREQUENCY_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings")


def scaled_rotary_frequencies(head_dim, base, factor, low_freq_factor, high_freq_factor,
                              original_max_position_embeddings):
    """Llama 3's rescaled RoPE frequencies, as a float32 NumPy array `[head_dim/2]`.

    With `L` the original context length, wavelengths `λ_k = 2π/ω_k` shorter than
    `L/high_freq_factor` keep `ω_k`; those longer than `L/low_freq_factor` become `ω_k/factor`;
    in between, `ω_k` is interpolated by `s = (L/λ_k − low) / (high − low)`:
    `(1 − s)·ω_k/factor + s·ω_k`. Long wavelengths stretch to the longer context while the
    short ones, which encode local order, stay.
    """
    frequencies = 1.0 / float(base) ** (np.arange(0, head_dim, 2, dtype="float64") / head_dim)
    wavelengths = 2 * np.pi / frequencies
    length = float(original_max_position_embeddings)
    smooth = (length / wavelengths - low_freq_factor) / (high_freq_factor - low_freq_factor)
    interpolated = (1 - smooth) * frequencies / factor + smooth * frequencies
    scaled = np.where(wavelengths > length / low_freq_factor, frequencies / factor, frequencies)
    medium = (wavelengths >= length / high_freq_factor) & (wavelengths <= length / low_freq_factor)
    return np.where(medium, interpolated, scaled).astype("float32")


def rotary_angles(positions, head_dim, base=10000.0, scaling_factor=1.0,
                  frequency_scaling=None):
    """Rotation angles `θ_{j,k} = (j / scaling_factor) · ω_k`, `[..., head_dim/2]`, with
    `ω_k = base^(-2k/head_dim)`, or Llama 3's rescaled `ω_k` when `frequency_scaling` holds
    the arguments of `scaled_rotary_frequencies` (`FREQUENCY_SCALING_KEYS`)."""
    if frequency_scaling:
        frequencies = ops.convert_to_tensor(
            scaled_rotary_frequencies(head_dim, base, **frequency_scaling), "float32")
    else:
        frequencies = sinusoid_inverse_frequencies(head_dim, base)
    positions = ops.cast(positions, "float32") / float(scaling_factor)
    return positions[..., None] * frequencies


def apply_rotary(inputs, positions, base=10000.0, scaling_factor=1.0, frequency_scaling=None):
    """Rotates pairs of features by position-dependent angles (RoPE).

    The head dimension is split in halves `(x₁, x₂)` and each pair `(x₁ₖ, x₂ₖ)` is rotated by
    `θ_{j,k}`: `(x₁ cos θ − x₂ sin θ, x₂ cos θ + x₁ sin θ)`. Then `q_i·k_j` depends on the
    positions only through `i − j`.

    Args:
        inputs: `[B, T, H, Dh]` with an even `Dh`.
        positions: int tensor `[T]` or `[B, T]`.
        base: the wavelength base.
        scaling_factor: positions are divided by it (linear position interpolation).
        frequency_scaling: optional Llama 3 frequency rescaling (see `rotary_angles`).

    Returns:
        A tensor like `inputs`, computed in float32 and cast back to the input dtype.
    """
    head_dim = inputs.shape[-1]
    angles = rotary_angles(positions, head_dim, base, scaling_factor, frequency_scaling)  # [(B,) T, Dh/2]
    if len(angles.shape) == 2:
        angles = angles[None]
    cos = ops.cos(angles)[:, :, None, :]
    sin = ops.sin(angles)[:, :, None, :]
    x = ops.cast(inputs, "float32")
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    rotated = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return ops.cast(rotated, inputs.dtype)


def relative_distance(query_positions, key_positions):
    """`j − i` for every query position `i` and key position `j`, as int32 `[T, S]`."""
    query_positions = ops.cast(query_positions, "int32")
    key_positions = ops.cast(key_positions, "int32")
    return key_positions[None, :] - query_positions[:, None]


def clip_relative_distance(distance, max_distance):
    """`clip(x, k_rpr) = max{−k_rpr, min{x, k_rpr}}` (survey §4.1.3), as int32.

    Args:
        distance: int tensor of relative distances `j − i`, any shape.
        max_distance: int `k_rpr ≥ 0`.

    Returns:
        An int32 tensor like `distance`, with values in `[−k_rpr, k_rpr]`.

    Example:
    >>> clip_relative_distance(ops.arange(-3, 4), 2)  # [-2, -2, -1, 0, 1, 2, 2]
    """
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 0:
        raise ValueError(
            "max_distance (k_rpr) must be an int >= 0. "
            f"Received: max_distance={max_distance}"
        )
    return ops.clip(ops.cast(distance, "int32"), -max_distance, max_distance)


def relative_position_buckets(relative_position, num_buckets=32, max_distance=128,
                              bidirectional=True):
    """T5's buckets of relative positions `j − i` (Raffel et al., cited in survey §4.1.3).

    Small distances get a bucket each; larger ones share logarithmically wider buckets up to
    `max_distance`, beyond which all distances fall in the last bucket. Bidirectional: half
    of the buckets for keys before or at the query (`j ≤ i`), half for keys after it (`j > i`).
    Causal (`bidirectional=False`): all buckets for `i − j ≥ 0`; keys after the query share
    bucket 0.

    With `n = i − j` (`|i − j|` bidirectional) and `N` buckets per side, `e = N // 2` exact
    buckets: `bucket = n` if `n < e`, else
    `min(N − 1, e + ⌊log(n / e) / log(max_distance / e) · (N − e)⌋)`, plus `N` for `j > i`
    when bidirectional.

    Args:
        relative_position: int tensor of `j − i`, any shape.
        num_buckets: int, buckets in all (even and ≥ 4 when bidirectional, ≥ 2 causal).
        max_distance: int, distance from which everything falls in the last bucket; greater
            than `e`.
        bidirectional: bool.

    Returns:
        int32 tensor like `relative_position`, values in `[0, num_buckets)`.

    Example:
    >>> relative_position_buckets(ops.arange(-4, 5), num_buckets=8, max_distance=8)
    """
    check_bucket_config(num_buckets, max_distance, bidirectional)
    relative_position = ops.cast(relative_position, "int32")
    n = -relative_position  # i − j
    buckets = 0
    if bidirectional:
        num_buckets //= 2
        buckets = ops.cast(ops.less(n, 0), "int32") * num_buckets
        n = ops.abs(n)
    else:
        n = ops.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = ops.less(n, max_exact)
    # `n` is at least `max_exact` wherever the logarithmic branch is taken; the maximum keeps
    # log(0) out of the unused branch.
    ratio = ops.cast(ops.maximum(n, max_exact), "float32") / float(max_exact)
    large = max_exact + ops.cast(
        ops.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact), "int32"
    )
    large = ops.minimum(large, num_buckets - 1)
    return ops.cast(buckets + ops.where(is_small, n, large), "int32")


def check_bucket_config(num_buckets, max_distance, bidirectional):
    """Raises `ValueError` unless `relative_position_buckets` can use these settings."""
    minimum = 4 if bidirectional else 2
    if (
        not isinstance(num_buckets, int)
        or isinstance(num_buckets, bool)
        or num_buckets < minimum
        or (bidirectional and num_buckets % 2)
    ):
        kind = "an even int >= 4 when bidirectional" if bidirectional else "an int >= 2"
        raise ValueError(
            f"num_buckets must be {kind}. Received: num_buckets={num_buckets}, "
            f"bidirectional={bidirectional}"
        )
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or (
        max_distance <= max_exact
    ):
        raise ValueError(
            f"max_distance must be an int greater than the {max_exact} exact buckets "
            f"(num_buckets={num_buckets}). Received: max_distance={max_distance}"
        )


def alibi_slopes(num_heads, max_bias=8.0):
    """ALiBi's per-head slopes `m_h` (Press et al., cited in the survey's summary, §7).

    For `H` a power of two, `m_h = 2^(−max_bias · h / H)`, `h = 1 … H` (the geometric
    sequence starting at `2^(−8/H)` for the default `max_bias = 8`). Otherwise the slopes of
    the largest power of two `P < H` are followed by every other slope of `2P` heads
    (`m_1, m_3, …` of the `2P` sequence) until there are `H`.

    Args:
        num_heads: positive int.
        max_bias: positive float, the exponent range (8 in ALiBi).

    Returns:
        float32 tensor `[num_heads]`.

    Example:
    >>> alibi_slopes(4)  # [0.25, 0.0625, 0.015625, 0.00390625]
    """
    return ops.convert_to_tensor(alibi_slope_values(num_heads, max_bias), dtype="float32")


def alibi_slope_values(num_heads, max_bias=8.0):
    """The slopes of `alibi_slopes` as a Python list of floats."""
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive int. Received: num_heads={num_heads}")
    if not isinstance(max_bias, (int, float)) or isinstance(max_bias, bool) or max_bias <= 0:
        raise ValueError(f"max_bias must be a positive number. Received: max_bias={max_bias}")

    def power_of_two(n):
        return [2.0 ** (-max_bias * h / n) for h in range(1, n + 1)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    if closest == num_heads:
        return power_of_two(num_heads)
    return power_of_two(closest) + alibi_slope_values(2 * closest, max_bias)[0::2][
        : num_heads - closest
    ]
