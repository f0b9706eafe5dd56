"""Position encodings as pure functions: the sinusoid table and the rotary rotation.

Survey §2.2 and Appendix A for the sinusoidal encoding; rotary position embeddings (RoPE)
are listed in the survey's summary of position models (§6).
"""

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


def rotary_angles(positions, head_dim, base=10000.0, scaling_factor=1.0):
    """Rotation angles `θ_{j,k} = (j / scaling_factor) · base^(-2k/head_dim)`, `[..., head_dim/2]`."""
    frequencies = sinusoid_inverse_frequencies(head_dim, base)
    positions = ops.cast(positions, "float32") / float(scaling_factor)
    return positions[..., None] * frequencies


def apply_rotary(inputs, positions, base=10000.0, scaling_factor=1.0):
    """Rotates pairs of features by position-dependent angles (RoPE).

    The head dimension is split in halves `(x₁, x₂)` and each pair `(x₁ₖ, x₂ₖ)` is rotated by
    `θ_{j,k}`: `(x₁ cos θ − x₂ sin θ, x₂ cos θ + x₁ sin θ)`. Then `q_i·k_j` depends on the
    positions only through `i − j`.

    Args:
        inputs: `[B, T, H, Dh]` with an even `Dh`.
        positions: int tensor `[T]` or `[B, T]`.
        base: the wavelength base.
        scaling_factor: positions are divided by it (linear position interpolation).

    Returns:
        A tensor like `inputs`, computed in float32 and cast back to the input dtype.
    """
    head_dim = inputs.shape[-1]
    angles = rotary_angles(positions, head_dim, base, scaling_factor)  # [(B,) T, Dh/2]
    if len(angles.shape) == 2:
        angles = angles[None]
    cos = ops.cos(angles)[:, :, None, :]
    sin = ops.sin(angles)[:, :, None, :]
    x = ops.cast(inputs, "float32")
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    rotated = ops.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return ops.cast(rotated, inputs.dtype)
