"""Seq2SeqLM.generate: greedy = step-by-step argmax, source padding, decoder prompts, return
forms, a recurrent decoder, and errors.

One module-scoped model (separate source and target embeddings, learned positions, untied
output) serves most tests; sources are 3 sequences of lengths 5, 2, 3 and targets have
length 8, so most tests reuse one compiled loop. Cache = no cache for greedy and beam search,
stop tokens and the input forms of every generating task are in test_generative_task.py.
"""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from keras_xf.models import Seq2SeqLM
from tests.models.tiny import VOCAB
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_lm
from tests.layer_checks import to_numpy

SOURCE_VOCAB = 20
SOURCES = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
WIDTH = 5  # the longest source
MAX_LENGTH = 8
START = 1


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(2)
    lm = seq2seq_lm(num_layers=1, position="learned", tie_embeddings=False,
                    share_embeddings=False, source_vocabulary_size=SOURCE_VOCAB,
                    start_token_id=START)
    return randomize_embeddings(lm, seed=2)


@pytest.fixture(scope="module")
def greedy(model):
    return np.array(model.generate(SOURCES, max_length=MAX_LENGTH))


def padded_sources(sources=SOURCES, width=WIDTH):
    ids = np.zeros((len(sources), width), "int32")
    mask = np.zeros((len(sources), width), "int32")
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
        mask[row, : len(source)] = 1
    return {"encoder_token_ids": ids, "encoder_padding_mask": mask}


def test_greedy_is_the_argmax_of_the_full_forward_pass(model, greedy):
    assert greedy.shape == (3, MAX_LENGTH)
    assert (greedy[:, 0] == START).all()
    batch = dict(padded_sources(), decoder_token_ids=greedy.astype("int32"),
                 decoder_padding_mask=np.ones_like(greedy, "int32"))
    logits = to_numpy(model.predict_on_batch(batch))  # the full forward pass, compiled once
    for b in range(3):
        for t in range(1, MAX_LENGTH):
            scores = logits[b, t - 1]
            assert scores[greedy[b, t]] >= scores.max() - 1e-4, (b, t)
    assert len(set(greedy[:, 1:].ravel().tolist())) >= 4


def test_each_row_is_independent_of_the_others(model, greedy):
    # The same sources in another order (so with other neighbours and padding): same rows.
    order = [2, 0, 1]
    shuffled = model.generate([SOURCES[i] for i in order], max_length=MAX_LENGTH)
    np.testing.assert_array_equal(np.array(shuffled), greedy[order])


def test_beam_search_after_another_batch_size(model):
    """One source after a batch of two: its beams are one row repeated, a broadcast view
    that the in-place cache write of PyTorch copies before writing."""
    two = np.array(model.generate(SOURCES[:2], max_length=MAX_LENGTH, sampler="beam"))
    one = np.array(model.generate(SOURCES[:1], max_length=MAX_LENGTH, sampler="beam"))
    np.testing.assert_array_equal(one[0], two[0])


def test_decoder_prompts_are_kept_and_continued(model, greedy):
    prefix = 3
    inputs = padded_sources()
    inputs["decoder_token_ids"] = np.where(np.arange(MAX_LENGTH) < prefix, greedy, 0)
    inputs["decoder_padding_mask"] = np.broadcast_to(np.arange(MAX_LENGTH) < prefix,
                                                     greedy.shape)
    result = model.generate(inputs)
    assert set(result) == {"decoder_token_ids", "decoder_padding_mask"}
    # A prefix of the greedy output continues as the greedy output.
    np.testing.assert_array_equal(result["decoder_token_ids"], greedy)

    forced = inputs["decoder_token_ids"].copy()
    forced[:, 1] = (greedy[:, 1] + 1) % VOCAB
    result = model.generate(dict(inputs, decoder_token_ids=forced))
    np.testing.assert_array_equal(result["decoder_token_ids"][:, :prefix], forced[:, :prefix])


def test_return_structure_follows_the_source_structure(model, greedy):
    as_dict = model.generate(padded_sources(), max_length=MAX_LENGTH)
    assert set(as_dict) == {"decoder_token_ids", "decoder_padding_mask"}
    np.testing.assert_array_equal(as_dict["decoder_token_ids"], greedy)

    as_list = model.generate(SOURCES, max_length=MAX_LENGTH)
    assert isinstance(as_list, list) and as_list == greedy.tolist()

    equal_length = np.array([(s * WIDTH)[:WIDTH] for s in SOURCES], "int32")
    as_array = model.generate(equal_length, max_length=MAX_LENGTH)
    assert isinstance(as_array, np.ndarray) and as_array.shape == (3, MAX_LENGTH)
    np.testing.assert_array_equal(as_array[0], greedy[0])  # row 0 is unchanged

    # One source alone, as a 1-D array: a 1-D target, equal to its row in the batch.
    single = model.generate(np.array(SOURCES[0]), max_length=MAX_LENGTH)
    assert isinstance(single, np.ndarray) and single.shape == (MAX_LENGTH,)
    np.testing.assert_array_equal(single, greedy[0])


def test_errors(model):
    with pytest.raises(ValueError, match="at least one token"):
        model.generate([[3, 4], []], max_length=MAX_LENGTH)
    inputs = padded_sources()
    inputs["decoder_token_ids"] = np.ones((3, 6), "int32")
    with pytest.raises(ValueError, match="longer than max_length"):
        model.generate(inputs, max_length=4)


def test_a_recurrent_decoder_feeds_every_token_once():
    # A GRU decoder keeps a state, not a cache addressed by position: the prefill starts at
    # the first token, and decoding with the state equals the full pass. Ragged decoder
    # prompts (lengths 3 and 2) are kept while the shorter row already generates.
    keras.utils.set_random_seed(5)
    block = TransformerBlock(RecurrentMixer("gru"), FeedForward(16),
                             cross_attention=MultiHeadAttention(2))
    lm = randomize_embeddings(Seq2SeqLM(vocabulary_size=SOURCE_VOCAB, num_layers=1, hidden_dim=8,
                                        num_heads=2, intermediate_dim=16, max_sequence_length=8,
                                        decoder_block=block), seed=5)
    assert lm._has_recurrent_cache()
    targets = np.array([[START, 5, 6] + [0] * 5, [START, 7] + [0] * 6], "int32")
    inputs = {"encoder_token_ids": np.array([[3, 4, 5, 6], [8, 9, 0, 0]], "int32"),
              "decoder_token_ids": targets}
    cached = lm.generate(inputs, max_length=MAX_LENGTH)
    uncached = lm.generate(inputs, max_length=MAX_LENGTH, use_cache=False)
    np.testing.assert_array_equal(cached["decoder_token_ids"], uncached["decoder_token_ids"])
    np.testing.assert_array_equal(cached["decoder_token_ids"][:, :2], targets[:, :2])
    assert cached["decoder_token_ids"][0, 2] == 6
