"""Numpy oracle for position encodings: survey §2.2 and Appendix A, and rotary embeddings."""

import numpy as np


def sinusoidal(length, dim, base=10000.0, start=0):
    """`PE(j, 2k) = sin(j / base^{2k/d})`, `PE(j, 2k+1) = cos(j / base^{2k/d})` (§2.2)."""
    pe = np.zeros((length, dim))
    for j in range(length):
        for index in range(dim):
            k = index // 2
            angle = (start + j) / base ** (2 * k / dim)
            pe[j, index] = np.sin(angle) if index % 2 == 0 else np.cos(angle)
    return pe


def sinusoidal_shift_matrix(offset, dim, base=10000.0):
    """The block-diagonal rotation `R(μ)` with `PE(i + μ) = PE(i) R(μ)` (Appendix A).

    For each pair `(2k, 2k+1)`: `sin(a+b) = sin a cos b + cos a sin b` and
    `cos(a+b) = cos a cos b − sin a sin b`, with `b = μ ω_k`.
    """
    matrix = np.zeros((dim, dim))
    for k in range(dim // 2):
        b = offset / base ** (2 * k / dim)
        s, c = 2 * k, 2 * k + 1
        matrix[s, s], matrix[c, s] = np.cos(b), np.sin(b)
        matrix[s, c], matrix[c, c] = -np.sin(b), np.cos(b)
    return matrix


def llama3_frequencies(dim, base, factor, low_freq_factor, high_freq_factor,
                       original_max_position_embeddings):
    """Llama 3's RoPE frequencies, one at a time: wavelengths above `L/low` are stretched by
    `factor`, those below `L/high` kept, those between interpolated linearly in `L/λ`."""
    result = []
    for frequency in base ** (-np.arange(0, dim, 2) / dim):
        wavelength = 2 * np.pi / frequency
        ratio = original_max_position_embeddings / wavelength
        if ratio < low_freq_factor:
            result.append(frequency / factor)
        elif ratio > high_freq_factor:
            result.append(frequency)
        else:
            s = (ratio - low_freq_factor) / (high_freq_factor - low_freq_factor)
            result.append((1 - s) * frequency / factor + s * frequency)
    return np.array(result)


def rotary(x, positions, base=10000.0, scaling_factor=1.0, frequencies=None):
    """Rotates the halves `(x₁, x₂)` of `[..., T, H, Dh]` by `θ_{j,k} = j · base^{-2k/Dh}` (or
    by `j · frequencies[k]`)."""
    dim = x.shape[-1]
    half = dim // 2
    freqs = base ** (-np.arange(0, dim, 2) / dim) if frequencies is None else frequencies
    angles = (np.asarray(positions, np.float64) / scaling_factor)[..., None] * freqs
    cos = np.cos(angles)[..., None, :]
    sin = np.sin(angles)[..., None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
