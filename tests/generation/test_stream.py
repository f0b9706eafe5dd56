"""`stream`: tokens handed over as they are produced equal `generate`'s, for greedy search and
a seeded sampler, with ragged prompts, stop ids and the repetition penalty; its programs are
compiled once per bucket; beam search is refused.

One tiny module-scoped `CausalLM` (one layer, vocabulary 32, `max_sequence_length` 12),
ragged prompts of 3 and 5 tokens, output length 10 (bucket 12); and a tiny `Seq2SeqLM`, whose
stream starts from the start token with the cross-attention caches prefilled.
"""

import keras_hub
import numpy as np
import pytest

from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_lm

PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10]]
LENGTH = 10


@pytest.fixture(scope="module")
def lm():
    model = causal_lm(num_layers=1)
    randomize_embeddings(model)
    return model


def streamed(lm, **kwargs):
    """The prompts followed by the streamed tokens, padded to the output length: the
    layout of `generate`'s array."""
    pieces = list(lm.stream(PROMPTS, max_length=LENGTH, **kwargs))
    shortest = min(len(p) for p in PROMPTS)
    ids = np.full((len(PROMPTS), LENGTH), lm.pad_token_id, "int32")
    for row, prompt in enumerate(PROMPTS):
        ids[row, :shortest] = prompt[:shortest]
    if pieces:
        ids[:, shortest:shortest + len(pieces)] = np.stack(pieces, axis=1)
    return ids, pieces


def generated(lm, **kwargs):
    padded = np.zeros((len(PROMPTS), LENGTH), "int32")
    for row, prompt in enumerate(PROMPTS):
        padded[row, :len(prompt)] = prompt
    return np.asarray(lm.generate(padded, max_length=LENGTH, **kwargs))


def test_greedy_stream_equals_generate_and_compiles_once(lm):
    ids, pieces = streamed(lm, stop_token_ids=None)
    assert len(pieces) == LENGTH - 3
    assert all(piece.shape == (2,) and piece.dtype == np.int32 for piece in pieces)
    # The second row gives its own prompt tokens until its prompt ends.
    assert [int(piece[1]) for piece in pieces[:2]] == [9, 10]
    np.testing.assert_array_equal(ids, generated(lm, stop_token_ids=None))
    count = lm.generate_compile_count
    streamed(lm, stop_token_ids=None)
    assert lm.generate_compile_count == count


def test_stream_ends_at_stop_ids_as_generate_does(lm):
    plain = generated(lm, stop_token_ids=None)
    stops = [int(plain[0, 4]), int(plain[1, 6])]  # generated tokens of each row
    ids, pieces = streamed(lm, stop_token_ids=stops)
    np.testing.assert_array_equal(ids, generated(lm, stop_token_ids=stops))
    # Every row has ended by position 6: the stream ends there (positions 3 to 6 at most).
    assert len(pieces) <= 4


def test_seeded_sampling_stream_equals_generate(lm):
    arguments = dict(top_k=6, temperature=0.8, seed=11, repetition_penalty=1.5,
                     stop_token_ids=None)
    ids, _ = streamed(lm, **arguments)
    np.testing.assert_array_equal(ids, generated(lm, **arguments))


def test_beam_search_is_refused(lm):
    with pytest.raises(ValueError, match="stream works with samplers .* not with beam"):
        lm.stream(PROMPTS, max_length=LENGTH, sampler=keras_hub.samplers.BeamSampler(2))


def test_seq2seq_stream_equals_generate():
    model = seq2seq_lm(start_token_id=1)
    randomize_embeddings(model)
    sources = {"encoder_token_ids": np.array([[3, 4, 5, 6], [8, 9, 0, 0]], "int32")}
    expected = model.generate(sources, max_length=8, stop_token_ids=None)["decoder_token_ids"]
    pieces = list(model.stream(sources, max_length=8, stop_token_ids=None))
    np.testing.assert_array_equal(np.stack(pieces, axis=1), expected[:, 1:])
