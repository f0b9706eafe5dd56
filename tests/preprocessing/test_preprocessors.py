"""Task preprocessors: strings to packed ids, masks, shifted labels and weights, with the
start and end tokens the tokenizer's config gives; prompts to ids and ids back to text."""

import json

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import HuggingFaceTokenizer  # noqa: E402
from keras_xf.preprocessing import Preprocessor  # noqa: E402
from keras_xf.preprocessing import Seq2SeqLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import TextClassifierPreprocessor  # noqa: E402
from keras_xf.preprocessing import is_text  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

TEXTS = folders.SHAKESPEARE[:2]
BOS, EOS, PAD = 0, 1, 2


def test_causal_lm_inputs_labels_and_weights(tokenizer):
    preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=32)
    assert preprocessor.add_start_token and preprocessor.add_end_token
    x, y, weights = preprocessor(TEXTS)
    rows = [[BOS] + row + [EOS] for row in tokenizer(TEXTS, add_special_tokens=False)]
    assert x["token_ids"].shape == y.shape == weights.shape == (2, 32)
    assert x["token_ids"].dtype == x["padding_mask"].dtype == y.dtype == np.int32
    for index, row in enumerate(rows):
        n = len(row)
        np.testing.assert_array_equal(x["token_ids"][index, : n - 1], row[:-1])
        np.testing.assert_array_equal(y[index, : n - 1], row[1:])  # shifted left by one
        np.testing.assert_array_equal(weights[index], np.arange(32) < n - 1)
        np.testing.assert_array_equal(x["padding_mask"][index], np.arange(32) < n)
        assert x["token_ids"][index, n - 1] == EOS and np.all(x["token_ids"][index, n:] == PAD)
    _, _, scaled = preprocessor(TEXTS, sample_weight=[1.0, 0.5])
    np.testing.assert_allclose(scaled[1], 0.5 * weights[1])


def test_causal_lm_flags_and_prompts(tokenizer):
    plain = CausalLMPreprocessor(tokenizer, sequence_length=32, add_start_token=False,
                                 add_end_token=False)
    x, _, weights = plain(TEXTS[:1])
    ids = tokenizer(TEXTS[0], add_special_tokens=False)
    np.testing.assert_array_equal(x["token_ids"][0, : len(ids) - 1], ids[:-1])
    assert weights[0].sum() == len(ids) - 1
    preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=32)
    prompts = preprocessor.generate_preprocess(TEXTS)
    assert prompts == tokenizer(TEXTS)  # the start token, no end token
    assert preprocessor.generate_preprocess("<s>To be") == [[BOS] + tokenizer("To be")[1:]]


def test_generated_ids_back_to_text(tokenizer):
    preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=32)
    prompt = tokenizer("To be")
    more = tokenizer(", or not", add_special_tokens=False)
    after = tokenizer(" to be", add_special_tokens=False)
    outputs = [prompt + more + [EOS] + after]
    assert preprocessor.generate_postprocess(outputs, [prompt]) == ["To be, or not"]
    assert preprocessor.generate_postprocess(outputs) == ["To be, or not"]
    padded = {"token_ids": np.array([prompt + more + [PAD] * 3]),
              "padding_mask": np.array([[True] * (len(prompt) + len(more)) + [False] * 3])}
    assert preprocessor.generate_postprocess(padded) == ["To be, or not"]
    chat = tokenizer("<|im_end|></s>", add_special_tokens=False)
    # An end token inside the prompt does not end the text.
    assert preprocessor.generate_postprocess([chat + more], [chat]) == [", or not"]


def test_long_texts_raise_unless_truncation_is_asked(tokenizer):
    preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=8)
    with pytest.raises(ValueError, match="sequence_length=8"):
        preprocessor(TEXTS)
    with pytest.raises(ValueError, match="sequence_length=8"):
        preprocessor.generate_preprocess(TEXTS)
    cut = CausalLMPreprocessor(tokenizer, sequence_length=8, truncate=True)
    x, y, weights = cut(TEXTS)
    assert y[0, -1] == EOS and weights.min() == 1  # the end token is kept
    assert [len(row) for row in cut.generate_preprocess(TEXTS)] == [8, 8]


def test_seq2seq_sources_targets_and_prompts(tokenizer):
    preprocessor = Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=24,
                                         decoder_sequence_length=24,
                                         decoder_start_token_id=PAD)
    x, y, weights = preprocessor({"encoder_text": TEXTS, "decoder_text": TEXTS[::-1]})
    np.testing.assert_array_equal(x["encoder_token_ids"], tokenizer.pack(TEXTS, 24)["token_ids"])
    target = tokenizer(TEXTS[1], add_special_tokens=False)
    np.testing.assert_array_equal(x["decoder_token_ids"][0, : len(target) + 1], [PAD] + target)
    np.testing.assert_array_equal(y[0, : len(target) + 1], target + [EOS])
    assert weights[0].sum() == len(target) + 1
    assert preprocessor.generate_preprocess(TEXTS) == tokenizer(TEXTS)
    assert preprocessor.generation_length == 24
    assert preprocessor.generate_postprocess([[PAD] + target + [EOS, 7]]) == [TEXTS[1]]
    with pytest.raises(ValueError, match="encoder_text"):
        preprocessor(TEXTS)
    with pytest.raises(ValueError, match="encoder_sequence_length=24"):
        preprocessor({"encoder_text": [" ".join(TEXTS)], "decoder_text": TEXTS[:1]})
    with pytest.raises(ValueError, match="decoder_sequence_length=24"):
        preprocessor({"encoder_text": TEXTS, "decoder_text": [" ".join(TEXTS)]})


def test_classifier_inputs_and_labels(tokenizer):
    preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=24)
    x, y = preprocessor(TEXTS, [0, 1])
    np.testing.assert_array_equal(x["token_ids"], tokenizer.pack(TEXTS, 24)["token_ids"])
    assert y.dtype == np.int32 and y.tolist() == [0, 1]
    assert isinstance(preprocessor(TEXTS), dict)
    with pytest.raises(ValueError, match="one integer label per text"):
        preprocessor(TEXTS, [0.5, 1.0])


@pytest.mark.parametrize("make", [
    lambda t: CausalLMPreprocessor(t, sequence_length=16, add_end_token=False, truncate=True),
    lambda t: Seq2SeqLMPreprocessor(t, 8, 12, decoder_start_token_id=2, truncate=True),
    lambda t: TextClassifierPreprocessor(t, sequence_length=10, truncate=True),
], ids=["causal_lm", "seq2seq_lm", "text_classifier"])
def test_serialization_round_trip(tokenizer, make):
    preprocessor = make(tokenizer)
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(preprocessor)))
    restored = keras.saving.deserialize_keras_object(config)
    assert type(restored) is type(preprocessor)
    assert restored.get_config() == preprocessor.get_config()
    assert restored.tokenizer(TEXTS) == tokenizer(TEXTS)
    inputs = {"encoder_text": TEXTS[:1], "decoder_text": ["To be"]} \
        if isinstance(preprocessor, Seq2SeqLMPreprocessor) else TEXTS[:1]
    x, _, _ = keras.utils.unpack_x_y_sample_weight(restored(inputs))
    expected, _, _ = keras.utils.unpack_x_y_sample_weight(preprocessor(inputs))
    assert {k: v.tolist() for k, v in x.items()} == {k: v.tolist() for k, v in expected.items()}


def test_bad_arguments_name_themselves(tokenizer):
    with pytest.raises(ValueError, match="sequence_length"):
        CausalLMPreprocessor(tokenizer, sequence_length=None)
    with pytest.raises(ValueError, match="Received: tokenizer of type dict_keys"):
        CausalLMPreprocessor({}.keys(), sequence_length=8)
    with pytest.raises(ValueError, match="add_end_token must be None or a bool"):
        CausalLMPreprocessor(tokenizer, sequence_length=8, add_end_token="yes")
    with pytest.raises(ValueError, match="truncate"):
        TextClassifierPreprocessor(tokenizer, sequence_length=8, truncate=1)
    with pytest.raises(ValueError, match="labels are its texts"):
        CausalLMPreprocessor(tokenizer, sequence_length=32)(TEXTS, [0, 1])
    with pytest.raises(ValueError, match="x must be a string"):
        CausalLMPreprocessor(tokenizer, sequence_length=32)([[1, 2]])
    with pytest.raises(ValueError, match="one weight per text"):
        CausalLMPreprocessor(tokenizer, sequence_length=32)(TEXTS, sample_weight=[1.0])
    bare = HuggingFaceTokenizer(tokenizer_json=tokenizer.tokenizer_json)
    with pytest.raises(ValueError, match="add_start_token=True"):
        CausalLMPreprocessor(bare, sequence_length=8, add_start_token=True)


def test_is_text():
    assert is_text("a") and is_text(["a", "b"]) and is_text(np.array(["a"]))
    assert not is_text([]) and not is_text([[1]]) and not is_text(np.array([1]))


@pytest.mark.parametrize("cls", [Preprocessor, CausalLMPreprocessor, Seq2SeqLMPreprocessor,
                                 TextClassifierPreprocessor])
def test_docstring_examples_run(cls):
    pytest.importorskip("keras_hub")
    namespace = {cls.__name__: cls}
    calls = folders.docstring_calls(cls)
    assert calls
    for call in calls:
        exec(call, namespace)
