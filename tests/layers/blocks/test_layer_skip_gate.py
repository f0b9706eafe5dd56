"""LayerSkipGate: a learned per-sequence decision to run or skip a layer (survey §5.6)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import LayerSkipGate
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.reference import layer_skipping as ref

B, T, D = 4, 6, 8


def _gate(rng, x, bias=0.0, **kwargs):
    """A built gate with a random kernel, so the probabilities spread around 0.5."""
    gate = LayerSkipGate(**kwargs)
    gate.build(x.shape)
    gate.kernel.assign(rng.normal(size=(D,)).astype("float32"))
    gate.bias.assign(np.float32(bias))
    return gate


def _weights(gate):
    return checks.to_float64(gate.kernel), float(checks.to_float64(gate.bias))


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return rng, random_normal(rng, (B, T, D)), random_normal(rng, (B, T, D))


@pytest.mark.parametrize("gate_form,training", [
    ("straight_through", False), ("straight_through", True), ("multiply", False),
    ("multiply", True),
])
@pytest.mark.parametrize("threshold,lengths", [
    (0.5, None), (0.5, (6, 2, 0, 4)), (0.3, (5, 6, 1, 3)), (0.7, (6, 0, 0, 6)),
])
def test_matches_reference(gate_form, training, threshold, lengths):
    rng, x, fx = _inputs(0)
    mask = None if lengths is None else padding_mask(lengths, T)
    gate = _gate(rng, x, gate=gate_form, threshold=threshold)
    results = gate(x, fx, padding_mask=mask, training=training, return_decision=True)
    expected, probability, run = ref.layer_skip_gate(
        x, fx, *_weights(gate), threshold, mask, gate_form, training)
    np.testing.assert_allclose(checks.to_numpy(results["probability"]), probability, rtol=1e-5)
    np.testing.assert_array_equal(checks.to_numpy(results["run"]), run)
    np.testing.assert_allclose(checks.to_numpy(results["outputs"]), expected, atol=1e-5)
    np.testing.assert_array_equal(checks.to_numpy(gate.decision(x, mask)), run)
    assert np.all(np.isfinite(checks.to_numpy(results["outputs"])))


def test_rows_take_different_decisions():
    """The test inputs of `test_matches_reference` do make some rows run and others skip."""
    rng, x, fx = _inputs(0)
    _, _, run = ref.layer_skip_gate(x, fx, *_weights(_gate(rng, x)), 0.5)
    assert run.any() and not run.all()


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("gate_form", ["straight_through", "multiply"])
def test_forced_open_and_closed(training, gate_form):
    """`b = ±30` saturates `p` to 1 or 0: the layer's outputs, or its inputs, exactly."""
    rng, x, fx = _inputs(1)
    mask = padding_mask((6, 3, 1, 6), T)
    opened = _gate(rng, x, bias=30.0, gate=gate_form)
    closed = _gate(rng, x, bias=-30.0, gate=gate_form)
    closed.kernel.assign(np.zeros(D, "float32"))
    opened.kernel.assign(np.zeros(D, "float32"))
    # Exact but for `x + 1·(f(x) − x)`, the soft gate's form.
    np.testing.assert_allclose(checks.to_numpy(opened(x, fx, padding_mask=mask,
                                                      training=training)), fx, atol=1e-6)
    np.testing.assert_array_equal(checks.to_numpy(closed(x, fx, padding_mask=mask,
                                                         training=training)), x)


def test_threshold_override_and_extremes():
    rng, x, fx = _inputs(2)
    gate = _gate(rng, x, threshold=0.5)
    probability = ref.run_probability(x, *_weights(gate))
    for threshold in (0.0, 0.35, 0.6, 1.0):
        np.testing.assert_array_equal(checks.to_numpy(gate.decision(x, threshold=threshold)),
                                      probability >= threshold)
    raises_naming("threshold", lambda: gate.decision(x, threshold=1.5))


@pytest.mark.parametrize("gate_form", ["straight_through", "multiply"])
def test_fully_padded_rows(gate_form):
    rng, x, fx = _inputs(3)
    mask = padding_mask((0, 3, 0, 6), T)
    gate = _gate(rng, x, bias=5.0, gate=gate_form)
    for training in (False, True):
        results = gate(x, fx, padding_mask=mask, training=training, return_decision=True)
        outputs = checks.to_numpy(results["outputs"])
        assert np.all(np.isfinite(outputs))
        assert np.all(np.isfinite(checks.to_numpy(results["probability"])))
        np.testing.assert_array_equal(outputs[[0, 2]], x[[0, 2]])
        assert not checks.to_numpy(results["run"])[[0, 2]].any()
    empty = np.zeros((B, T), bool)
    np.testing.assert_array_equal(checks.to_numpy(gate(x, fx, padding_mask=empty,
                                                       training=True)), x)
    assert checks.to_numpy(gate.losses[0]) == 0.0


@pytest.mark.parametrize("gate_form", ["straight_through", "multiply"])
def test_gradient_matches_reference(gate_form):
    """`∂L/∂s_b = σ′(s_b)⟨∂L/∂h′_b, f(h)_b − h_b⟩` reaches `w` and `b` (under `jax.jit` /
    `tf.function(jit_compile=True)`, eager on PyTorch)."""
    rng, x, fx = _inputs(4)
    upstream = random_normal(rng, (B, T, D))
    mask = padding_mask((6, 3, 0, 5), T)
    gate = _gate(rng, x, gate=gate_form, compute_loss_weight=0.0)

    def loss(kernel, bias, inputs, layer_outputs, weights):
        outputs, _ = gate.stateless_call([kernel, bias], [], inputs, layer_outputs,
                                         padding_mask=mask, training=True)
        return keras.ops.sum(outputs * weights)

    kernel, bias = checks.to_numpy(gate.kernel), np.asarray(checks.to_numpy(gate.bias))
    _, grads = checks.value_and_gradients(loss, [kernel, bias, x, fx, upstream])
    grad_w, grad_b = ref.bias_gradient(x, fx, *_weights(gate), upstream, mask)
    assert grad_b != 0
    np.testing.assert_allclose(grads[1], grad_b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads[0], grad_w, rtol=1e-4, atol=1e-5)


def test_compute_loss():
    rng, x, fx = _inputs(5)
    mask = padding_mask((6, 3, 0, 2), T)
    gate = _gate(rng, x, compute_loss_weight=0.3)
    gate(x, fx, padding_mask=mask)
    assert len(gate.losses) == 1
    expected = ref.compute_loss(x, *_weights(gate), 0.3, mask)
    np.testing.assert_allclose(checks.to_numpy(gate.losses[0]), expected, rtol=1e-5)
    quiet = _gate(rng, x, compute_loss_weight=0.0)
    quiet(x, fx, padding_mask=mask)
    assert not quiet.losses


def _model(gate):
    x = keras.Input((T, D))
    fx = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    return keras.Model([x, fx, mask], gate(x, fx, padding_mask=mask))


def _model_inputs(rng):
    return [random_normal(rng, (B, T, D)), random_normal(rng, (B, T, D)),
            padding_mask((6, 3, 0, 5), T)]


@pytest.mark.parametrize("gate_form", ["straight_through", "multiply"])
def test_fit_trains_the_gate(gate_form):
    rng = np.random.default_rng(6)
    gate = LayerSkipGate(gate=gate_form)
    model = _model(gate)
    checks.check_fit_step(model, _model_inputs(rng))
    assert not np.allclose(checks.to_numpy(gate.kernel), 0.0), "fit did not train the gate"


def test_config_and_saving(tmp_path):
    rng = np.random.default_rng(7)
    gate = LayerSkipGate(threshold=0.4, gate="multiply", compute_loss_weight=0.1,
                         initial_bias=1.5, kernel_initializer="glorot_uniform")
    clone = checks.check_config_round_trip(gate)
    assert (clone.threshold, clone.gate, clone.compute_loss_weight, clone.initial_bias) == (
        0.4, "multiply", 0.1, 1.5)
    model = _model(gate)
    assert checks.count_params(gate) == D + 1
    np.testing.assert_allclose(checks.to_numpy(gate.bias), 1.5)
    checks.randomize_weights(gate, rng)
    checks.check_saving(model, _model_inputs(rng), tmp_path)


@checks.xla_only
def test_jit_compile():
    rng = np.random.default_rng(8)
    checks.check_jit_compile(_model(LayerSkipGate()), _model_inputs(rng))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    rng = np.random.default_rng(9)
    outputs = checks.check_mixed_precision(
        lambda **kw: LayerSkipGate(**kw), _model_inputs(rng)[:2],
        call_kwargs={"return_decision": True}, policy=policy)
    assert keras.backend.standardize_dtype(outputs["probability"].dtype) == "float32"


@pytest.mark.parametrize("kwargs,name", [
    (dict(threshold=-0.1), "threshold"),
    (dict(threshold=1.1), "threshold"),
    (dict(threshold="half"), "threshold"),
    (dict(gate="hard"), "gate"),
    (dict(compute_loss_weight=-1.0), "compute_loss_weight"),
    (dict(compute_loss_weight=float("nan")), "compute_loss_weight"),
    (dict(initial_bias="high"), "initial_bias"),
    (dict(initial_bias=float("inf")), "initial_bias"),
    (dict(kernel_initializer="nope"), "kernel_initializer"),
])
def test_bad_arguments(kwargs, name):
    raises_naming(name, lambda: LayerSkipGate(**kwargs))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    x = np.zeros((B, T, D), "float32")
    raises_naming("padding_mask", lambda: LayerSkipGate()(x, x, padding_mask=mask))


def test_bad_inputs():
    x = np.zeros((B, T, D), "float32")
    gate = LayerSkipGate()
    gate(x, x)
    raises_naming("inputs", lambda: gate(np.zeros((B, T, D + 1), "float32"),
                                         np.zeros((B, T, D + 1), "float32")))
    raises_naming("layer_outputs", lambda: gate(x, np.zeros((B, T + 1, D), "float32")))
    raises_naming("layer_outputs", lambda: gate(x, np.zeros((B, T), "float32")))
    raises_naming("inputs", lambda: LayerSkipGate()(np.zeros((B, T), "float32"),
                                                    np.zeros((B, T), "float32")))
    raises_naming("inputs", lambda: LayerSkipGate()(keras.Input((T, None)),
                                                    keras.Input((T, None))))
