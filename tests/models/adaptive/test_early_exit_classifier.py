"""EarlyExitClassifier and EarlyExitPredictor: exits on chosen layers, the summed exit
losses, and inference that stops at the first exit whose criterion holds (survey §5.6)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.models import EarlyExitClassifier
from keras_xf.models import EarlyExitPredictor
from keras_xf.models import TextClassifier
from keras_xf.ops import exit_criteria
from keras_xf.training import EarlyExitLoss
from tests.layer_checks import check_saving
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_numpy
from tests.models.encoders.test_text_classifier import separable_task
from tests.models.tiny import SIZES
from tests.models.tiny import WIDTH
from tests.models.tiny import token_batch
from tests.reference import early_exit as ref

CLASSES = 3


def classifier(num_layers=3, **kwargs):
    return EarlyExitClassifier(num_classes=CLASSES, num_layers=num_layers, **{**SIZES, **kwargs})


def exit_values(model, x):
    """Every exit's logits `[B, E, C]` and pooled states `[B, E + 1, d]` (embeddings first),
    computed layer by layer."""
    mask = ops.cast(x["padding_mask"], "bool")
    hidden = model.embed(x)
    states, logits = [model.pooled_state(hidden, mask)], []
    for index, block in enumerate(model.blocks):
        hidden = block(hidden, padding_mask=mask, use_causal_mask=False)
        if index + 1 in model.exit_layers:
            states.append(model.pooled_state(hidden, mask))
            logits.append(model.exit_logits(len(logits), hidden, mask, pooled=states[-1]))
    return (np.stack([to_numpy(v) for v in logits], 1),
            np.stack([to_numpy(v) for v in states], 1).astype("float64"))


def between(values):
    """A threshold halfway between the two middle distinct values (no ties): at the first
    exit, about half the rows pass it."""
    values = np.unique(np.round(np.asarray(values, np.float64), 6))
    middle = len(values) // 2
    return float((values[middle - 1] + values[middle]) / 2)


@pytest.fixture
def trained(rng):
    """A 3-layer classifier with random weights large enough for confident predictions,
    and a batch of four sequences of different lengths."""
    model = classifier(exit_layers=[1, 2, 3], norm_placement="pre")
    randomize_weights(model, rng, scale=0.5)
    return model, token_batch(rng, batch=4, lengths=[8, 6, 3, 7])


def test_every_exit_by_default_and_outputs(rng):
    model = classifier()
    x = token_batch(rng, lengths=[8, 0])
    logits = to_numpy(model(x))
    assert model.exit_layers == [1, 2, 3] and logits.shape == (2, 3, CLASSES)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()  # fully padded row too


def test_last_exit_equals_text_classifier(rng):
    """One exit on the last layer is `TextClassifier` with the same weights."""
    model = classifier(num_layers=2, exit_layers=[2], pooling="cls", norm_placement="pre")
    plain = TextClassifier(num_classes=CLASSES, num_layers=2, pooling="cls",
                           norm_placement="pre", **SIZES)
    randomize_weights(model, rng)
    plain.set_weights(model.get_weights())
    x = token_batch(rng, lengths=[8, 5])
    np.testing.assert_allclose(to_numpy(model(x))[:, 0], to_numpy(plain(x)), atol=1e-5)


def test_exit_logits_equal_the_layerwise_computation(trained):
    model, x = trained
    logits, _ = exit_values(model, x)
    np.testing.assert_allclose(to_numpy(model(x)), logits, atol=1e-5)


def test_shared_head_has_one_output_layer(rng):
    per_layer, shared = classifier(), classifier(exit_heads="shared")
    head = WIDTH * CLASSES + CLASSES
    assert per_layer.count_params() - shared.count_params() == 2 * head
    assert len(shared.heads.heads) == 1 and len(per_layer.heads.heads) == 3


def test_loss_equals_reference(rng):
    logits = rng.normal(size=(4, 3, CLASSES)).astype("float32") * 3
    labels = np.array([0, 2, 1, 2])
    weights = [0.2, 0.5, 1.0]
    value = EarlyExitLoss(weights=weights)(labels, logits)
    np.testing.assert_allclose(to_numpy(value), ref.exit_losses(labels, logits, weights).mean(),
                               rtol=1e-5)
    with pytest.raises(ValueError, match="one value per exit"):
        EarlyExitLoss(weights=[1.0, 1.0])(labels, logits)


def test_criteria_equal_reference(rng):
    logits = rng.normal(size=(5, CLASSES)).astype("float32") * 2
    other = rng.normal(size=(5, CLASSES)).astype("float32") * 2
    a, b = rng.normal(size=(2, 5, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(exit_criteria.prediction_entropy(logits)),
                               ref.entropy(logits), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(exit_criteria.max_probability(logits)),
                               ref.max_probability(logits), rtol=1e-5)
    np.testing.assert_allclose(to_numpy(exit_criteria.state_similarity(a, b)),
                               ref.cosine(a, b), rtol=1e-5, atol=1e-6)
    count = exit_criteria.unchanged_predictions(logits, other, np.array([0, 1, 2, 3, 4]))
    same = logits.argmax(-1) == other.argmax(-1)
    np.testing.assert_array_equal(to_numpy(count), np.where(same, np.arange(5) + 1, 0))
    stop = np.array([0.2, 0.55, 0.6, 0.9])
    np.testing.assert_array_equal(to_numpy(exit_criteria.stop_by_margin(stop, 0.15)),
                                  ref.stop_by_margin(stop, 0.15))


@pytest.mark.parametrize("criterion", ["entropy", "max_probability", "state_similarity",
                                       "patience"])
def test_predictor_exits_as_the_reference(trained, criterion):
    model, x = trained
    logits, states = exit_values(model, x)
    if criterion == "entropy":
        threshold = between(ref.entropy(logits[:, 0]))
    elif criterion == "max_probability":
        threshold = between(ref.max_probability(logits[:, 0]))
    elif criterion == "state_similarity":
        threshold = between(ref.cosine(states[:, 1], states[:, 0]))
    else:
        threshold = 1
    expected_logits, expected_layers = ref.early_exits(logits, states, model.exit_layers,
                                                       criterion, threshold)
    result = model.early_exit_predictor(criterion, threshold).predict(x, verbose=0)
    np.testing.assert_array_equal(result["exit_layer"], expected_layers)
    np.testing.assert_allclose(result["logits"], expected_logits, atol=1e-5)
    if criterion != "patience":
        assert len(set(expected_layers.tolist())) > 1  # the rows exit at different layers


def test_predictor_skips_the_layers_after_every_row_exited(trained):
    """Every row exits at layer 1 (`max_probability ≥ 0`): on TensorFlow and PyTorch the
    branch of the later layers does not run; under JAX each layer is a `cond`."""
    model, x = trained
    predictor = model.early_exit_predictor("max_probability", 0.0)
    if keras.config.backend() == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda ids, mask: predictor(
            {"token_ids": ids, "padding_mask": mask})["exit_layer"])(
            x["token_ids"], x["padding_mask"])
        assert sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns) == len(model.blocks)
        return
    calls = []
    for index, block in enumerate(model.blocks):
        call = block.call
        block.call = lambda *a, _call=call, _index=index, **k: calls.append(_index) or _call(
            *a, **k)
    result = predictor(x)
    assert to_numpy(result["exit_layer"]).tolist() == [1, 1, 1, 1]
    assert calls == [0]


def test_predictor_compiles_with_xla(trained):
    model, x = trained
    predictor = model.early_exit_predictor("entropy", 0.5)
    expected = predictor.predict(x, verbose=0)
    if keras.config.backend() == "torch":
        pytest.skip("Keras compiles PyTorch models with torch.compile, not XLA")
    predictor.compile(jit_compile=True)
    actual = predictor.predict(x, verbose=0)
    np.testing.assert_array_equal(actual["exit_layer"], expected["exit_layer"])
    np.testing.assert_allclose(actual["logits"], expected["logits"], atol=1e-5)


def test_fit_lowers_every_exit_loss(rng):
    x, y = separable_task(rng)
    model = classifier(num_layers=2, exit_heads="shared", exit_loss_weights=[0.5, 1.0])
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = ref.exit_losses(y, model.predict(x, verbose=0))
    history = model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    after = ref.exit_losses(y, model.predict(x, verbose=0))
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert after.mean() < before.mean()
    assert "accuracy" in history.history


def test_saving_and_predictor_config(trained, tmp_path):
    model, x = trained
    loaded = check_saving(model, x, tmp_path, atol=1e-5)
    predictor = loaded.early_exit_predictor("patience", 2)
    clone = EarlyExitPredictor.from_config(predictor.get_config())
    clone.classifier.set_weights(loaded.get_weights())
    np.testing.assert_array_equal(clone.predict(x, verbose=0)["exit_layer"],
                                  predictor.predict(x, verbose=0)["exit_layer"])


@pytest.mark.parametrize("kwargs, match", [
    ({"exit_layers": [1, 2]}, "exit_layers"),
    ({"exit_layers": [2, 1, 3]}, "exit_layers"),
    ({"exit_layers": [0, 3]}, "exit_layers"),
    ({"exit_heads": "tied"}, "exit_heads"),
    ({"exit_loss_weights": [1.0]}, "exit_loss_weights"),
    ({"causal": True}, "backbone"),
    ({"reversible": True}, "backbone"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        classifier(**kwargs)


@pytest.mark.parametrize("criterion, threshold, match", [
    ("depth", 0.5, "criterion"), ("patience", 0.5, "threshold"), ("entropy", "low", "threshold"),
])
def test_bad_predictor_arguments(criterion, threshold, match):
    with pytest.raises(ValueError, match=match):
        classifier(num_layers=1).early_exit_predictor(criterion, threshold)


def test_predictor_checks_its_inputs(rng):
    predictor = classifier(num_layers=1).early_exit_predictor("entropy", 0.5)
    x = token_batch(rng)
    x["padding_mask"] = x["padding_mask"][:, :5]
    with pytest.raises(ValueError, match="padding_mask"):
        predictor(x)
