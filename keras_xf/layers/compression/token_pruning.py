"""Learned token pruning: keep the highest-scoring tokens of a sequence (survey §5.8)."""

import math
from typing import NamedTuple

import keras
from keras import ops

from keras_xf.ops.attention import lowest_value
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.checks import known_width
from keras_xf.ops.gates import GATES
from keras_xf.ops.masks import zero_padded


def kept_count(keep_ratio, length):
    """`k = ⌈ρ·n⌉` (at least 1), rounded so that e.g. `0.3·10` gives 3, not 4."""
    return max(1, math.ceil(round(keep_ratio * length, 9)))


def check_keep_ratio(name, value):
    """A number in `(0, 1]` (a fraction of tokens kept), as a float."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
    if not ok:
        raise ValueError(f"{name} must be a number in (0, 1]. Received: {name}={value!r}")
    return float(value)


def static_kept_count(inputs, keep_ratio, ratio_name="keep_ratio"):
    """`k = ⌈ρ·n⌉` for inputs `[B, n, d]` of static length `n` (`k` is a static shape)."""
    length = inputs.shape[1]
    if not isinstance(length, int):
        raise ValueError(f"inputs must have a static length (k = ⌈{ratio_name}·n⌉ is a "
                         f"static shape). Received: inputs.shape={tuple(inputs.shape)}")
    return kept_count(keep_ratio, length)


def token_scores(inputs, kernel, bias):
    """`s_i = h_i w + b` in float32, `[B, n]`."""
    return ops.einsum("bnd,d->bn", ops.cast(inputs, "float32"),
                      ops.cast(kernel, "float32")) + ops.cast(bias, "float32")


def top_token_indices(scores, valid, keep):
    """The positions of the `keep` highest `scores` `[B, n]` among the `valid` tokens (padded
    ones rank below every real one), in increasing order, int32 `[B, keep]`. The selection
    has no gradient."""
    ranked = ops.where(valid, ops.stop_gradient(scores), lowest_value("float32"))
    return ops.sort(ops.cast(ops.top_k(ranked, keep)[1], "int32"), axis=-1)


def gather_tokens(values, indices):
    """`values[b, indices[b, j]]` for `values` `[B, n]` or `[B, n, d]` and `indices` `[B, k]`."""
    if len(values.shape) == 2:
        return ops.take_along_axis(values, indices, axis=1)
    rows = ops.broadcast_to(indices[:, :, None], ops.shape(indices) + (values.shape[-1],))
    return ops.take_along_axis(values, rows, axis=1)


def score_weights(layer, width):
    """The weights `(w [d], b [])` of the token scores `s_i = h_i w + b`, added to `layer`
    (`w` drawn by its `kernel_initializer`, `b` zero)."""
    kernel = layer.add_weight(shape=(width,), initializer=layer.kernel_initializer,
                              name="kernel")
    return kernel, layer.add_weight(shape=(), initializer="zeros", name="bias")


class _Selection(NamedTuple):
    """The `keep` tokens of highest score chosen by `select_tokens`."""

    scores: object  # float32 [B, n], s_i of every token
    valid: object  # bool [B, n], the real tokens
    indices: object  # int32 [B, k], the kept positions in increasing order
    tokens: object  # [B, k, d], the kept tokens
    real: object  # bool [B, k], which kept tokens are real
    probabilities: object  # float32 [B, k], σ(s_i) of the kept tokens


def select_tokens(inputs, padding_mask, kernel, bias, keep):
    """The `keep` real tokens of `inputs` `[B, n, d]` of highest score `s_i = h_i w + b`
    (padded ones only after every real one), gathered in their original order."""
    scores = token_scores(inputs, kernel, bias)
    if padding_mask is None:
        valid = ops.ones(ops.shape(scores), "bool")
    else:
        valid = ops.cast(padding_mask, "bool")
    indices = top_token_indices(scores, valid, keep)
    return _Selection(
        scores=scores, valid=valid, indices=indices, tokens=gather_tokens(inputs, indices),
        real=ops.cast(gather_tokens(ops.cast(valid, "int32"), indices), "bool"),
        probabilities=ops.sigmoid(gather_tokens(scores, indices)))


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenPruning(keras.layers.Layer):
    """Keeps the `k = ⌈ρ·n⌉` tokens of highest learned score, in their original order.

    Survey §5.8: token pruning discards "tokens that are less important for representing the
    entire sequence" (Kim et al. 2023). Each token gets a score `s_i = h_i w + b` (a `Dense`
    to a scalar, float32); the `k` real tokens of highest score are kept (by `top_k`, so `k`
    is static and the layer compiles under XLA) and gathered in their original order. Padded
    tokens are ranked below every real one: they are kept only when a row has fewer than `k`
    real tokens, after all of them (which padded ones is the backend's `top_k` tie order),
    and are marked padding in the returned mask with zero outputs (a fully padded row gives
    zeros and an all-false mask, never NaN).

    The selection itself has no gradient; the scores are trained through a gate on the kept
    tokens (`gate`):
    - `"multiply"`: `h′_i = σ(s_i)·h_i` (the outputs are scaled by the gate, and the loss
      raises the gates of useful tokens);
    - `"straight_through"`: `h′_i = h_i·(1 + σ(s_i) − sg(σ(s_i)))`, `sg` the stop-gradient:
      the outputs equal the kept tokens exactly, and the gradient is that of `"multiply"`
      at `σ = 1`, `∂L/∂s_i = σ′(s_i)·⟨∂L/∂h′_i, h_i⟩`.

    Args:
        keep_ratio: float `ρ` in `(0, 1]`.
        gate: `"multiply"` (default) or `"straight_through"`.
        kernel_initializer: initializer of `w` (`b` starts at zero).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, n, d]`, `n` static.
        padding_mask: optional boolean `[B, n]`.

    Returns:
        `(outputs [B, k, d], padding_mask [B, k] bool, indices [B, k] int32)`, `indices` the
        kept positions in increasing order.

    Example:
    >>> layer = TokenPruning(keep_ratio=0.5)
    >>> y, mask, kept = layer(keras.random.normal((2, 6, 8)))  # (2, 3, 8), (2, 3), (2, 3)
    """

    def __init__(self, keep_ratio=0.5, gate="multiply", kernel_initializer="glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        self.keep_ratio = check_keep_ratio("keep_ratio", keep_ratio)
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}. Received: gate={gate!r}")
        self.gate = gate
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.width = None

    def build(self, inputs_shape, padding_mask_shape=None):
        self.width = known_width(inputs_shape)
        self.kernel, self.bias = score_weights(self, self.width)

    def _kept(self, inputs, padding_mask):
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        return static_kept_count(inputs, self.keep_ratio)

    def call(self, inputs, padding_mask=None):
        keep = self._kept(inputs, padding_mask)
        kept = select_tokens(inputs, padding_mask, self.kernel, self.bias, keep)
        gates = kept.probabilities
        if self.gate == "straight_through":
            gates = 1.0 + gates - ops.stop_gradient(gates)
        outputs = kept.tokens * ops.cast(gates, kept.tokens.dtype)[:, :, None]
        return zero_padded(outputs, kept.real), kept.real, kept.indices

    def compute_output_spec(self, inputs, padding_mask=None):
        keep = self._kept(inputs, padding_mask)
        batch = inputs.shape[0]
        return (keras.KerasTensor((batch, keep, inputs.shape[2]), dtype=self.compute_dtype),
                keras.KerasTensor((batch, keep), dtype="bool"),
                keras.KerasTensor((batch, keep), dtype="int32"))

    def get_config(self):
        config = super().get_config()
        config.update({
            "keep_ratio": self.keep_ratio,
            "gate": self.gate,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config
