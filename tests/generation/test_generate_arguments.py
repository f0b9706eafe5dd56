"""`generate` as users call it: the model's default stop ids (`"auto"`), `max_new_tokens`,
`temperature` / `top_k` / `top_p` / `seed` as keras-hub samplers, the repetition penalty
(against transformers' logits processor and a step-by-step reference), output lengths in
compile buckets, and the checked inputs (ids outside the vocabulary, outputs past a learned
position table).

One tiny module-scoped `CausalLM` (one layer, vocabulary 32, `max_sequence_length` 12); its
outputs are at most 12 long, so every output shares the buckets 8 and 12 and most calls
reuse programs that an earlier test compiled.
"""

import doctest

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.generation.prompts import bucket_length
from keras_xf.generation.sampling import DEFAULT_TOP_P
from keras_xf.generation.sampling import SamplerSpec
from keras_xf.generation.sampling import get_sampler
from keras_xf.generation.sampling import penalize_repetition
from keras_xf.generation.sampling import sampler_from_arguments
from keras_xf.models import CausalLM
from keras_xf.models import GenerativeTask
from tests.layer_checks import to_numpy
from tests.models.tiny import VOCAB
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_batch
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_encoder

PROMPTS = [[3, 4, 5], [6, 7]]


@pytest.fixture(scope="module")
def lm():
    model = causal_lm(num_layers=1)
    randomize_embeddings(model)
    return model


@pytest.fixture
def stop_ids(lm):
    """Restores the model's default stop ids after a test that sets them."""
    yield
    lm.stop_token_ids = ()


def test_max_new_tokens_is_the_longest_prompt_plus_new_tokens(lm):
    expected = lm.generate(PROMPTS, max_length=8)
    assert lm.generate(PROMPTS, max_new_tokens=5) == expected
    assert [len(row) for row in lm.generate(PROMPTS, max_new_tokens=2)] == [5, 5]
    with pytest.raises(ValueError, match="max_length.*max_new_tokens.*not both"):
        lm.generate(PROMPTS, max_length=8, max_new_tokens=5)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        lm.generate(PROMPTS, max_new_tokens=0)


def test_default_stop_ids_are_the_models_and_none_means_none(lm, stop_ids):
    plain = lm.generate(PROMPTS, max_length=8)
    stop = plain[0][4]  # the second generated token of the first row
    lm.stop_token_ids = [stop]
    assert lm.stop_token_ids == (stop,)
    stopped = lm.generate(PROMPTS, max_length=8)  # stop_token_ids="auto"
    assert stopped == lm.generate(PROMPTS, max_length=8, stop_token_ids=[stop])
    assert stopped[0] == plain[0][:plain[0].index(stop, 3) + 1]
    for none in (None, ()):
        assert lm.generate(PROMPTS, max_length=8, stop_token_ids=none) == plain
    with pytest.raises(ValueError, match=r"stop_token_ids must be ids in \[0, 32\)"):
        lm.stop_token_ids = [VOCAB]


def test_default_stop_ids_are_saved(tmp_path):
    model = causal_lm(num_layers=1)
    model.stop_token_ids = [2, 5]
    assert model.get_config()["stop_token_ids"] == [2, 5]
    model.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    assert isinstance(loaded, CausalLM) and loaded.stop_token_ids == (2, 5)
    assert CausalLM.from_config(causal_lm(num_layers=1).get_config()).stop_token_ids == ()


def test_sampling_arguments_build_keras_hub_samplers():
    assert sampler_from_arguments("greedy") == "greedy"
    assert sampler_from_arguments(None, top_p=0.8, top_k=10, temperature=0.5) == SamplerSpec(
        "top_p", 0.5, 10, 0.8)
    assert sampler_from_arguments(None, top_k=3) == SamplerSpec("top_k", 1.0, 3)
    assert sampler_from_arguments(None, temperature=2) == SamplerSpec("random", 2.0)
    assert sampler_from_arguments("top_p", temperature=0.7) == SamplerSpec(
        "top_p", 0.7, None, DEFAULT_TOP_P)
    built = get_sampler(SamplerSpec("top_p", 0.5, 10, 0.8))
    assert isinstance(built, keras_hub.samplers.TopPSampler)
    assert (built.p, built.k, built.temperature) == (0.8, 10, 0.5)
    top_k = get_sampler(SamplerSpec("top_k", 1.0, 3))
    assert isinstance(top_k, keras_hub.samplers.TopKSampler) and top_k.k == 3
    assert isinstance(get_sampler(SamplerSpec("random", 2.0)), keras_hub.samplers.RandomSampler)
    # By name, top-p keeps a useful nucleus, not keras-hub's p = 0.1 (greedy search).
    assert get_sampler("top_p").p == DEFAULT_TOP_P == 0.9
    refused = [
        (dict(sampler="greedy", top_k=3), "build a sampler"),
        (dict(sampler=keras_hub.samplers.TopKSampler(k=2), temperature=0.5), "build a sampler"),
        (dict(sampler="random", top_p=0.5), "takes no top_p"),
        (dict(sampler="top_k", top_p=0.5), "takes no top_p"),
        (dict(sampler=None, top_p=0.0), r"top_p must be a number in \(0, 1\]"),
        (dict(sampler=None, top_k=0), "top_k must be a positive int"),
        (dict(sampler=None, temperature=-1.0), "temperature must be a positive number"),
    ]
    for arguments, message in refused:
        with pytest.raises(ValueError, match=message):
            sampler_from_arguments(**arguments)


def test_seed_gives_a_fresh_keras_hub_samplers_tokens(lm):
    first = lm.generate(PROMPTS, max_length=8, top_k=4, seed=7)
    assert lm.generate(PROMPTS, max_length=8, top_k=4, seed=7) == first
    expected = lm.generate(PROMPTS, max_length=8,
                           sampler=keras_hub.samplers.TopKSampler(k=4, seed=7))
    assert first == expected
    with pytest.raises(ValueError, match="seed needs a sampler that draws at random"):
        lm.generate(PROMPTS, max_length=8, seed=7)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        lm.generate(PROMPTS, max_length=8, top_k=4, seed=-1)


def test_repetition_penalty_equals_transformers_processor():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, VOCAB)).astype("float32")
    ids = rng.integers(0, VOCAB, size=(2, 6)).astype("int32")
    for penalty in (1.3, 0.7):
        processor = transformers.RepetitionPenaltyLogitsProcessor(penalty)
        expected = processor(torch.tensor(ids[:, :4], dtype=torch.long),
                             torch.tensor(logits)).numpy()
        # Only the tokens before `index` are present: the rest are not written yet.
        actual = to_numpy(penalize_repetition(logits, ids, 4, penalty))
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_repetition_penalty_in_generate_equals_a_step_by_step_reference(lm):
    penalty = 3.0
    generated = lm.generate(PROMPTS, max_length=8, repetition_penalty=penalty)
    for prompt, row in zip(PROMPTS, generated):
        ids = list(prompt)
        while len(ids) < 8:
            padded = np.zeros((1, 8), "int32")
            padded[0, :len(ids)] = ids
            logits = to_numpy(lm({"token_ids": padded, "padding_mask": np.ones_like(padded)}))
            step = logits[0, len(ids) - 1]
            present = np.isin(np.arange(VOCAB), ids)
            step = np.where(present, np.where(step > 0, step / penalty, step * penalty), step)
            ids.append(int(np.argmax(step)))
        assert row == ids
    with pytest.raises(ValueError, match="repetition_penalty must be a positive number"):
        lm.generate(PROMPTS, max_length=8, repetition_penalty=0)


def test_bucket_lengths():
    assert [bucket_length(n) for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]
    assert [bucket_length(n, cap=12) for n in (5, 9, 12, 13)] == [8, 12, 12, 16]


def test_output_lengths_of_one_bucket_share_one_program_with_unchanged_tokens(lm):
    before = lm.generate_compile_count
    results = {length: lm.generate(PROMPTS, max_length=length) for length in (9, 10, 11, 12)}
    # Buckets: 9..12 → 12 (capped at max_sequence_length); one prefill length (2).
    assert lm.generate_compile_count - before <= 1
    function = lm.make_generate_function(prefill_length=2)
    for length in (9, 11):
        result = results[length]
        ids = np.zeros((2, length), "int32")
        mask = np.zeros((2, length), bool)
        for row, prompt in enumerate(PROMPTS):
            ids[row, :len(prompt)], mask[row, :len(prompt)] = prompt, True
        # The same setting at the exact width, no bucket: the tokens the bucket must give.
        exact = function({"token_ids": keras.ops.convert_to_tensor(ids),
                          "padding_mask": keras.ops.convert_to_tensor(mask)},
                         keras.ops.convert_to_tensor(length, "int32"))
        assert result == to_numpy(exact["token_ids"]).tolist()
        assert [len(row) for row in result] == [length, length]


def test_ids_outside_the_vocabulary_raise_at_every_entry_point(lm):
    message = r"token_ids must hold ids in \[0, 32\) \(the vocabulary\). Received: .*\[32\]"
    with pytest.raises(ValueError, match=message):
        lm.generate([[3, 32, 5]], max_length=8)
    with pytest.raises(ValueError, match=message):
        lm.stream([[3, 32, 5]], max_length=8)
    ids = np.array([[3, 32, 5]], "int32")
    with pytest.raises(ValueError, match=message):
        lm.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)}, verbose=0)
    with pytest.raises(ValueError, match=message):
        lm({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    with pytest.raises(ValueError, match=r"Received: token_ids with ids \[-1\]"):
        lm({"token_ids": np.array([[3, -1]]), "padding_mask": np.ones((1, 2), "int32")})
    # Padding outside a prompt's mask is not read: any pad id passes generate's check.
    lm.generate({"token_ids": np.array([[3, 4, 0]]), "padding_mask": np.array([[1, 1, 0]])})


def test_calls_of_tasks_check_their_backbones_token_inputs():
    ids = np.array([[3, 40]], "int32")
    with pytest.raises(ValueError, match=r"token_ids must hold ids in \[0, 32\).*\[40\]"):
        text_encoder()({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    batch = seq2seq_batch(np.random.default_rng(0))
    batch["encoder_token_ids"][0, 0] = 40
    with pytest.raises(ValueError, match=r"encoder_token_ids must hold ids in \[0, 32\)"):
        seq2seq_lm()(batch)


def test_outputs_past_a_learned_position_table_raise_before_compiling():
    model = causal_lm(num_layers=1, position="learned")
    with pytest.raises(ValueError, match=r"max_length must be at most 12.*Received: an output "
                                         r"length of 13"):
        model.generate([[3, 4]], max_length=13)
    with pytest.raises(ValueError, match="max_length must be at most 12"):
        model.generate([[3, 4]], max_new_tokens=11)
    assert model.generate_compile_count == 0


def test_docstring_examples_run():
    namespace = {"CausalLM": CausalLM, "np": np}
    for method in (GenerativeTask.generate, GenerativeTask.stream):
        test = doctest.DocTestParser().get_doctest(method.__doc__, dict(namespace),
                                                   method.__name__, None, 0)
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
        assert runner.summarize(verbose=False).failed == 0
