"""Knowledge distillation (survey §5.7): the masked soft-target and hidden-state losses against
the numpy reference, `Distiller.fit` with any keras_xf teacher and student, the projection of
hidden states of another width, sequence-level data from the teacher's outputs, and errors."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.ops import hidden_state_loss
from keras_xf.ops import soft_target_loss
from keras_xf.training import Distiller
from keras_xf.training import sequence_distillation_data
from keras_xf.training.distiller import feature_outputs
from tests.models import tiny
from tests.reference import distillation as reference

END = 2


def numpy(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize("kind", ["kl", "cross_entropy"])
def test_soft_target_loss_matches_reference(kind):
    rng = np.random.default_rng(0)
    teacher, student = rng.normal(size=(2, 2, 5, 7)) * 3
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], "float32")
    got = soft_target_loss(teacher, student, 2.0, mask, kind=kind)
    np.testing.assert_allclose(numpy(got), reference.soft_target_loss(teacher, student, 2.0,
                                                                      mask, kind), rtol=1e-5)
    # Padding positions do not count: changing them leaves the loss as it is.
    changed = student.copy()
    changed[0, 3:] = 100.0
    np.testing.assert_allclose(numpy(soft_target_loss(teacher, changed, 2.0, mask, kind=kind)),
                               numpy(got), rtol=1e-6)
    assert numpy(got).dtype == np.float32


def test_soft_target_loss_is_zero_for_equal_logits_and_per_example_weights():
    logits = np.random.default_rng(1).normal(size=(3, 4)).astype("float32")
    assert abs(float(numpy(soft_target_loss(logits, logits, 3.0)))) < 1e-6
    weights = np.array([1.0, 0.0, 2.0], "float32")
    other = logits[::-1].copy()
    np.testing.assert_allclose(numpy(soft_target_loss(logits, other, 3.0, weights)),
                               reference.soft_target_loss(logits, other, 3.0, weights), rtol=1e-5)


def test_hidden_state_loss_matches_reference():
    rng = np.random.default_rng(2)
    teacher, student = rng.normal(size=(2, 2, 4, 6))
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], "float32")
    np.testing.assert_allclose(numpy(hidden_state_loss(teacher, student, mask)),
                               reference.hidden_state_loss(teacher, student, mask), rtol=1e-5)


@pytest.fixture(scope="module")
def pair():
    """A CausalLM teacher and a student of half its depth and width (frozen teacher and
    untrained student: the tests below never fit them)."""
    keras.utils.set_random_seed(0)
    teacher = tiny.randomize_embeddings(tiny.causal_lm(num_layers=2))
    student = tiny.causal_lm(num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16)
    return teacher, student


def test_distiller_loss_equals_reference_with_projection(pair):
    """α·L_hard + (1−α)·T²·KL + β·MSE(h̃, hW) with a student of half the width: the
    projection `W` is learned, padding is excluded by the `padding_mask` input."""
    teacher, student = pair
    distiller = Distiller(teacher, student, temperature=2.0, alpha=0.3, hidden_state_weight=0.5,
                          hidden_states=[("backbone", "backbone")])
    distiller.compile("adam")
    assert distiller.projections[0].kernel.shape == (8, tiny.WIDTH)
    x = tiny.token_batch(np.random.default_rng(3), lengths=[8, 5])
    y = np.random.default_rng(4).integers(1, tiny.VOCAB, size=(2, 8)).astype("int32")
    loss = distiller.compute_loss(x, y, training=False)

    mask = x["padding_mask"]
    z_t, z_s = (numpy(m(x)) for m in (teacher, student))
    h_t = numpy(teacher.backbone(x))
    h_s = numpy(student.backbone(x))
    log_p = reference.log_softmax(z_s.astype("float64"))
    hard = -np.take_along_axis(log_p, y[..., None], -1).mean()
    expected = (0.3 * hard + 0.7 * reference.soft_target_loss(z_t, z_s, 2.0, mask)
                + 0.5 * reference.hidden_state_loss(
                    h_t, h_s, mask, numpy(distiller.projections[0].kernel)))
    np.testing.assert_allclose(numpy(loss), expected, rtol=1e-4)


def test_sample_weight_masks_the_soft_loss_of_a_classifier():
    keras.utils.set_random_seed(1)
    teacher = tiny.text_classifier(num_classes=3, num_layers=2)
    student = tiny.text_classifier(num_classes=3, num_layers=1)
    distiller = Distiller(teacher, student, temperature=3.0, alpha=0.0, soft_loss="cross_entropy")
    distiller.compile("adam")
    x, y = tiny.batch_for(teacher, np.random.default_rng(5))
    weights = np.array([1.0, 0.0], "float32")
    loss = distiller.compute_loss(x, y, sample_weight=weights, training=False)
    expected = reference.soft_target_loss(numpy(teacher(x)), numpy(student(x)), 3.0, weights,
                                          "cross_entropy")
    np.testing.assert_allclose(numpy(loss), expected, rtol=1e-5)


def test_fit_trains_the_student_and_leaves_the_teacher_unchanged():
    keras.utils.set_random_seed(2)
    teacher = tiny.randomize_embeddings(tiny.seq2seq_lm(num_layers=2))
    student = tiny.seq2seq_lm(num_layers=1)
    distiller = Distiller(teacher, student, temperature=2.0, alpha=0.5, hidden_states=[
        ("backbone/encoder_sequence_output", "backbone/encoder_sequence_output"),
        ("backbone/decoder_sequence_output", "backbone/decoder_sequence_output"),
    ])
    assert distiller._masks == ["encoder_padding_mask", "logits"]
    assert all(projection is None for projection in distiller.projections)
    distiller.compile(keras.optimizers.Adam(1e-2))
    x, y = tiny.batch_for(teacher, np.random.default_rng(6), batch=4)
    x["encoder_padding_mask"][0, 5:] = 0
    teacher_before = [numpy(w) for w in teacher.weights]
    student_before = [numpy(w) for w in student.weights]
    history = distiller.fit(x, y, sample_weight=x["decoder_padding_mask"].astype("float32"),
                            epochs=6, batch_size=4, verbose=0)
    losses = history.history["total_loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert {"student_loss", "distillation_loss", "hidden_state_loss"} <= set(history.history)
    for before, weight in zip(teacher_before, teacher.weights):
        np.testing.assert_array_equal(before, numpy(weight))
    assert any(not np.array_equal(b, numpy(w)) for b, w in zip(student_before, student.weights))
    assert len(distiller.trainable_weights) == len(student.trainable_weights)


def test_config_round_trip(pair):
    teacher, student = pair
    distiller = Distiller(teacher, student, temperature=4.0, alpha=0.25, soft_loss="cross_entropy",
                          hidden_states=[("backbone", "backbone", None)], hidden_state_weight=2.0)
    config = distiller.get_config()
    restored = Distiller.from_config(config)
    assert restored.get_config()["hidden_states"] == config["hidden_states"]
    for key in ("temperature", "alpha", "soft_loss", "hidden_state_weight"):
        assert getattr(restored, key) == getattr(distiller, key)
    assert restored._masks == [None]
    assert restored.student.count_params() == student.count_params()


def test_feature_outputs_are_the_layers_outputs_in_the_model_graph(pair):
    """The task's backbone and a layer of a plain functional model, read from one pass that
    gives the model's own outputs, with the model's weights (no copy)."""
    teacher, _ = pair
    inputs, logits, [states] = feature_outputs(teacher, ["backbone"])
    features = keras.Model(inputs, {"logits": logits, "states": states})
    x = tiny.token_batch(np.random.default_rng(4))
    out = features(x)
    np.testing.assert_allclose(numpy(out["logits"]), numpy(teacher(x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(numpy(out["states"]), numpy(teacher.backbone(x)), rtol=1e-5,
                               atol=1e-6)
    assert {id(w) for w in features.weights} == {id(w) for w in teacher.weights}

    token_inputs = keras.Input((3,))
    hidden = keras.layers.Dense(5, name="hidden")(token_inputs)
    model = keras.Model(token_inputs, keras.layers.Dense(2, name="out")(hidden))
    inputs, _, [state] = feature_outputs(model, ["hidden"])
    values = np.ones((2, 3), "float32")
    np.testing.assert_allclose(numpy(keras.Model(inputs, state)(values)),
                               numpy(model.get_layer("hidden")(values)), rtol=1e-6)


def test_a_layer_called_twice_is_refused():
    token_inputs = keras.Input((3,))
    shared = keras.layers.Dense(3, name="shared")
    model = keras.Model(token_inputs, shared(shared(token_inputs)))
    with pytest.raises(ValueError, match="called 2 times"):
        feature_outputs(model, ["shared"])


def test_sequence_distillation_data_is_the_teacher_beam_output_shifted():
    """Decoded in batches of 3 (the last one filled up to 3 rows: one compiled beam-search
    loop, reused below)."""
    keras.utils.set_random_seed(3)
    teacher = tiny.randomize_embeddings(tiny.seq2seq_lm(num_layers=1))
    source = tiny.token_batch(np.random.default_rng(7), batch=4, lengths=[8, 6, 4, 7])
    inputs = {"encoder_token_ids": source["token_ids"],
              "encoder_padding_mask": source["padding_mask"]}
    x, y, weights = sequence_distillation_data(teacher, inputs, max_length=6,
                                               stop_token_ids=[END], sampler="beam",
                                               batch_size=3)
    outputs = [teacher.generate({k: v[rows] for k, v in inputs.items()}, max_length=6,
                                stop_token_ids=[END], sampler="beam")
               for rows in ([0, 1, 2], [3, 3, 3])]
    ids = np.concatenate([o["decoder_token_ids"] for o in outputs])[:4]
    mask = np.concatenate([o["decoder_padding_mask"] for o in outputs]).astype(bool)[:4]
    assert x["decoder_token_ids"].shape == y.shape == weights.shape == (4, 5)
    np.testing.assert_array_equal(x["encoder_token_ids"], inputs["encoder_token_ids"])
    np.testing.assert_array_equal(weights, mask[:, 1:])
    np.testing.assert_array_equal(x["decoder_padding_mask"], mask[:, 1:])
    np.testing.assert_array_equal(y, np.where(mask[:, 1:], ids[:, 1:], 0))
    np.testing.assert_array_equal(x["decoder_token_ids"], np.where(mask[:, 1:], ids[:, :-1], 0))
    assert np.all(x["decoder_token_ids"][:, 0] == teacher.start_token_id)
    # Weights stop after the first stop token of each row.
    for row, label in zip(weights, y):
        stops = np.flatnonzero(label == END)
        if stops.size:
            assert row[: stops[0] + 1].all() and not row[stops[0] + 1:].any()
    student = tiny.seq2seq_lm(num_layers=1)
    student.compile(keras.optimizers.Adam(1e-2), loss="auto")
    history = student.fit(x, y, sample_weight=weights, epochs=1, batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": 0.0}, "temperature"),
        ({"alpha": 1.5}, "alpha"),
        ({"soft_loss": "l2"}, "soft_loss"),
        ({"hidden_state_weight": -1}, "hidden_state_weight"),
        ({"hidden_states": "backbone"}, "hidden_states"),
        ({"hidden_states": [("backbone",)]}, "hidden_states"),
        ({"hidden_states": [("nope", "backbone")]}, "nope"),
        ({"hidden_states": [("backbone/key", "backbone")]}, "single tensor"),
        ({"hidden_states": [("backbone", "backbone", "mask")]}, "mask_input"),
    ],
)
def test_bad_config_raises(pair, kwargs, match):
    teacher, student = pair
    with pytest.raises(ValueError, match=match):
        Distiller(teacher, student, **kwargs)


def test_bad_arguments_raise(pair):
    teacher, student = pair
    with pytest.raises(ValueError, match="teacher"):
        Distiller(keras.layers.Dense(2), student)
    with pytest.raises(ValueError, match="teacher"):
        sequence_distillation_data(keras.layers.Dense(2), {"token_ids": np.ones((1, 2))}, 4)
    with pytest.raises(ValueError, match="max_length"):
        sequence_distillation_data(teacher, {"token_ids": np.ones((1, 2), "int32")}, 1)
    with pytest.raises(ValueError, match="batch size"):
        sequence_distillation_data(teacher, {"token_ids": np.ones((1, 4), "int32"),
                                             "padding_mask": np.ones((2, 4), "int32")}, 4)


def test_sequence_distillation_refuses_a_teacher_that_does_not_generate():
    classifier = tiny.text_classifier()
    with pytest.raises(ValueError, match="teacher must be a keras_xf generating task .*"
                       "Received: teacher=TextClassifier"):
        sequence_distillation_data(classifier, {"token_ids": np.ones((2, 4), "int32")},
                                   max_length=4)
