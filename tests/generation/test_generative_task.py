"""GenerativeTask: every generating task × greedy, top-k, top-p and beam search; stop tokens,
ragged prompts, cached = uncached, one input contract, and one compiled function per setting.

One tiny module-scoped model per task (vocabulary 20, width 8, one layer): `CausalLM`,
`Seq2SeqLM` and `VisionLanguageLM` with each fusion (prefix, plain cross-attention blocks, and
Flamingo-style gated cross-attention blocks). Each case's prompts are ragged (batch 2, output
length 8) and are chosen so that the three ways the prefill starts are all run: with prompt
tokens (shortest prompt 2: `causal`), with the image alone (`vision_prefix`), and with the
cross-attention keys and values alone (`seq2seq`, `vision_cross`, `vision_gated`). Calls with
the same sampler, stop ids and prefill share one compiled loop, so most tests here reuse the
loops that an earlier one compiled.
"""

import logging

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqLM
from keras_xf.models import VisionLanguageLM
from keras_xf.models import GenerativeTask
from tests.models.tiny import randomize_embeddings

VOCAB, MAX_LENGTH, IMAGE_SHAPE = 20, 8, (4, 4, 1)
SIZES = dict(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, num_heads=2,
             intermediate_dim=16, max_sequence_length=MAX_LENGTH)
BEAM = keras_hub.samplers.BeamSampler(num_beams=2)


def padded(prompts, width, left=False):
    ids = np.zeros((len(prompts), width), "int32")
    for row, prompt in enumerate(prompts):
        start = width - len(prompt) if left else 0
        ids[row, start:start + len(prompt)] = prompt
    return ids


class Case:
    """A model, its prompts (ragged token lists) and the same inputs in every form."""

    def __init__(self, model, prompts, forms, canonical):
        self.model, self.prompts, self.forms, self.canonical = model, prompts, forms, canonical


def _causal():
    prompts = [[3, 4, 5], [6, 7]]
    ids = padded(prompts, MAX_LENGTH)
    forms = {
        "list": prompts,
        "array": padded(prompts, 3),
        "left_padded_array": padded(prompts, 3, left=True),
        "dict": {"token_ids": ids},
        "dict_with_mask": {"token_ids": ids, "padding_mask": ids != 0},
    }
    return Case(CausalLM(**SIZES), prompts, forms, forms["dict_with_mask"])


def _seq2seq():
    sources = [[3, 4, 5, 6], [8, 9]]
    ids = padded(sources, 4)
    forms = {
        "list": sources,
        "array": ids,
        "left_padded_array": padded(sources, 4, left=True),
        "dict": {"encoder_token_ids": ids},
        "dict_with_mask": {"encoder_token_ids": ids, "encoder_padding_mask": ids != 0},
    }
    prompts = [[1, 5, 6], [1]]
    targets = padded(prompts, MAX_LENGTH)
    canonical = dict(forms["dict_with_mask"], decoder_token_ids=targets,
                     decoder_padding_mask=targets != 0)
    return Case(Seq2SeqLM(**SIZES, start_token_id=1), prompts, forms, canonical)


def _vision(prompts, **fusion):
    def build():
        model = VisionLanguageLM(**SIZES, image_shape=IMAGE_SHAPE, patch_size=2, **fusion)
        for variable in model.weights:
            if variable.path.endswith("_gate"):
                variable.assign(np.float32(0.8))  # open gates: the image reaches the text
        images = np.random.default_rng(1).uniform(size=(2,) + IMAGE_SHAPE).astype("float32")
        ids = padded(prompts, MAX_LENGTH)
        forms = {
            "list": {"images": images, "token_ids": prompts},
            "array": {"images": images, "token_ids": padded(prompts, 3)},
            "left_padded_array": {"images": images, "token_ids": padded(prompts, 3, left=True)},
            "dict_with_mask": {"images": images, "token_ids": ids, "padding_mask": ids != 0},
        }
        return Case(model, prompts, forms, forms["dict_with_mask"])

    return build


CASES = {
    "causal": _causal,
    "seq2seq": _seq2seq,
    "vision_prefix": _vision([[1, 5, 7], [1]], fusion="prefix"),
    "vision_cross": _vision([[1, 5, 7], [1]], fusion="cross_attention"),
    "vision_gated": _vision([[1, 5, 7], [1]], fusion="cross_attention",
                            gated_cross_attention=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    keras.utils.set_random_seed(3)
    built = CASES[request.param]()
    randomize_embeddings(built.model, seed=3)
    return built


@pytest.fixture(scope="module")
def reference(case):
    """Greedy, cached, no stop ids: `[B, MAX_LENGTH]` ids of the canonical inputs."""
    return ids_and_mask(case.model, case.model.generate(case.canonical, max_length=MAX_LENGTH))[0]


def ids_and_mask(model, result):
    ids_key, mask_key = model.prompt_keys
    return np.asarray(result[ids_key]), np.asarray(result[mask_key])


def rows(result):
    """The token rows of any result form (the mask applied)."""
    if isinstance(result, dict):
        ids, mask = (np.asarray(v) for k, v in sorted(result.items(), key=lambda kv: "mask" in kv[0]))
        return [row[keep].tolist() for row, keep in zip(ids, mask)]
    return [list(row) for row in np.asarray(result).tolist()] if not isinstance(result, list) else result


def stop_id(case, reference):
    """The first token generated for the shortest prompt: that row stops at once."""
    shortest = int(np.argmin([len(p) for p in case.prompts]))
    return int(reference[shortest, len(case.prompts[shortest])])


def check_stops(case, ids, mask, stop):
    """The mask covers each prompt and its generated tokens up to the first stop id; prompts
    are kept; the rows that generate the stop id end there."""
    assert ids.shape == mask.shape == (len(case.prompts), MAX_LENGTH)
    assert ids.min() >= 0 and ids.max() < VOCAB
    stopped = 0
    for row, prompt in enumerate(case.prompts):
        assert ids[row, : len(prompt)].tolist() == prompt
        generated = ids[row, len(prompt):].tolist()
        end = len(prompt) + generated.index(stop) + 1 if stop in generated else MAX_LENGTH
        np.testing.assert_array_equal(mask[row], np.arange(MAX_LENGTH) < end)
        stopped += end < MAX_LENGTH
    return stopped


@pytest.mark.parametrize("sampler", ["greedy", "beam"])
def test_cached_equals_uncached_with_stop_tokens(case, reference, sampler):
    model, stop = case.model, stop_id(case, reference)
    sampler = BEAM if sampler == "beam" else sampler
    cached = ids_and_mask(model, model.generate(case.canonical, max_length=MAX_LENGTH,
                                                stop_token_ids=[stop], sampler=sampler))
    uncached = ids_and_mask(model, model.generate(case.canonical, max_length=MAX_LENGTH,
                                                  stop_token_ids=[stop], sampler=sampler,
                                                  use_cache=False))
    np.testing.assert_array_equal(cached[0], uncached[0])
    np.testing.assert_array_equal(cached[1], uncached[1])
    stopped = check_stops(case, *cached, stop)
    if sampler == "greedy":
        assert stopped >= 1
        # Up to each row's stop, the tokens are those generated without stop ids.
        np.testing.assert_array_equal(np.where(cached[1], cached[0], -1),
                                      np.where(cached[1], reference, -1))


@pytest.mark.parametrize("sampler", ["top_k", "top_p"])
def test_sampling_with_stop_tokens(case, reference, sampler):
    make = {"top_k": lambda: keras_hub.samplers.TopKSampler(k=3, seed=1),
            "top_p": lambda: keras_hub.samplers.TopPSampler(p=0.9, seed=1)}[sampler]
    stop = stop_id(case, reference)
    result = case.model.generate(case.canonical, max_length=MAX_LENGTH, stop_token_ids=[stop],
                                 sampler=make())
    check_stops(case, *ids_and_mask(case.model, result), stop)


def test_every_input_form_gives_the_same_tokens(case, reference):
    expected = None
    for name, inputs in case.forms.items():
        result = case.model.generate(inputs, max_length=MAX_LENGTH)
        assert isinstance(result, dict) == name.startswith("dict"), name
        assert isinstance(result, list) == (name == "list"), name
        if expected is None:
            expected = rows(result)
        assert rows(result) == expected, name
    if not isinstance(case.model, Seq2SeqLM):  # the canonical seq2seq inputs add target prompts
        assert expected == reference.tolist()


def test_repeated_calls_reuse_one_compiled_function(case, reference):
    # The settings of test_cached_equals_uncached_with_stop_tokens: its loops are reused.
    model, stop = case.model, [stop_id(case, reference)]
    calls = [dict(sampler="greedy"), dict(), dict(sampler=BEAM), dict(sampler="greedy"),
             dict(sampler=BEAM), dict()]
    for call in calls[:3]:
        model.generate(case.canonical, max_length=MAX_LENGTH, stop_token_ids=stop, **call)
    compiled = len(model._generate_functions)
    results = [rows(model.generate(case.canonical, max_length=MAX_LENGTH, stop_token_ids=stop,
                                   **call)) for call in calls]
    # The compile default ("greedy") and the sampler named "greedy" share one function.
    assert len(model._generate_functions) == compiled
    assert results[0] == results[1] == results[3] == results[5]
    assert results[2] == results[4]
    if keras.config.backend() == "tensorflow":
        for function in model._generate_functions._functions.values():
            assert function.experimental_get_tracing_count() == 1


@pytest.mark.skipif(keras.config.backend() != "tensorflow",
                    reason="the retracing warning is TensorFlow's (tf.function)")
def test_many_compiled_functions_give_no_retracing_warning():
    # One task suffices: the base makes every task's compiled functions.
    keras.utils.set_random_seed(3)
    case = _causal()
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        # Five new (stop ids) settings: five functions, each traced once.
        for stop in range(5):
            case.model.generate(case.forms["list"], max_length=MAX_LENGTH,
                                stop_token_ids=[stop], use_cache=False)
    finally:
        logger.removeHandler(handler)
    assert not [m for m in messages if "retracing" in m], messages


def test_inputs_are_checked(case):
    model = case.model
    with pytest.raises(ValueError, match="longer than max_length"):
        model.generate(case.canonical, max_length=2)
    with pytest.raises(ValueError, match="stop_token_ids"):
        model.generate(case.forms["list"], max_length=MAX_LENGTH, stop_token_ids=[VOCAB])
    with pytest.raises(ValueError, match="max_length"):
        model.generate(case.forms["list"], max_length=0)
    with pytest.raises(ValueError, match="use_cache"):
        model.generate(case.forms["list"], max_length=MAX_LENGTH, use_cache="yes")
    with pytest.raises(ValueError, match="sampler"):
        model.generate(case.forms["list"], max_length=MAX_LENGTH, sampler="nucleus")
    with pytest.raises(ValueError, match="keys"):
        model.generate(dict(case.canonical, tokens=[[1]]), max_length=MAX_LENGTH)
    mask_key = "encoder_padding_mask" if isinstance(model, Seq2SeqLM) else "padding_mask"
    ids_key = mask_key.replace("padding_mask", "token_ids")
    bad_mask = dict(case.canonical)
    bad_mask[mask_key] = np.ones((2, 3), bool)
    with pytest.raises(ValueError, match=f"{mask_key} must have the shape of {ids_key}"):
        model.generate(bad_mask, max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match=f"{ids_key} must be 2-D"):
        model.generate(dict(case.canonical, **{ids_key: np.ones((2, 3, 1), "int32"),
                                                mask_key: np.ones((2, 3, 1), bool)}),
                       max_length=MAX_LENGTH)
    gap = dict(case.canonical)
    gap[ids_key] = np.array([[3, 0, 4, 0], [5, 6, 0, 0]], "int32")
    gap.pop(mask_key)
    with pytest.raises(ValueError, match=f"Each row of {ids_key} must hold one contiguous"):
        model.generate(gap, max_length=MAX_LENGTH)


def test_batch_sizes_must_agree():
    model = Seq2SeqLM(**SIZES)
    with pytest.raises(ValueError, match="need the same batch size"):
        model.generate({"encoder_token_ids": [[3, 4]], "decoder_token_ids": [[1], [1]],
                        "decoder_padding_mask": [[True], [True]]}, max_length=MAX_LENGTH)
    assert isinstance(model, GenerativeTask)
    config = model.get_config()
    assert config["pad_token_id"] == 0 and Seq2SeqLM.from_config(config).pad_token_id == 0
    with pytest.raises(ValueError, match="pad_token_id"):
        Seq2SeqLM(**SIZES, pad_token_id=-1)
