"""Learned skip gates: mixing a layer's outputs into its inputs by a decision that is trained
through a probability (survey §5.6, learning to skip)."""

from keras import ops

GATES = ("multiply", "straight_through")


def gated_update(inputs, updated, probability, run, valid, gate, training):
    """`h′ = h + g·(f(h) − h)`, the inputs `h` where the layer is skipped, `f(h)` where it runs.

    `probability` (`p`, float32), `run` (the hard decision) and `valid` (bool: where a
    decision applies at all) broadcast against `inputs` / `updated` (`[..., d]`, e.g.
    `[B, k, 1]` per token or `[B, 1, 1]` per sequence); where `valid` is false the inputs
    pass through with no gradient to `p`.

    - inference: `g = 1[run]`;
    - training, `gate="straight_through"`: `g = 1[run] + p − sg(p)` (`sg`: stop-gradient):
      the values of inference, the gradient of `p·(f(h) − h)`;
    - training, `gate="multiply"`: `g = p`, the soft decision (`run` is not used).
    """
    run = ops.logical_and(run, valid)
    hard = ops.where(run, updated, inputs)
    if not training:
        return hard
    probability = ops.where(valid, probability, ops.zeros_like(probability))
    if gate == "multiply":
        return inputs + ops.cast(probability, updated.dtype) * (updated - inputs)
    straight = ops.cast(probability - ops.stop_gradient(probability), updated.dtype)
    return hard + straight * (updated - inputs)
