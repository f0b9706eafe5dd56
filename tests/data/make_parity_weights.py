"""Writes `parity_weights.npz`, the fixed weights and batch of the cross-backend parity test.

Run once (any backend) and commit the output:

    KERAS_BACKEND=jax python tests/data/make_parity_weights.py

The model's variable paths and shapes come from `tests/parity_worker.build_model`; the
values come from a fixed numpy RNG, so the file does not depend on the backend used.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import parity_worker  # noqa: E402

SEED = 20240601


def weight_value(rng, path, shape):
    """A well-scaled value for each kind of variable."""
    name = path.rsplit("/", 1)[-1]
    if name == "gamma":
        return 1.0 + 0.1 * rng.standard_normal(shape)
    if name in ("beta", "bias"):
        return 0.05 * rng.standard_normal(shape)
    if name == "embeddings":
        return 0.5 * rng.standard_normal(shape)
    if name == "kernel":
        # EinsumDense kernels: the contracted axes are all but the last one for the output
        # projection [heads, head_dim, d], and the first one for q/k/v [d, heads, head_dim].
        fan_in = shape[0] if path.split("/")[-2] in ("query", "key", "value") else int(
            np.prod(shape[:-1])
        )
        return rng.standard_normal(shape) / np.sqrt(fan_in)
    raise ValueError(f"No initial value rule for {path} with shape {shape}")


def make_batch(rng):
    length, vocabulary = parity_worker.LENGTH, parity_worker.VOCABULARY_SIZE
    token_ids = rng.integers(1, vocabulary, size=(parity_worker.BATCH_SIZE, length))
    token_ids[0, 5:] = 0  # right padding
    token_ids[1, :2] = 0  # left padding: with the causal mask, queries 0-1 see no key
    padding_mask = token_ids != 0
    labels = np.concatenate([token_ids[:, 1:], np.zeros_like(token_ids[:, :1])], axis=1)
    sample_weight = np.concatenate(
        [padding_mask[:, :-1] & padding_mask[:, 1:], np.zeros_like(padding_mask[:, :1])], axis=1
    )
    return {
        "token_ids": token_ids.astype("int32"),
        "padding_mask": padding_mask,
        "labels": labels.astype("int32"),
        "sample_weight": sample_weight.astype("float32"),
    }


def main(path=parity_worker.WEIGHTS_PATH):
    rng = np.random.default_rng(SEED)
    model = parity_worker.build_model()
    specs = parity_worker.weight_specs(model)
    arrays = make_batch(rng)
    arrays["weight_paths"] = np.asarray([p for p, _ in specs])
    for weight_path, shape in specs:
        value = weight_value(rng, weight_path, shape).astype("float32")
        assert value.shape == shape, (weight_path, value.shape, shape)
        arrays[parity_worker.WEIGHT_PREFIX + weight_path] = value
    np.savez(path, **arrays)
    print(f"wrote {path}: {len(specs)} variables, {sum(int(np.prod(s)) for _, s in specs)} values")
    for weight_path, shape in specs:
        print(f"  {weight_path} {shape}")


if __name__ == "__main__":
    main()
