"""Generation stopped by a stop classifier (survey §5.6): `stop_labels` against the numpy
oracle, the margin rule `Pr(stop|s_i) ≥ Pr(nonstop|s_i) + θ_stop` ending rows where a numpy
step-by-step reference says (alone, with stop ids, cached or not, with other samplers), the
classifier's weights read anew at each call, `StopClassifierTrainer` (loss against numpy,
`fit`, frozen language model), a `.keras` round trip of the classifier, and bad arguments.

One module-scoped one-layer model serves the generation tests; its plain greedy generation of
three prompts (lengths 3, 2, 4, output length 10) is the reference the rule cuts.
"""

import types

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.layers import ClassificationHead
from keras_xf.layers import StopClassifier
from keras_xf.models import StopClassifierTrainer
from keras_xf.ops import stop_labels
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layers.bad_inputs import raises_naming
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import early_exit as ref

PROMPTS = [[3, 4, 5], [6, 7], [9, 10, 11, 12]]
PROMPT_LENGTHS = np.array([len(p) for p in PROMPTS])
MAX_LENGTH = 10
END = 2


def prompts():
    ids = np.zeros((len(PROMPTS), MAX_LENGTH), "int32")
    for row, prompt in enumerate(PROMPTS):
        ids[row, : len(prompt)] = prompt
    return {"token_ids": ids, "padding_mask": np.arange(MAX_LENGTH)[None] < PROMPT_LENGTHS[:, None]}


def cut(ids, lengths):
    """`ids` padded past each row's length, and the output mask."""
    mask = np.arange(ids.shape[1])[None] < np.asarray(lengths)[:, None]
    return np.where(mask, ids, 0), mask


def assert_generates(result, ids, mask):
    np.testing.assert_array_equal(np.asarray(result["padding_mask"]), mask)
    np.testing.assert_array_equal(np.asarray(result["token_ids"]), ids)


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(3)
    return randomize_embeddings(causal_lm(num_layers=1), seed=3)


def linear_classifier(kernel, bias):
    layer = StopClassifier()
    layer.build((None, None, WIDTH))
    layer.set_weights([np.asarray(kernel, "float32").reshape(WIDTH, 1),
                       np.asarray([bias], "float32")])
    return layer


@pytest.fixture(scope="module")
def classifier():
    """A linear classifier whose logits spread over a few units on the model's states."""
    kernel = np.random.default_rng(4).normal(size=WIDTH) * 3.0 / np.sqrt(WIDTH)
    return linear_classifier(kernel, 0.0)


@pytest.fixture(scope="module")
def plain(lm):
    result = lm.generate(prompts(), max_length=MAX_LENGTH)
    return np.asarray(result["token_ids"])


@pytest.fixture(scope="module")
def probabilities(lm, classifier, plain):
    """`Pr(stop|s_i)` in numpy at every position of the plain generation: the model is
    causal, so its full pass gives the states the decoding loop saw."""
    hidden = to_numpy(lm.backbone({"token_ids": plain, "padding_mask": np.ones_like(plain)}))
    weights = [tuple(to_numpy(v) for v in classifier.head.output_dense.weights)]
    return ref.sigmoid(ref.stop_logits(hidden, weights))


@pytest.fixture(scope="module")
def margin(probabilities):
    """`θ_stop` for which the rule ends some rows early and not others, its threshold
    `(1 + θ) / 2` far from every probability the rule reads."""
    read = np.concatenate([probabilities[row, n:] for row, n in enumerate(PROMPT_LENGTHS)])
    values = np.sort(read)
    best, best_gap = None, 0.0
    for threshold in (values[1:] + values[:-1]) / 2:
        lengths = ref.margin_stop_lengths(probabilities, PROMPT_LENGTHS, 2 * threshold - 1)
        gap = np.abs(read - threshold).min()
        if 0 < (lengths < MAX_LENGTH).sum() < len(PROMPTS) and gap > best_gap:
            best, best_gap = threshold, gap
    assert best is not None and best_gap > 1e-3, (best, best_gap)
    return float(2 * best - 1)


# stop_labels -----------------------------------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("end_token_id", [None, END])
def test_stop_labels_match_reference(rng, with_mask, end_token_id):
    ids = np.array([[5, 6, 7, 2, 0, 0, 0, 0],   # ends with the end id, then padding
                    [5, 6, 7, 8, 9, 3, 4, 5],   # fills the width: cut, not ended
                    [5, 6, 0, 0, 0, 0, 0, 0],   # padding follows
                    [2, 5, 6, 7, 2, 0, 0, 0]],  # the end id first: no position belongs
                   "int32")
    mask = np.array([[1, 1, 1, 1, 0, 0, 0, 0], [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0],
                     [1, 1, 1, 1, 1, 0, 0, 0]], bool)
    random = token_batch(rng, batch=4, length=8, lengths=[8, 6, 3, 5], low=1)
    ids = np.concatenate([ids, random["token_ids"] % 4 + 1])  # some end ids inside
    mask = np.concatenate([mask, random["padding_mask"].astype(bool)])
    padding = mask if with_mask else None
    labels, counted = stop_labels(ids, padding, end_token_id)
    expected_labels, expected_counted = ref.stop_labels(ids, padding, end_token_id)
    assert keras.backend.standardize_dtype(labels.dtype) == "float32"
    np.testing.assert_array_equal(to_numpy(labels), expected_labels)
    np.testing.assert_array_equal(to_numpy(counted), expected_counted)
    if with_mask and end_token_id == END:
        np.testing.assert_array_equal(expected_labels[:4].argmax(-1), [2, 0, 1, 0])
        assert expected_labels[:4].sum() == 2 and not expected_counted[3].any()


# The margin rule in generate ---------------------------------------------------------------


@pytest.mark.parametrize("sampler, use_cache", [
    pytest.param("greedy", True, id="greedy"),
    pytest.param("greedy", False, id="no_cache"),
    pytest.param(lambda: keras_hub.samplers.TopKSampler(k=1), True, id="top_k"),
])
def test_rule_ends_rows_where_the_step_by_step_reference_does(
        lm, classifier, plain, probabilities, margin, sampler, use_cache):
    lengths = ref.margin_stop_lengths(probabilities, PROMPT_LENGTHS, margin)
    assert (lengths < MAX_LENGTH).any() and (lengths == MAX_LENGTH).any()
    result = lm.generate(prompts(), max_length=MAX_LENGTH, use_cache=use_cache,
                         sampler=sampler if isinstance(sampler, str) else sampler(),
                         stop_classifier=classifier, stop_margin=margin)
    assert_generates(result, *cut(plain, lengths))


def test_rule_and_stop_ids_end_a_row_at_whichever_comes_first(
        lm, classifier, plain, probabilities, margin):
    rule_lengths = ref.margin_stop_lengths(probabilities, PROMPT_LENGTHS, margin)
    row = int(np.argmax(rule_lengths == MAX_LENGTH))  # a row the rule does not end
    stop_id = int(plain[row, PROMPT_LENGTHS[row] + 1])
    stop_positions = [next((i for i in range(n, MAX_LENGTH) if plain[r, i] == stop_id), -1)
                      for r, n in enumerate(PROMPT_LENGTHS)]
    lengths = ref.margin_stop_lengths(probabilities, PROMPT_LENGTHS, margin, stop_positions)
    assert lengths[row] < MAX_LENGTH
    result = lm.generate(prompts(), max_length=MAX_LENGTH, stop_token_ids=[stop_id],
                         stop_classifier=classifier, stop_margin=margin)
    assert_generates(result, *cut(plain, lengths))


def test_margin_one_is_plain_generation(lm, classifier, plain, probabilities):
    assert probabilities.max() < 1.0  # the rule `Pr(stop) ≥ 1` never holds
    result = lm.generate(prompts(), max_length=MAX_LENGTH, stop_classifier=classifier,
                         stop_margin=1.0)
    assert_generates(result, plain, np.ones_like(plain, bool))


def test_margin_minus_one_keeps_one_generated_token_with_random_sampling(lm, classifier):
    result = lm.generate(prompts(), max_length=MAX_LENGTH, sampler="random",
                         stop_classifier=classifier, stop_margin=-1.0)
    ids, mask = np.asarray(result["token_ids"]), np.asarray(result["padding_mask"])
    np.testing.assert_array_equal(mask, cut(ids, PROMPT_LENGTHS + 1)[1])
    np.testing.assert_array_equal(ids[~mask], 0)
    np.testing.assert_array_equal(ids[:, :2], prompts()["token_ids"][:, :2])


def test_new_classifier_weights_are_read_by_the_compiled_loop(lm, plain):
    layer = linear_classifier(np.zeros(WIDTH), -10.0)  # never stops
    assert_generates(lm.generate(prompts(), max_length=MAX_LENGTH, stop_classifier=layer),
                     plain, np.ones_like(plain, bool))
    layer.set_weights([np.zeros((WIDTH, 1), "float32"), np.array([10.0], "float32")])
    assert_generates(lm.generate(prompts(), max_length=MAX_LENGTH, stop_classifier=layer),
                     *cut(plain, PROMPT_LENGTHS + 1))


def test_classifier_keras_round_trip_generates_the_same(lm, classifier, plain, rng, tmp_path):
    states = rng.normal(size=(2, 4, WIDTH)).astype("float32")
    path = str(tmp_path / "stop.keras")
    wrap_in_model(classifier, [states]).save(path)
    loaded = keras.saving.load_model(path, safe_mode=True).layers[-1]
    assert isinstance(loaded, StopClassifier)
    np.testing.assert_allclose(to_numpy(loaded(states)), to_numpy(classifier(states)), atol=1e-6)
    result = lm.generate(PROMPTS, max_length=MAX_LENGTH, stop_classifier=loaded,
                         stop_margin=-1.0)
    assert result == [p + [int(plain[row, len(p)])] for row, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("sampler", [lambda: keras_hub.samplers.BeamSampler(num_beams=2),
                                     lambda: "contrastive"], ids=["beam", "contrastive"])
def test_beam_and_contrastive_search_are_refused(lm, classifier, sampler):
    raises_naming("stop_classifier", lambda: lm.generate(
        PROMPTS, max_length=MAX_LENGTH, sampler=sampler(), stop_classifier=classifier))


@pytest.mark.parametrize("kwargs, name", [
    ({"stop_margin": 1.5}, "stop_margin"),
    ({"stop_margin": -2}, "stop_margin"),
    ({"stop_margin": True}, "stop_margin"),
    ({"stop_margin": "0.1"}, "stop_margin"),
    ({"stop_margin": float("nan")}, "stop_margin"),
    ({"stop_classifier": None, "stop_margin": 0.3}, "stop_margin"),
    ({"stop_classifier": "classifier"}, "stop_classifier"),
    ({"stop_classifier": lambda: ClassificationHead(1)}, "stop_classifier"),
    ({"stop_classifier": lambda: _built_for(WIDTH + 1)}, "stop_classifier"),
])
def test_bad_generate_arguments_raise(lm, classifier, kwargs, name):
    kwargs = {"stop_classifier": classifier, **kwargs}
    if isinstance(kwargs["stop_classifier"], types.FunctionType):
        kwargs["stop_classifier"] = kwargs["stop_classifier"]()
    raises_naming(name, lambda: lm.generate(PROMPTS, max_length=MAX_LENGTH, **kwargs))


def _built_for(width):
    layer = StopClassifier()
    layer.build((None, None, width))
    return layer


# Training the classifier -----------------------------------------------------------------


def training_batch(rng):
    """Sequences ending with the end id, then padding (one cut at the width)."""
    batch = token_batch(rng, batch=4, length=8, lengths=[5, 8, 3, 6])
    ids = batch["token_ids"]
    for row, n in enumerate([5, 8, 3, 6]):
        if n < 8:
            ids[row, n - 1] = END
    return batch


def test_trainer_loss_matches_reference_and_fit_leaves_the_lm_unchanged(rng):
    lm = randomize_embeddings(causal_lm(num_layers=1), seed=5)
    classifier = StopClassifier(intermediate_dim=8)
    trainer = StopClassifierTrainer(lm, classifier, end_token_id=END)
    assert not lm.trainable
    assert {id(v) for v in trainer.trainable_weights} == {id(v) for v in classifier.weights}
    x = training_batch(rng)
    hidden = to_numpy(lm.backbone(x))
    head = classifier.head
    weights = [tuple(to_numpy(v) for v in d.weights) for d in (head.hidden_dense, head.output_dense)]
    p = ref.sigmoid(ref.stop_logits(hidden, weights))
    labels, counted = ref.stop_labels(x["token_ids"], x["padding_mask"], END)
    assert labels.sum() == 4 - 1  # every sequence but the cut one ends
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    expected = (bce * counted).sum() / counted.sum()

    trainer.compile(optimizer=keras.optimizers.Adam(0.05))
    np.testing.assert_allclose(trainer.evaluate(x, verbose=0), expected, rtol=1e-5)
    lm_before = [to_numpy(w).copy() for w in lm.weights]
    classifier_before = [to_numpy(w).copy() for w in classifier.weights]
    history = trainer.fit(x, epochs=8, batch_size=4, verbose=0).history["loss"]
    assert history[-1] < 0.7 * history[0], history
    for before, after in zip(lm_before, lm.weights):
        np.testing.assert_array_equal(to_numpy(after), before)
    assert any(not np.allclose(b, to_numpy(a)) for b, a in zip(classifier_before,
                                                               classifier.weights))
    clone = StopClassifierTrainer.from_config(trainer.get_config())
    assert clone.end_token_id == END and isinstance(clone.stop_classifier, StopClassifier)


def test_bad_trainer_arguments_raise(rng):
    lm = causal_lm(num_layers=1)
    raises_naming("lm", lambda: StopClassifierTrainer(StopClassifier(), StopClassifier()))
    raises_naming("stop_classifier", lambda: StopClassifierTrainer(lm, ClassificationHead(1)))
    raises_naming("stop_classifier", lambda: StopClassifierTrainer(lm, _built_for(WIDTH + 1)))
    for value in (-1, VOCAB, 1.5, True):
        raises_naming("end_token_id",
                      lambda: StopClassifierTrainer(lm, StopClassifier(), end_token_id=value))
    trainer = StopClassifierTrainer(lm, StopClassifier(), end_token_id=END)
    raises_naming("loss", lambda: trainer.compile(loss="mse"))
    trainer.compile()
    x = training_batch(rng)
    with pytest.raises(ValueError, match="without y"):
        trainer.fit(x, np.zeros((4, 8), "float32"), verbose=0)
