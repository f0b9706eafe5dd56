"""pack_sequences, language_model_examples and seq2seq_examples: shapes, contents, errors."""

import numpy as np
import pytest

from keras_xf.training import language_model_examples
from keras_xf.training import pack_sequences
from keras_xf.training import seq2seq_examples


def test_pack_sequences_pads_and_masks():
    ids, mask = pack_sequences([[5, 6, 7], [8]])
    np.testing.assert_array_equal(ids, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(mask, [[True, True, True], [True, False, False]])
    assert ids.dtype == np.int32 and mask.dtype == bool


def test_pack_sequences_with_length_start_end_and_pad_id():
    ids, mask = pack_sequences([[5, 6], [7]], sequence_length=5, pad_token_id=9,
                               start_token_id=1, end_token_id=2)
    np.testing.assert_array_equal(ids, [[1, 5, 6, 2, 9], [1, 7, 2, 9, 9]])
    np.testing.assert_array_equal(mask.sum(axis=1), [4, 3])


def test_pack_sequences_never_truncates():
    with pytest.raises(ValueError, match="sequence_length"):
        pack_sequences([[1, 2, 3, 4]], sequence_length=3)
    with pytest.raises(ValueError, match="sequence_length"):
        pack_sequences([[1, 2, 3]], sequence_length=4, start_token_id=1, end_token_id=2)
    ids, _ = pack_sequences([[1, 2, 3]], sequence_length=3)
    assert ids.shape == (1, 3)


def test_language_model_examples_are_shifted_windows():
    stream = np.arange(3, 24)  # 21 ids
    x, y, weight = language_model_examples(stream, sequence_length=4)
    # Every full window of 5 ids, stride 4: starts 0, 4, 8, 12, 16.
    assert x["token_ids"].shape == y.shape == weight.shape == (5, 4)
    np.testing.assert_array_equal(x["token_ids"][:, 0], stream[[0, 4, 8, 12, 16]])
    np.testing.assert_array_equal(y, x["token_ids"] + 1)
    assert x["padding_mask"].all() and (weight == 1).all()
    assert x["token_ids"].dtype == np.int32


def test_language_model_examples_with_stride():
    stream = np.arange(10)
    x, y, _ = language_model_examples(stream, sequence_length=4, stride=2)
    np.testing.assert_array_equal(x["token_ids"][:, 0], [0, 2, 4])
    np.testing.assert_array_equal(y[-1], [5, 6, 7, 8])
    # A stream of exactly sequence_length + 1 ids makes one example.
    x, y, _ = language_model_examples(np.arange(5), sequence_length=4)
    np.testing.assert_array_equal(x["token_ids"], [[0, 1, 2, 3]])
    np.testing.assert_array_equal(y, [[1, 2, 3, 4]])


def test_language_model_examples_too_short_stream_raises():
    with pytest.raises(ValueError, match="sequence_length"):
        language_model_examples(np.arange(4), sequence_length=4)


def test_seq2seq_examples_teacher_forcing():
    x, y, weight = seq2seq_examples([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    np.testing.assert_array_equal(x["encoder_token_ids"], [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(x["encoder_padding_mask"], [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(x["decoder_token_ids"], [[1, 9, 10, 0], [1, 11, 12, 13]])
    np.testing.assert_array_equal(x["decoder_padding_mask"], [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(y, [[9, 10, 2, 0], [11, 12, 13, 2]])
    np.testing.assert_array_equal(weight, [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert weight.dtype == np.float32
    assert x["encoder_padding_mask"].dtype == x["decoder_padding_mask"].dtype == np.int32


def test_seq2seq_examples_fixed_lengths_and_errors():
    x, y, _ = seq2seq_examples([[5]], [[9]], source_length=4, target_length=3)
    assert x["encoder_token_ids"].shape == (1, 4)
    assert x["decoder_token_ids"].shape == y.shape == (1, 3)
    with pytest.raises(ValueError, match="sequence_length"):
        seq2seq_examples([[5, 6, 7]], [[9]], source_length=2)
    with pytest.raises(ValueError, match="sequence_length"):
        seq2seq_examples([[5]], [[9, 10, 11]], target_length=3)


def test_stream_examples_continue_each_row_from_batch_to_batch():
    import doctest

    from keras_xf.training import stream_examples

    stream = np.arange(103)
    x, y, weights = stream_examples(stream, batch_size=3, chunk_length=4)
    ids = x["token_ids"]
    assert ids.shape == (3 * 8, 4) and y.shape == ids.shape and weights.shape == ids.shape
    rows = ids.reshape(8, 3, 4).transpose(1, 0, 2).reshape(3, 32)  # each row, batch by batch
    np.testing.assert_array_equal(rows, np.stack([np.arange(b * 34, b * 34 + 32)
                                                  for b in range(3)]))
    np.testing.assert_array_equal(y, ids + 1)
    assert x["padding_mask"].all()
    test = doctest.DocTestParser().get_doctest(stream_examples.__doc__, {"np": np,
                                               "stream_examples": stream_examples},
                                               "stream_examples", None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0


@pytest.mark.parametrize("arguments, message", [
    ((np.arange(10), 2, 8), "too short"),
    ((np.arange(100), 0, 8), "batch_size must be a positive int"),
    ((np.arange(100), 2, 1.5), "chunk_length must be a positive int"),
])
def test_stream_examples_bad_arguments(arguments, message):
    from keras_xf.training import stream_examples

    with pytest.raises(ValueError, match=message):
        stream_examples(*arguments)
