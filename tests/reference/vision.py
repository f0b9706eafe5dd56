"""Numpy oracle for the Vision Transformer's inputs (survey §6.4): patches and patch positions."""

import numpy as np


def patches(images, patch_size):
    """Cuts `[B, H, W, C]` images into `P × P × C` patches in row-major order, each flattened
    in `(row, column, channel)` order: `[B, (H/P)·(W/P), P·P·C]`, with explicit loops."""
    batch, height, width, channels = images.shape
    p = patch_size
    out = []
    for i in range(height // p):
        for j in range(width // p):
            out.append(images[:, i * p : (i + 1) * p, j * p : (j + 1) * p, :].reshape(batch, -1))
    return np.stack(out, axis=1)


def patch_embedding(images, patch_size, kernel, bias=None):
    """`e_n = x_n W + b` for every flattened patch `x_n` (§6.4)."""
    out = patches(images, patch_size) @ kernel
    return out if bias is None else out + bias


def strided_convolution(images, kernel, stride):
    """A valid convolution with a `[P, P, C, d]` kernel and stride `P`, by loops over output
    positions: the convolutional reading of the patch embedding."""
    batch, height, width, _ = images.shape
    p = kernel.shape[0]
    rows, cols = height // stride, width // stride
    out = np.zeros((batch, rows, cols, kernel.shape[-1]))
    for i in range(rows):
        for j in range(cols):
            window = images[:, i * stride : i * stride + p, j * stride : j * stride + p, :]
            out[:, i, j] = np.einsum("bpqc,pqcd->bd", window, kernel)
    return out.reshape(batch, rows * cols, -1)


def sinusoidal_1d(positions, dim, base=10000.0):
    """`PE(j, 2k) = sin(j / base^{2k/d})`, `PE(j, 2k+1) = cos(j / base^{2k/d})` (§2.2)."""
    pe = np.zeros((len(positions), dim))
    for n, j in enumerate(positions):
        for index in range(dim):
            angle = j / base ** (2 * (index // 2) / dim)
            pe[n, index] = np.sin(angle) if index % 2 == 0 else np.cos(angle)
    return pe


def sinusoidal_2d(rows, cols, dim, base=10000.0):
    """The 2-D table: for the patch at grid cell `(r, c)` (row-major index `n = r·cols + c`),
    the first `d/2` features are the 1-D encoding of `r`, the last `d/2` that of `c`."""
    half = dim // 2
    grid_rows = np.repeat(np.arange(rows), cols)
    grid_cols = np.tile(np.arange(cols), rows)
    return np.concatenate(
        [sinusoidal_1d(grid_rows, half, base), sinusoidal_1d(grid_cols, half, base)], axis=-1
    )
