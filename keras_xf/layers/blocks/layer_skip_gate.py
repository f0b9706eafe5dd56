"""Learned layer skipping: a per-sequence decision to run or skip one layer (survey §5.6)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_finite_number
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_probability
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.gates import GATES
from keras_xf.ops.gates import gated_update
from keras_xf.ops.masks import masked_mean


@keras.saving.register_keras_serializable(package="keras_xf")
class LayerSkipGate(keras.layers.Layer):
    """Decides for each sequence whether a layer runs or is skipped (the identity).

    Survey §5.6 (skipping models: a classifier decides whether a layer is dropped): from the
    layer's inputs `h` `[B, T, d]`, the mean of each sequence's real tokens gives the
    probability that the layer runs for that sequence, in float32,

        p = σ(w · mean_{j real} h_j + b),

    and the layer's outputs `f(h)` are mixed in as `h′ = h + g · (f(h) − h)`:

    - inference: `g = 1[p ≥ τ]` (`threshold`): `h′ = f(h)` or `h′ = h`, a hard decision per
      sequence (a model that skips the computation itself asks `decision` before running
      the layer, e.g. `LayerSkippingPredictor`);
    - training, `gate="straight_through"` (default): `g = 1[p ≥ τ] + p − sg(p)` (`sg`: the
      stop-gradient): the outputs of inference, with the gradient
      `∂L/∂s = σ′(s) · ⟨∂L/∂h′, f(h) − h⟩` of the soft gate (`f(h)` is computed in training
      for every sequence, so a skipped layer can learn to run);
    - training, `gate="multiply"`: `g = p`, the soft decision (threshold not applied).

    A sequence with no real token skips the layer (`g = 0`, no gradient).

    Compute penalty (`add_loss`, float32): `λ · mean_b p_b` over the sequences with a real
    token, the expected fraction of the batch that runs the layer; summed over the gates of
    an encoder it is `λ` times the expected number of layers run per input, which the model
    trades against its task loss (`compute_loss_weight = 0`: no penalty).

    The gate starts with `w = 0` and `b = initial_bias` (`σ(2) ≈ 0.88`: every layer runs at
    first, the model begins as the plain encoder and learns which layers to skip).

    Args:
        threshold: float `τ` in `[0, 1]`: the layer runs when `p ≥ τ` (`τ = 0`: always).
        gate: `"straight_through"` (default) or `"multiply"`.
        compute_loss_weight: float `λ ≥ 0`, the weight of the compute penalty.
        initial_bias: float, the starting value of `b`.
        kernel_initializer: initializer of `w` (default zeros).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: the layer's inputs `h`, `[B, T, d]`.
        layer_outputs: the layer's outputs `f(h)`, `[B, T, d]`.
        padding_mask: optional boolean `[B, T]`, the real tokens of `h`.
        training: bool.
        return_decision: bool, also return `p` and the hard decision.

    Returns:
        `h′` `[B, T, d]`, or with `return_decision=True` `{"outputs": [B, T, d],
        "probability": float32 [B], "run": bool [B]}`.

    Example:
    >>> gate = LayerSkipGate(threshold=0.5, compute_loss_weight=0.01)
    >>> block = TransformerBlock(MultiHeadAttention(2), FeedForward(16))
    >>> h = keras.random.normal((2, 6, 8))
    >>> mask = np.arange(6) < np.array([[6], [3]])
    >>> y = gate(h, block(h, padding_mask=mask), padding_mask=mask)
    """

    def __init__(self, threshold=0.5, gate="straight_through", compute_loss_weight=0.01,
                 initial_bias=2.0, kernel_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        self.threshold = check_probability("threshold", threshold)
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}. Received: gate={gate!r}")
        self.gate = gate
        self.compute_loss_weight = float(check_positive_number(
            "compute_loss_weight", compute_loss_weight, allow_zero=True))
        self.initial_bias = float(check_finite_number("initial_bias", initial_bias))
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.width = None

    def build(self, inputs_shape, layer_outputs_shape=None, padding_mask_shape=None):
        inputs_shape = tuple(inputs_shape)
        width = inputs_shape[-1]
        if len(inputs_shape) != 3 or not isinstance(width, int):
            raise ValueError(f"inputs must have shape [batch, length, dim] with a known dim. "
                             f"Received: inputs.shape={inputs_shape}")
        self.width = width
        self.kernel = self.add_weight(shape=(width,), initializer=self.kernel_initializer,
                                      name="kernel")
        self.bias = self.add_weight(
            shape=(), initializer=keras.initializers.Constant(self.initial_bias), name="bias")

    def probability(self, inputs, padding_mask=None):
        """`p = σ(w · mean_{j real} h_j + b)`, float32 `[B]`."""
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        pooled = masked_mean(inputs, padding_mask)
        scores = ops.matmul(pooled, ops.cast(self.kernel, "float32"))
        return ops.sigmoid(scores + ops.cast(self.bias, "float32"))

    def decision(self, inputs, padding_mask=None, threshold=None, probability=None):
        """Whether the layer runs for each sequence: `p ≥ τ` and a real token, bool `[B]`
        (`threshold`: `τ` in place of the layer's; `probability`: `p` if already known)."""
        threshold = self.threshold if threshold is None else check_probability(
            "threshold", threshold)
        if probability is None:
            probability = self.probability(inputs, padding_mask)
        return ops.logical_and(probability >= threshold, _has_tokens(inputs, padding_mask))

    def call(self, inputs, layer_outputs, padding_mask=None, training=None,
             return_decision=False):
        _check_layer_outputs(layer_outputs, inputs)
        probability = self.probability(inputs, padding_mask)
        run = self.decision(inputs, padding_mask, probability=probability)
        active = _has_tokens(inputs, padding_mask)
        outputs = gated_update(inputs, ops.cast(layer_outputs, inputs.dtype),
                               probability[:, None, None], run[:, None, None],
                               active[:, None, None], self.gate, bool(training))
        self._add_compute_loss(probability, active)
        if not return_decision:
            return outputs
        return {"outputs": outputs, "probability": probability, "run": run}

    def _add_compute_loss(self, probability, active):
        """`λ · mean p` over the sequences with a real token."""
        if self.compute_loss_weight == 0:
            return
        weights = ops.cast(active, "float32")
        rate = ops.sum(probability * weights) / ops.maximum(ops.sum(weights), 1.0)
        self.add_loss(self.compute_loss_weight * rate)

    def compute_output_shape(self, inputs_shape, layer_outputs_shape=None,
                             padding_mask_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, layer_outputs, padding_mask=None, training=None,
                            return_decision=False):
        check_sequence_width(inputs, self.width)
        _check_layer_outputs(layer_outputs, inputs)
        check_padding_mask(padding_mask, inputs)
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_decision:
            return outputs
        batch = (inputs.shape[0],)
        return {"outputs": outputs,
                "probability": keras.KerasTensor(batch, dtype="float32"),
                "run": keras.KerasTensor(batch, dtype="bool")}

    def get_config(self):
        config = super().get_config()
        config.update({
            "threshold": self.threshold,
            "gate": self.gate,
            "compute_loss_weight": self.compute_loss_weight,
            "initial_bias": self.initial_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config


def _has_tokens(inputs, padding_mask):
    """Whether each sequence has a real token, bool `[B]`."""
    if padding_mask is None:
        return ops.ones((ops.shape(inputs)[0],), "bool")
    return ops.any(ops.cast(padding_mask, "bool"), axis=1)


def _check_layer_outputs(layer_outputs, inputs):
    shape, expected = tuple(layer_outputs.shape), tuple(inputs.shape)
    if len(shape) != len(expected) or any(
            isinstance(r, int) and isinstance(e, int) and r != e for r, e in zip(shape, expected)):
        raise ValueError("layer_outputs must have the shape of inputs, "
                         f"inputs.shape={expected}. Received: layer_outputs.shape={shape}")
