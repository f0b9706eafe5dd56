"""keras-hub's tokenizers (byte, byte-pair, SentencePiece) in the slot of a keras_xf tokenizer:
lists and strings out on every backend, special tokens added only when asked, and a config
that carries the vocabulary."""

import io
import json

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import KerasHubTokenizer  # noqa: E402
from keras_xf.preprocessing import text_tokenizer  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

TEXTS = folders.SHAKESPEARE[:2]


@pytest.fixture(scope="module")
def byte_pair():
    bpe = folders.train_tokenizer(padding=False)
    vocabulary = bpe.get_vocab()
    vocabulary["<|endoftext|>"] = len(vocabulary)
    merges = [" ".join(pair) for pair in json.loads(bpe.to_str())["model"]["merges"]]
    return keras_hub.tokenizers.GPT2Tokenizer(vocabulary=vocabulary, merges=merges)


@pytest.fixture(scope="module")
def sentence_piece():
    sentencepiece = pytest.importorskip("sentencepiece")
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(folders.SHAKESPEARE * 4), model_writer=proto, vocab_size=60,
        model_type="bpe", pad_id=3, bos_id=1, eos_id=2, unk_id=0)
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=proto.getvalue())


def test_byte_tokenizer_gives_lists_and_strings():
    tokenizer = text_tokenizer(keras_hub.tokenizers.ByteTokenizer(lowercase=False))
    assert isinstance(tokenizer, KerasHubTokenizer)
    ids = tokenizer(TEXTS)
    assert ids == [list(text.encode()) for text in TEXTS]
    assert tokenizer(TEXTS[0]) == ids[0]
    assert tokenizer.detokenize(ids) == TEXTS
    assert tokenizer.detokenize(np.array(ids[0])) == TEXTS[0]
    assert (tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id) == (
        None, None, 0)
    packed = tokenizer.pack(TEXTS, sequence_length=48)
    assert packed["token_ids"].dtype == np.int32
    np.testing.assert_array_equal(packed["padding_mask"].sum(-1), [len(r) for r in ids])


def test_model_tokenizer_ids_and_special_tokens(byte_pair):
    tokenizer = KerasHubTokenizer(byte_pair)
    end = byte_pair.token_to_id("<|endoftext|>")
    assert tokenizer.start_token_id == tokenizer.end_token_id == end
    plain = tokenizer(TEXTS[0], add_special_tokens=False)
    assert plain == np.asarray(byte_pair(TEXTS[0])).tolist()
    assert tokenizer(TEXTS[0]) == [end] + plain + [end]
    assert tokenizer.detokenize([end] + plain + [end]) == TEXTS[0]
    assert tokenizer.detokenize([end] + plain, skip_special_tokens=False).startswith(
        "<|endoftext|>")
    cut = tokenizer.tokenize(TEXTS[0], sequence_length=6, truncate=True)
    assert cut == [end] + plain[:4] + [end]
    with pytest.raises(ValueError, match="sequence_length=6"):
        tokenizer.tokenize(TEXTS[0], sequence_length=6)


def test_sentence_piece_round_trip(sentence_piece):
    tokenizer = KerasHubTokenizer(sentence_piece, end_token_id=2)
    ids = tokenizer(TEXTS, add_special_tokens=False)
    assert all(isinstance(i, int) for i in ids[0])
    assert tokenizer.detokenize(ids) == TEXTS
    assert tokenizer(TEXTS[0])[-1] == 2


@pytest.mark.parametrize("kind", ["byte", "byte_pair", "sentence_piece"])
def test_config_carries_the_vocabulary(kind, byte_pair, sentence_piece):
    inner = {"byte": keras_hub.tokenizers.ByteTokenizer(lowercase=False), "byte_pair": byte_pair,
             "sentence_piece": sentence_piece}[kind]
    tokenizer = KerasHubTokenizer(inner, pad_token_id=1)
    config = json.loads(json.dumps(tokenizer.get_config()))
    restored = KerasHubTokenizer.from_config(config)
    assert restored(TEXTS) == tokenizer(TEXTS)
    assert restored.detokenize(restored(TEXTS)) == TEXTS
    assert restored.pad_token_id == 1


def test_a_preprocessor_takes_the_keras_hub_tokenizer(byte_pair):
    preprocessor = CausalLMPreprocessor(byte_pair, sequence_length=32)
    assert isinstance(preprocessor.tokenizer, KerasHubTokenizer)
    x, y, weights = preprocessor(TEXTS)
    end = byte_pair.token_to_id("<|endoftext|>")
    assert x["token_ids"][0, 0] == end  # keras-hub's GPT-2 preprocessor starts with it too
    np.testing.assert_array_equal(y[:, :-1], x["token_ids"][:, 1:])


def test_wrong_tokenizers_are_refused():
    with pytest.raises(ValueError, match="Received: tokenizer of type str"):
        text_tokenizer("gpt2")
    with pytest.raises(ValueError, match="keras_hub.tokenizers.Tokenizer"):
        KerasHubTokenizer(object())


def test_docstring_example_runs():
    namespace = {"KerasHubTokenizer": KerasHubTokenizer}
    for call in folders.docstring_calls(KerasHubTokenizer):
        exec(call, namespace)
    assert namespace["tokenizer"].detokenize([[97, 98, 99]]) == ["abc"]


def test_causal_lm_preprocessing_equals_keras_hub(byte_pair):
    ours = CausalLMPreprocessor(byte_pair, sequence_length=32)
    theirs = keras_hub.models.GPT2CausalLMPreprocessor(byte_pair, sequence_length=32)
    x, y, weights = ours(TEXTS)
    expected_x, expected_y, expected_weights = theirs(TEXTS)
    for key in ("token_ids", "padding_mask"):
        np.testing.assert_array_equal(x[key], np.asarray(expected_x[key]).astype("int32"))
    np.testing.assert_array_equal(y, np.asarray(expected_y))
    np.testing.assert_array_equal(weights, np.asarray(expected_weights))
    prompts = theirs.generate_preprocess(TEXTS)
    mask = np.asarray(prompts["padding_mask"]).astype(bool)
    assert ours.generate_preprocess(TEXTS) == [
        row[m].tolist() for row, m in zip(np.asarray(prompts["token_ids"]), mask)]
