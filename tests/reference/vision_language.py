"""Numpy oracle for a single-stream vision-language encoder's input (survey §6.5, ViLT).

Text and image are each a sequence of `d`-dimensional embeddings, each with its own positions
and a modality (type) embedding, concatenated text first:
`[t_1 … t_T; v_1 … v_N]`, `t_j = E[x_j] + P_text[j] + E_type[0]`,
`v_n = PatchEmb(I)_n + P_image[n] + E_type[1]`. Padded text positions are masked out; image
positions are always real. Float64.
"""

import numpy as np

from tests.reference.vision import patch_embedding


def encoder_inputs(token_ids, padding_mask, images, weights, patch_size):
    """`(sequence [B, T + N, d], mask [B, T + N])`.

    `weights`: `token [V, d]`, `text_position [L, d]`, `patch_kernel [P·P·C, d]`,
    `patch_bias [d]`, `image_position [N, d]`, `type [2, d]`.
    """
    length = token_ids.shape[1]
    text = weights["token"][token_ids] + weights["text_position"][:length] + weights["type"][0]
    image = patch_embedding(images, patch_size, weights["patch_kernel"], weights["patch_bias"])
    image = image + weights["image_position"] + weights["type"][1]
    mask = np.concatenate(
        [np.asarray(padding_mask, bool), np.ones(image.shape[:2], bool)], axis=1)
    return np.concatenate([text, image], axis=1), mask


def mean_pool(sequence, mask):
    """`Σ_j m_j h_j / max(1, Σ_j m_j)` over the real positions."""
    mask = np.asarray(mask, np.float64)[..., None]
    return (sequence * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
