"""CausalLM.generate: greedy = step-by-step argmax, cache = no cache, beam(1) = greedy, prompt
forms, stop tokens, samplers, errors, and one compiled loop per shape.

One module-scoped model (rotary positions, grouped-query attention, untied output; one layer,
as each compiled loop costs seconds per layer, and the stack's per-layer caches are checked in
tests/layers/blocks) serves every test. Batches are 3 prompts of lengths 3, 2, 4 generated to
length 10, so most tests reuse one compiled loop (each new sampler, stop list or shape compiles
another). Every task × sampler, cached and not, with stop ids and in every input form, is in
test_generative_task.py.
"""

import re

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers.attention.patterns.local_pattern import LocalPattern
from keras_xf.generation.prompts import pack_prompts
from keras_xf.models import CausalLM
from tests.models.tiny import FFN
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import randomize_embeddings
from tests.layer_checks import to_numpy

PROMPTS = [[3, 4, 5], [6, 7], [9, 10, 11, 12]]
MAX_LENGTH = 10


@pytest.fixture(scope="module")
def lm():
    keras.utils.set_random_seed(2)
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=4, head_dim=4, num_key_value_heads=2),
        feedforward=FeedForward(FFN, activation="gelu"),
        norm_placement="pre",
    )
    model = CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                     max_sequence_length=12, position="rotary", tie_embeddings=False)
    return randomize_embeddings(model, seed=2)


@pytest.fixture(scope="module")
def as_list(lm):
    """The default (greedy, cached) generation of PROMPTS, given as a list of lists."""
    return lm.generate(PROMPTS, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def greedy(as_list):
    """`as_list` as `[3, MAX_LENGTH]` ids."""
    return np.array(as_list)


@pytest.fixture(scope="module")
def alone_and_new_functions(lm, as_list):
    """Each prompt generated on its own (two as 1-D arrays, one as a plain list of ints) with
    the sampler named by a string, after `as_list` (the compile default, greedy), and how many
    compiled functions the three calls added."""
    before = len(lm._generate_functions)
    results = [
        lm.generate(np.array(PROMPTS[0]), max_length=MAX_LENGTH, sampler="greedy"),
        lm.generate(PROMPTS[1], max_length=MAX_LENGTH, sampler="greedy"),
        lm.generate(np.array(PROMPTS[2]), max_length=MAX_LENGTH, sampler="greedy"),
    ]
    return results, len(lm._generate_functions) - before


@pytest.fixture(scope="module")
def alone(alone_and_new_functions):
    return alone_and_new_functions[0]


def right_padded(prompts, width=MAX_LENGTH):
    ids = np.zeros((len(prompts), width), "int32")
    mask = np.zeros((len(prompts), width), bool)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = True
    return {"token_ids": ids, "padding_mask": mask}


def left_padded(prompts, width=MAX_LENGTH):
    ids = np.zeros((len(prompts), width), "int32")
    mask = np.zeros((len(prompts), width), bool)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = True
    return {"token_ids": ids, "padding_mask": mask}


def full_logits(lm, token_ids):
    """The full forward pass (`predict_on_batch`: one compiled call, cheaper on JAX than eager
    ops compiled one by one for a shape seen once)."""
    token_ids = np.asarray(token_ids, "int32")
    return to_numpy(lm.predict_on_batch({"token_ids": token_ids,
                                         "padding_mask": np.ones_like(token_ids)}))


def test_greedy_is_the_argmax_of_the_full_forward_pass(lm, greedy):
    assert greedy.shape == (3, MAX_LENGTH)
    for row, prompt in zip(greedy, PROMPTS):
        assert row[: len(prompt)].tolist() == prompt
    # The model is causal: logits at t-1 of the finished sequence are those the generator saw
    # when it chose token t.
    logits = full_logits(lm, greedy)
    for b, prompt in enumerate(PROMPTS):
        for t in range(len(prompt), MAX_LENGTH):
            scores = logits[b, t - 1]
            # Chosen token is the argmax (up to float round-off between the two paths).
            assert scores[greedy[b, t]] >= scores.max() - 1e-4, (b, t)
    # The continuations are not degenerate, so the comparison above means something.
    assert len(set(greedy[:, 4:].ravel().tolist())) >= 4


def test_no_cache_path_gives_the_same_tokens(lm, greedy):
    tokens = lm.generate(PROMPTS, max_length=MAX_LENGTH, use_cache=False)
    np.testing.assert_array_equal(np.array(tokens), greedy)


def test_beam_search_with_one_beam_is_greedy(lm, greedy):
    sampler = keras_hub.samplers.BeamSampler(num_beams=1)
    tokens = lm.generate(PROMPTS, max_length=MAX_LENGTH, sampler=sampler)
    np.testing.assert_array_equal(np.array(tokens), greedy)


@pytest.mark.parametrize("form", [right_padded, left_padded])
def test_padded_dicts_of_different_lengths_match_each_prompt_alone(lm, alone, form):
    batched = lm.generate(form(PROMPTS), max_length=MAX_LENGTH)
    for row, single in zip(batched["token_ids"], alone):
        np.testing.assert_array_equal(row, single)


def test_lists_of_different_lengths_match_each_prompt_alone(as_list, alone):
    for row, single in zip(as_list, alone):
        assert row == single.tolist()


def test_return_structure_follows_the_input_structure(lm, greedy, as_list, alone):
    as_dict = lm.generate(right_padded(PROMPTS))  # max_length = the dict's width
    assert isinstance(as_dict, dict) and set(as_dict) == {"token_ids", "padding_mask"}
    assert as_dict["token_ids"].shape == as_dict["padding_mask"].shape == (3, MAX_LENGTH)
    np.testing.assert_array_equal(as_dict["token_ids"], greedy)
    assert as_dict["padding_mask"].all()

    assert isinstance(as_list, list) and all(isinstance(row, list) for row in as_list)
    assert all(len(row) == MAX_LENGTH for row in as_list)

    equal_length = np.array([p[:2] for p in PROMPTS], "int32")
    as_array = lm.generate(equal_length, max_length=MAX_LENGTH)
    assert isinstance(as_array, np.ndarray) and as_array.shape == (3, MAX_LENGTH)
    np.testing.assert_array_equal(as_array[:, :2], equal_length)

    # A 1-D prompt (array or list of ints) gives a 1-D array.
    for single in alone:
        assert isinstance(single, np.ndarray) and single.shape == (MAX_LENGTH,)


def test_stop_token_ids_stop_rows_and_end_the_padding_mask(lm, greedy):
    # Stop at row 1's first generated token: row 1 stops at once; any other row stops where
    # it first generates that token, if it does. A stop id that only occurs in prompts is
    # added too: prompt tokens never stop a row.
    stop = int(greedy[1, len(PROMPTS[1])])
    generated_ids = {int(t) for b, p in enumerate(PROMPTS) for t in greedy[b, len(p):]}
    in_prompts_only = sorted({t for p in PROMPTS for t in p} - generated_ids)
    stop_ids = [stop] + in_prompts_only[:1]
    result = lm.generate(right_padded(PROMPTS), stop_token_ids=stop_ids)
    stopped = 0
    for b, prompt in enumerate(PROMPTS):
        generated = greedy[b, len(prompt):].tolist()
        end = len(prompt) + generated.index(stop) + 1 if stop in generated else MAX_LENGTH
        stopped += end < MAX_LENGTH
        expected_mask = np.arange(MAX_LENGTH) < end
        np.testing.assert_array_equal(result["padding_mask"][b], expected_mask)
        np.testing.assert_array_equal(result["token_ids"][b, :end], greedy[b, :end])
        if end < MAX_LENGTH:
            assert result["token_ids"][b, end - 1] == stop
    assert stopped >= 1
    assert result["padding_mask"][1].sum() == len(PROMPTS[1]) + 1


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: keras_hub.samplers.TopKSampler(k=4, temperature=0.7, seed=1),
        lambda: keras_hub.samplers.RandomSampler(temperature=0.5, seed=1),
    ],
    ids=["top_k", "random"],  # top-p: test_generative_task.py
)
def test_sampling_gives_valid_ids_and_reuses_the_compiled_loop(lm, make_sampler):
    # Two calls with one sampler and the same shapes: one new compiled function, reused.
    sampler = make_sampler()
    before = len(lm._generate_functions)
    first = np.array(lm.generate(PROMPTS, max_length=MAX_LENGTH, sampler=sampler))
    second = np.array(lm.generate(PROMPTS[::-1], max_length=MAX_LENGTH, sampler=sampler))
    assert len(lm._generate_functions) == before + 1
    for tokens, prompts in ((first, PROMPTS), (second, PROMPTS[::-1])):
        assert tokens.shape == (3, MAX_LENGTH)
        assert tokens.min() >= 0 and tokens.max() < VOCAB
        for row, prompt in zip(tokens, prompts):
            assert row[: len(prompt)].tolist() == prompt
    if isinstance(sampler, keras_hub.samplers.TopKSampler):
        # Every sampled token is among the k most likely ones at its step.
        logits = full_logits(lm, first)
        for b, prompt in enumerate(PROMPTS):
            for t in range(len(prompt), MAX_LENGTH):
                top = np.argsort(logits[b, t - 1])[-4:]
                assert first[b, t] in top


def test_a_sampler_named_by_a_string_is_compiled_once(alone_and_new_functions):
    # Three calls with sampler="greedy" and the same shapes: one compiled loop per prefill
    # length (a power of two, at least 8). The prompts of lengths 3, 2 and 4 (prefill 8) all
    # reuse the loop of the compile default, greedy, that `as_list` compiled.
    assert alone_and_new_functions[1] == 0


def test_prompt_longer_than_max_length_raises(lm):
    with pytest.raises(ValueError, match="longer than max_length"):
        lm.generate([[3, 4, 5, 6, 7]], max_length=4)
    with pytest.raises(ValueError, match="longer than max_length"):
        lm.generate(np.arange(3, 9), max_length=5)
    with pytest.raises(ValueError, match="longer than max_length"):
        lm.generate(right_padded([[3, 4, 5, 6, 7, 8]], width=8), max_length=5)


def test_empty_prompts_raise(lm):
    with pytest.raises(ValueError, match="at least one token"):
        lm.generate([[3, 4], []], max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="at least one token"):
        lm.generate(np.zeros((0,), "int32"), max_length=MAX_LENGTH)
    with pytest.raises(ValueError, match="at least one token"):
        lm.generate({"token_ids": np.zeros((2, MAX_LENGTH), "int32"),
                     "padding_mask": np.array([[1] + [0] * 9, [0] * 10], bool)})


def test_unknown_sampler_raises(lm):
    with pytest.raises(ValueError, match="sampler"):
        lm.generate(PROMPTS, max_length=MAX_LENGTH, sampler="nucleus")


@pytest.mark.parametrize("lengths, width, expected", [
    ([1], 16, 8), ([3, 2, 4], 16, 8), ([8, 9], 16, 8), ([9, 12], 16, 16), ([9, 12], 12, 12),
    ([100, 120], 128, 128)])
def test_the_prefill_covers_the_shortest_prompt_rounded_up_to_a_power_of_two(lengths, width,
                                                                           expected):
    prompts = [list(range(1, n + 1)) for n in lengths]
    assert pack_prompts(prompts, max_length=width).prefill_length(width) == expected


@pytest.mark.parametrize("lengths, expected", [([1], 1), ([3, 2, 4], 2), ([8, 9], 8), ([7, 12], 4)])
def test_an_in_order_prefill_is_the_shortest_prompt_rounded_down(lengths, expected):
    prompts = [list(range(1, n + 1)) for n in lengths]
    packed = pack_prompts(prompts, max_length=16)
    assert packed.prefill_length(16, in_order=True) == expected


@pytest.mark.parametrize("prefill_length", [2, 4, 8])
def test_every_prefill_length_gives_the_same_tokens(lm, greedy, prefill_length):
    # Shorter than the shortest prompt (the loop feeds the rest of the prompt), as long as
    # it, or past it into the padding (written again by the loop before it is read).
    packed = pack_prompts(PROMPTS, max_length=MAX_LENGTH)
    outputs = lm.generate_step({"token_ids": keras.ops.convert_to_tensor(packed.token_ids),
                                "padding_mask": keras.ops.convert_to_tensor(packed.padding_mask)},
                               prefill_length=prefill_length)
    np.testing.assert_array_equal(to_numpy(outputs["token_ids"]), greedy)


def test_a_rolling_cache_is_prefilled_in_order():
    # Local attention decodes with a rolling cache of 3 slots: a pass running past the
    # shortest prompt would overwrite the slots the loop still reads, so the prefill stops
    # before it, and cached generation equals the uncached reference.
    keras.utils.set_random_seed(5)
    mixer = MultiHeadAttention(num_heads=2, head_dim=4, pattern=LocalPattern(2))
    assert mixer.cache_is_rolling and not MultiHeadAttention(num_heads=2).cache_is_rolling
    block = TransformerBlock(mixer=mixer, feedforward=FeedForward(FFN, activation="gelu"),
                             norm_placement="pre")
    model = randomize_embeddings(CausalLM(vocabulary_size=VOCAB, num_layers=1,
                                          hidden_dim=WIDTH, block=block, position="rotary"),
                                 seed=5)
    prompts = [[3, 4, 5, 6, 7], [6, 7, 8, 9, 10, 11, 12]]
    assert pack_prompts(prompts, max_length=16).prefill_length(16, in_order=True) == 4
    cached = np.array(model.generate(prompts, max_length=16))
    np.testing.assert_array_equal(cached, np.array(model.generate(prompts, max_length=16,
                                                                  use_cache=False)))


def test_whole_width_prefill_gives_the_same_tokens(lm, greedy):
    # keras-hub's way (the cache filled over the whole padded width, the loop starting at the
    # shortest prompt) against the bucketed prefill that `generate` uses.
    packed = pack_prompts(PROMPTS, max_length=MAX_LENGTH)
    outputs = lm.generate_step({"token_ids": keras.ops.convert_to_tensor(packed.token_ids),
                                "padding_mask": keras.ops.convert_to_tensor(packed.padding_mask)})
    np.testing.assert_array_equal(to_numpy(outputs["token_ids"]), greedy)
    assert to_numpy(outputs["padding_mask"]).all()


def test_the_compiled_loop_reads_the_current_weights():
    # The loop (XLA) or its traced step (PyTorch) takes the variables as inputs: new weights
    # after the first call change the tokens, and cached and uncached decoding still agree.
    keras.utils.set_random_seed(4)
    model = CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, num_heads=2,
                     intermediate_dim=FFN, max_sequence_length=12, position="learned")
    model = randomize_embeddings(model, seed=4)
    first = np.array(model.generate(PROMPTS, max_length=MAX_LENGTH))
    model.set_weights([w[::-1].copy() if w.ndim == 2 else w for w in model.get_weights()])
    cached = np.array(model.generate(PROMPTS, max_length=MAX_LENGTH))
    uncached = np.array(model.generate(PROMPTS, max_length=MAX_LENGTH, use_cache=False))
    np.testing.assert_array_equal(cached, uncached)
    assert not np.array_equal(cached, first)


def _compiled_loop_body(model, inputs, prefill_length):
    """The optimised HLO of the body of the decoding loop, compiled as `generate` compiles it
    on JAX (`jax.jit` of `generate_step` over the variables' values)."""
    import jax

    variables = model.variables
    sampler = keras_hub.samplers.GreedySampler()

    def stateless(values, tensors):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return model.generate_step(tensors, sampler=sampler, prefill_length=prefill_length)

    text = jax.jit(stateless).lower([v.value for v in variables], inputs).compile().as_text()
    body = re.search(r" while\(.*?body=%([\w.\-]+)", text).group(1)
    start = text.index(f"\n%{body} ")
    return text[start:text.index("\n}", start)]


@pytest.mark.skipif(keras.config.backend() != "jax",
                    reason="reads the HLO that XLA compiles from jax.jit")
def test_the_decoding_loop_writes_the_cache_in_place(lm):
    # The head-major cache (docs/design.md, "Caches") is written in place and read
    # as it is: the compiled loop holds no copy of a cache buffer. At batch 1 XLA:CPU copies
    # the key buffers (the products read the cache through a reshape that drops the size-1
    # batch; see there), so the property is checked at the batch of PROMPTS.
    inputs = right_padded(PROMPTS)
    keys, values = lm.init_cache(len(PROMPTS), MAX_LENGTH)[0]
    assert tuple(keys.shape) == tuple(values.shape) == (len(PROMPTS), 2, MAX_LENGTH, 4)
    body = _compiled_loop_body(lm, inputs, prefill_length=2)
    cache = re.escape(f"f32[{len(PROMPTS)},2,{MAX_LENGTH},4]")
    assert re.search(rf"= {cache}\S* fusion\(", body), "no cache write found in the loop body"
    copies = re.findall(rf"= {cache}\S* copy\(", body)
    assert not copies, f"{len(copies)} copies of a cache buffer in the decoding loop"
