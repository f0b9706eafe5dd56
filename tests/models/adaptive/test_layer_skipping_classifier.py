"""LayerSkippingClassifier and LayerSkippingPredictor: a learned gate decides per input
whether each encoder layer runs, and inference computes only the layers some input runs
(survey §5.6)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.models import LayerSkippingClassifier
from keras_xf.models import LayerSkippingPredictor
from keras_xf.models import TextClassifier
from tests.layer_checks import check_saving
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.models.tiny import SIZES
from tests.models.tiny import WIDTH
from tests.models.tiny import token_batch
from tests.reference import layer_skipping as ref

CLASSES = 3
LAYERS = 3


def classifier(num_layers=LAYERS, **kwargs):
    return LayerSkippingClassifier(num_classes=CLASSES, num_layers=num_layers,
                                   **{**SIZES, **kwargs})


def set_gates(model, biases, kernels=None):
    for index, gate in enumerate(model.gates):
        kernel = np.zeros(WIDTH) if kernels is None else kernels[index]
        gate.kernel.assign(np.asarray(kernel, "float32"))
        gate.bias.assign(np.float32(biases[index]))


def logits_of(model, hidden, mask):
    """The head on the pooled final states `hidden` (numpy)."""
    hidden = ops.convert_to_tensor(np.asarray(hidden, "float32"))
    return to_numpy(model.head(model.pooled_state(hidden, ops.cast(mask, "bool"))))


def reference_run(model, x, threshold):
    """The numpy oracle on the model's embeddings, blocks (one sequence at a time) and gate
    weights: final states `[B, T, d]` and the layers run `[B, L]`."""
    def layer_fn(block):
        return lambda h, m: to_float64(block(h[None].astype("float32"), padding_mask=m[None],
                                             use_causal_mask=False))[0]

    hidden = to_float64(model.embed(x))
    return ref.layer_skipping(hidden, [layer_fn(b) for b in model.blocks],
                              [to_float64(g.kernel) for g in model.gates],
                              [float(to_float64(g.bias)) for g in model.gates], threshold,
                              x["padding_mask"].astype(bool))


@pytest.fixture
def trained(rng):
    """A 3-layer pre-norm classifier with random weights and gates whose decisions differ
    between the rows, and four sequences of different lengths (the last fully padded)."""
    model = classifier(norm_placement="pre")
    randomize_weights(model, rng, scale=0.5)
    set_gates(model, [0.0, 0.3, -0.2], rng.normal(size=(LAYERS, WIDTH)) * 2.0)
    return model, token_batch(rng, batch=4, lengths=[8, 6, 3, 0])


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_gates_forced_open_equal_text_classifier(rng, pooling):
    model = classifier(pooling=pooling, norm_placement="pre")
    plain = TextClassifier(num_classes=CLASSES, num_layers=LAYERS, pooling=pooling,
                           norm_placement="pre", **SIZES)
    randomize_weights(model, rng)
    set_gates(model, [30.0] * LAYERS)
    plain.backbone.set_weights(model.backbone.get_weights())
    plain.head.set_weights(model.head.get_weights())
    x = token_batch(rng, lengths=[8, 5])
    expected = to_numpy(plain(x))
    for training in (False, True):
        np.testing.assert_allclose(to_numpy(model(x, training=training)), expected, atol=1e-5)
    result = model.layer_skipping_predictor().predict(x, verbose=0)
    np.testing.assert_allclose(result["logits"], expected, atol=1e-5)
    assert result["num_executed_layers"].tolist() == [LAYERS, LAYERS]


def test_gates_forced_closed_leave_embeddings_and_final_norm(trained):
    model, x = trained
    set_gates(model, [-30.0] * LAYERS)
    mask = x["padding_mask"]
    norm = model.backbone.transformer_stack.output_norm
    expected = to_numpy(model.head(model.pooling(norm(model.embed(x)),
                                                 padding_mask=ops.cast(mask, "bool"))))
    for training in (False, True):
        logits = to_numpy(model(x, training=training))
        np.testing.assert_allclose(logits, expected, atol=1e-5)
        assert np.isfinite(logits).all()
    result = model.layer_skipping_predictor().predict(x, verbose=0)
    np.testing.assert_allclose(result["logits"], expected, atol=1e-5)
    assert result["num_executed_layers"].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_predictor_equals_reference(trained, threshold):
    model, x = trained
    tau = 0.5 if threshold is None else threshold
    states, executed = reference_run(model, x, tau)
    expected = logits_of(model, states, x["padding_mask"])
    result = model.layer_skipping_predictor(threshold).predict(x, verbose=0)
    np.testing.assert_array_equal(result["executed_layers"], executed)
    np.testing.assert_array_equal(result["num_executed_layers"], executed.sum(axis=1))
    np.testing.assert_allclose(result["logits"], expected, atol=1e-4)
    assert np.isfinite(result["logits"]).all()
    # The rows with tokens run different subsets of the layers; the padded row runs none.
    assert len({tuple(row) for row in executed[:3].tolist()}) > 1
    assert not executed[3].any()
    if threshold is None:  # the classifier's inference output is the predictor's
        np.testing.assert_allclose(to_numpy(model(x)), result["logits"], atol=1e-4)


def test_predictor_with_batch_size_one_gives_each_input_its_depth(trained):
    model, x = trained
    _, executed = reference_run(model, x, 0.5)
    result = model.layer_skipping_predictor().predict(x, batch_size=1, verbose=0)
    np.testing.assert_array_equal(result["executed_layers"], executed)


def test_skipped_layers_are_not_computed(trained):
    """Layer 1 runs for every row, layers 2 and 3 for none: on TensorFlow and PyTorch the
    later layers' branch does not run; under JAX each layer is a `cond`."""
    model, x = trained
    set_gates(model, [30.0, -30.0, -30.0])
    predictor = model.layer_skipping_predictor()
    if keras.config.backend() == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda ids, mask: predictor(
            {"token_ids": ids, "padding_mask": mask})["logits"])(
            x["token_ids"], x["padding_mask"])
        assert sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns) == LAYERS
        return
    calls = []
    for index, block in enumerate(model.blocks):
        call = block.call
        block.call = lambda *a, _call=call, _index=index, **k: calls.append(_index) or _call(
            *a, **k)
    result = predictor(x)
    assert to_numpy(result["num_executed_layers"]).tolist() == [1, 1, 1, 0]
    assert calls == [0]


def test_predictor_compiles_with_xla(trained):
    model, x = trained
    predictor = model.layer_skipping_predictor()
    expected = predictor.predict(x, verbose=0)
    if keras.config.backend() == "torch":
        pytest.skip("Keras compiles PyTorch models with torch.compile, not XLA")
    predictor.compile(jit_compile=True)
    actual = predictor.predict(x, verbose=0)
    np.testing.assert_array_equal(actual["executed_layers"], expected["executed_layers"])
    np.testing.assert_allclose(actual["logits"], expected["logits"], atol=1e-5)


def test_fit_adds_the_compute_penalty(rng):
    """Each gate adds `λ · mean p` to the losses; `fit` minimises it with the task loss."""
    model = classifier(num_layers=2, compute_loss_weight=1.0)
    x = token_batch(rng, batch=4, lengths=[8, 6, 3, 0])
    y = np.array([0, 1, 2, 1])
    model(x)
    assert len(model.losses) == 2
    p = 1 / (1 + np.exp(-2.0))  # w = 0, b = 2 at first: every row's probability
    np.testing.assert_allclose(sum(to_numpy(v) for v in model.losses), 2 * p, rtol=1e-5)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    task = float(to_numpy(cross_entropy(y, model.predict(x, verbose=0))))
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0)[0], task + 2 * p, rtol=1e-4)
    before = [float(to_numpy(g.bias)) for g in model.gates]
    history = model.fit(x, y, epochs=3, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = [float(to_numpy(g.bias)) for g in model.gates]
    assert all(a < b for a, b in zip(after, before)), (before, after)


def test_saving_and_predictor_config(trained, tmp_path):
    model, x = trained
    loaded = check_saving(model, x, tmp_path, atol=1e-5)
    assert [g.name for g in loaded.gates] == [g.name for g in model.gates]
    predictor = loaded.layer_skipping_predictor(0.4)
    clone = LayerSkippingPredictor.from_config(predictor.get_config())
    clone.classifier.set_weights(loaded.get_weights())
    np.testing.assert_array_equal(clone.predict(x, verbose=0)["executed_layers"],
                                  predictor.predict(x, verbose=0)["executed_layers"])
    assert clone.threshold == 0.4


@pytest.mark.parametrize("kwargs, match", [
    ({"threshold": 1.5}, "threshold"),
    ({"gate": "hard"}, "gate"),
    ({"compute_loss_weight": -1.0}, "compute_loss_weight"),
    ({"initial_bias": "high"}, "initial_bias"),
    ({"causal": True}, "backbone"),
    ({"reversible": True}, "backbone"),
    ({"num_classes": 0}, "num_classes"),
])
def test_bad_configuration(kwargs, match):
    kwargs = {"num_classes": CLASSES, **kwargs}
    with pytest.raises(ValueError, match=match):
        LayerSkippingClassifier(num_layers=1, **{**SIZES, **kwargs})


def test_bad_predictor_arguments_and_inputs(rng):
    model = classifier(num_layers=1)
    with pytest.raises(ValueError, match="threshold"):
        model.layer_skipping_predictor(-0.5)
    with pytest.raises(ValueError, match="classifier"):
        LayerSkippingPredictor(TextClassifier(num_classes=2, num_layers=1, **SIZES))
    x = token_batch(rng)
    x["padding_mask"] = x["padding_mask"][:, :5]
    with pytest.raises(ValueError, match="padding_mask"):
        model.layer_skipping_predictor()(x)


def test_mixed_precision(rng):
    model = classifier(num_layers=2, dtype="mixed_bfloat16")
    x = token_batch(rng, batch=4, lengths=[8, 6, 3, 0])
    logits = model(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in model.weights)
    assert all(g.compute_dtype == "bfloat16" for g in model.gates)
    result = model.layer_skipping_predictor().predict(x, verbose=0)
    assert np.isfinite(result["logits"]).all()
    assert result["num_executed_layers"].tolist() == [2, 2, 2, 0]
