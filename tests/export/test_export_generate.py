"""Exported generation: the SavedModel's `generate` endpoint gives `model.generate`'s tokens.

One export per model, sampler and backend (module fixture), served in one subprocess that
imports TensorFlow and not keras_xf. `CausalLM`, greedy: token-for-token equal to
`model.generate` (right- and left-padded prompts, output width above, at and below the
prompts' width, stop ids, a one-token prompt); top-k and top-p: equal to `model.generate` with
a sampler of the same seed. `Seq2SeqLM` and `VisionLanguageLM` (cross-attention fusion),
greedy: equal to `model.generate`.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_xf.models import GenerativeTask
from keras_xf.models import VisionLanguageLM
from tests.models.tiny import SIZES
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier

BACKEND = keras.config.backend()
pytestmark = pytest.mark.skipif(
    BACKEND == "torch", reason="SavedModels are written from TensorFlow and JAX (test_export.py "
    "tests the PyTorch error)")

SAMPLERS = {
    "greedy": None,  # the compile default: `model.export(path)` as a user calls it
    "top_k": lambda seed=None: __import__("keras_hub").samplers.TopKSampler(k=5, seed=seed),
    "top_p": lambda seed=None: __import__("keras_hub").samplers.TopPSampler(p=0.9, seed=seed),
}
SEEDS = (1, 2)

# Loads each SavedModel with TensorFlow alone and runs every case through `generate`.
SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
request = json.load(open(sys.argv[1]))
results = {}
for name, path in request["paths"].items():
    loaded = tf.saved_model.load(path)  # kept: its variables live as long as it does
    results[name] = []
    for case in request["cases"][name]:
        inputs = {key: tf.constant(value, tf.float32 if key == "images" else tf.int32)
                  for key, value in case.items()}
        outputs = loaded.generate(inputs)
        results[name].append({key: np.asarray(value).astype(int).tolist()
                              for key, value in outputs.items()})
results["imported_keras_xf"] = any(module.startswith("keras_xf") for module in sys.modules)
json.dump(results, open(sys.argv[2], "w"))
"""


def prompts():
    """`(name, inputs, max_length, stop ids)` cases; ids padded with 0."""
    right = np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 0]], "int32")
    left = np.array([[0, 0, 0, 5, 6, 7], [0, 8, 9, 10, 11, 12]], "int32")
    short = np.array([[3, 0, 0, 0], [4, 5, 0, 0]], "int32")
    return [
        ("right_padded_longer_output", right, 10, []),
        ("left_padded_same_width", left, 6, []),
        ("output_narrower_than_ids", short, 3, []),
        ("one_token_prompt", np.array([[9, 0, 0]], "int32"), 8, []),
    ]


def model_inputs(ids):
    return {"token_ids": ids, "padding_mask": (ids != 0).astype("int32")}


def endpoint_case(ids, max_length, stops, seed=0, inputs=None):
    inputs = model_inputs(ids) if inputs is None else inputs
    return {**{key: np.asarray(value).tolist() for key, value in inputs.items()},
            "max_length": max_length, "stop_token_ids": list(stops), "seed": seed}


def other_tasks():
    """`{name: (model, inputs of generate, max_length)}`: greedy cases of the other tasks."""
    rng = np.random.default_rng(1)
    source = np.array([[5, 6, 7, 8, 0, 0], [0, 9, 10, 11, 12, 13]], "int32")  # one left-padded
    target = np.array([[1, 4, 0], [1, 0, 0]], "int32")
    seq2seq = {"encoder_token_ids": source, "encoder_padding_mask": (source != 0).astype("int32"),
               "decoder_token_ids": target, "decoder_padding_mask": (target != 0).astype("int32")}
    vision = VisionLanguageLM(**{**SIZES, "num_layers": 1}, image_shape=(4, 4, 3), patch_size=2,
                              fusion="cross_attention")
    images = rng.uniform(size=(2, 4, 4, 3)).astype("float32")
    prompt = np.array([[1, 5, 7], [1, 0, 0]], "int32")
    return {
        "seq2seq_lm": (randomize_embeddings(seq2seq_lm(start_token_id=1)), seq2seq, 8),
        "vision_language_lm": (randomize_embeddings(vision),
                               {"images": images, **model_inputs(prompt)}, 8),
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Exports one tiny CausalLM with each sampler; returns the model, the cases with the
    tokens `model.generate` gives, what the subprocess served, and the traced calls.

    The seed is set here: a module fixture is built before the per-test seeding, so its
    weights would otherwise depend on which tests ran before it in the process."""
    keras.utils.set_random_seed(0)
    model = randomize_embeddings(causal_lm(num_layers=1))
    folder = tmp_path_factory.mktemp("generate")
    calls = {"_prefill": 0, "_decode_token": 0, "_uncached_hidden": 0}
    paths = {}
    with pytest.MonkeyPatch.context() as patch:
        for method in calls:  # what the exported programs trace
            original = getattr(model, method)

            def spy(*args, _original=original, _method=method, **kwargs):
                calls[_method] += 1
                return _original(*args, **kwargs)

            patch.setattr(model, method, spy)
        for name, make in SAMPLERS.items():
            paths[name] = str(folder / name)
            if make is None:
                model.export(paths[name], verbose=False)
            else:
                model.export(paths[name], verbose=False, generate_sampler=make())

    cases = {"greedy": [], "top_k": [], "top_p": []}
    expected = {"greedy": [], "top_k": [], "top_p": []}
    for name, (task, inputs, max_length) in other_tasks().items():
        paths[name] = str(folder / name)
        task.export(paths[name], verbose=False)
        expected[name] = [task.generate(inputs, max_length=max_length)]
        cases[name] = [endpoint_case(None, max_length, [], inputs=inputs)]
    for _, ids, max_length, stops in prompts():
        expected["greedy"].append(model.generate(model_inputs(ids), max_length=max_length))
        cases["greedy"].append(endpoint_case(ids, max_length, stops))
    # Stop ids that the model does generate: the second row's first new token, and one that
    # the first row generates later (so the rows stop at different steps).
    ids, max_length = prompts()[0][1:3]
    first = expected["greedy"][0]["token_ids"]
    stops = [int(first[1, 5]), int(first[0, 6])]
    expected["greedy"].append(model.generate(model_inputs(ids), max_length=max_length,
                                             stop_token_ids=stops))
    cases["greedy"].append(endpoint_case(ids, max_length, stops))
    for name in ("top_k", "top_p"):
        for seed in SEEDS:
            expected[name].append(model.generate(model_inputs(ids), max_length=max_length,
                                                  sampler=SAMPLERS[name](seed)))
            cases[name].append(endpoint_case(ids, max_length, [], seed))

    request, response = folder / "request.json", folder / "response.json"
    request.write_text(json.dumps({"paths": paths, "cases": cases}))
    script = folder / "serve.py"
    script.write_text(SERVE)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""}
    subprocess.run([sys.executable, str(script), str(request), str(response)], check=True,
                   cwd=str(folder), env=env, timeout=600)
    return model, expected, json.loads(response.read_text()), calls, paths


def check_equal(expected, actual):
    assert sorted(actual) == sorted(expected)  # ids and mask, named as `prompt_keys`
    for key, value in expected.items():
        np.testing.assert_array_equal(np.asarray(actual[key]).astype(value.dtype), value)


def test_served_without_keras_xf(served):
    assert served[2]["imported_keras_xf"] is False


@pytest.mark.parametrize("case", range(len(prompts())),
                         ids=[name for name, *_ in prompts()])
def test_greedy_tokens_equal_generate(served, case):
    _, expected, results, _, _ = served
    check_equal(expected["greedy"][case], results["greedy"][case])


def test_stop_token_ids_end_rows_as_generate_does(served):
    _, expected, results, _, _ = served
    stopped = expected["greedy"][-1]
    assert not stopped["padding_mask"].all()  # the case does stop a row
    check_equal(stopped, results["greedy"][-1])


@pytest.mark.parametrize("sampler", ["top_k", "top_p"])
def test_sampled_tokens_equal_generate_with_the_same_seed(served, sampler):
    _, expected, results, _, _ = served
    for want, got in zip(expected[sampler], results[sampler]):
        check_equal(want, got)


@pytest.mark.parametrize("task", ["seq2seq_lm", "vision_language_lm"])
def test_other_tasks_greedy_tokens_equal_generate(served, task):
    _, expected, results, _, _ = served
    check_equal(expected[task][0], results[task][0])


def test_seeds_change_sampled_tokens(served):
    results = served[2]["top_k"]
    assert results[0]["token_ids"] != results[1]["token_ids"]


def test_loop_decodes_from_the_cache(served):
    # The exported loop is a prefill pass then one cached step per token: the full forward
    # pass (`use_cache=False`'s step) is never traced.
    calls = served[3]
    assert calls["_uncached_hidden"] == 0
    assert calls["_prefill"] >= 1 and calls["_decode_token"] >= 1


def test_prompt_longer_than_max_length_is_refused(served):
    import tensorflow as tf

    loaded = tf.saved_model.load(served[4]["greedy"])
    inputs = endpoint_case(prompts()[0][1], 4, [])
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than max_length"):
        loaded.generate({key: tf.constant(value, tf.int32) for key, value in inputs.items()})


def test_bool_padding_mask_gives_the_same_tokens(served):
    import tensorflow as tf

    _, expected, _, _, paths = served
    loaded = tf.saved_model.load(paths["greedy"])
    case = endpoint_case(*prompts()[1][1:])
    inputs = {key: tf.constant(value, tf.int32) for key, value in case.items()}
    inputs["padding_mask"] = tf.cast(inputs["padding_mask"], tf.bool)
    check_equal(expected["greedy"][1], loaded.generate(inputs))


def test_generate_sampler_errors(tmp_path):
    model = causal_lm(num_layers=1)
    assert isinstance(model, GenerativeTask)
    with pytest.raises(ValueError, match="generate_sampler"):
        model.export(str(tmp_path / "beam"), generate_sampler="beam")
    with pytest.raises(ValueError, match="generate_sampler"):
        text_classifier().export(str(tmp_path / "classifier"), generate_sampler="greedy")
