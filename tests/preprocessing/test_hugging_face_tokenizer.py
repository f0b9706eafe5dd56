"""`HuggingFaceTokenizer`: a folder's padding and truncation never leak, special tokens come
from the folder, packing and truncation only when asked, equal to `transformers`."""

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import HuggingFaceTokenizer as CheckpointsTokenizer  # noqa: E402
from keras_xf.preprocessing import HuggingFaceTokenizer  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

TEXTS = folders.SHAKESPEARE[:3]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return folders.write_tokenizer_folder(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tokenizer(folder):
    return HuggingFaceTokenizer(folder)


@pytest.fixture(scope="module")
def reference(folder):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_the_folder_padding_and_truncation_do_not_leak(tokenizer, reference, folder):
    saved = json.loads((folder / "tokenizer.json").read_text())
    assert saved["padding"] is not None and saved["truncation"] is not None
    ids = tokenizer(TEXTS)
    assert ids == reference(TEXTS)["input_ids"]
    assert max(len(row) for row in ids) > folders.SAVED_LENGTH  # neither cut nor padded to 16
    assert len({len(row) for row in ids}) > 1  # ragged
    assert tokenizer(TEXTS[0]) == reference(TEXTS[0])["input_ids"]
    assert tokenizer(TEXTS, add_special_tokens=False) == reference(
        TEXTS, add_special_tokens=False)["input_ids"]


def test_special_tokens_come_from_the_folder(tokenizer, reference):
    assert tokenizer.special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                        "pad_token": "<pad>"}
    assert (tokenizer.start_token_id, tokenizer.end_token_id, tokenizer.pad_token_id) == (
        reference.bos_token_id, reference.eos_token_id, reference.pad_token_id)
    assert tokenizer.special_token_ids == [0, 1, 2, 3, 4]
    assert tokenizer.adds_start_token
    assert tokenizer.vocabulary_size == folders.VOCABULARY_SIZE
    assert tokenizer.id_to_token(tokenizer.token_to_id("</s>")) == "</s>"


def test_special_tokens_fall_back_to_the_map_and_the_model_config(tmp_path):
    folders.write_tokenizer_folder(tmp_path, tokenizer_config=False)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [2],
                                                      "pad_token_id": 2}))
    tokenizer = HuggingFaceTokenizer(tmp_path)
    assert tokenizer.special_tokens == {"eos_token": "</s>", "bos_token": "<s>",
                                        "pad_token": "<pad>"}
    assert tokenizer.unk_token_id is None
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<pad>"}))
    assert HuggingFaceTokenizer(tmp_path).unk_token_id == 2
    assert tokenizer.chat_template is None


def test_packing_gives_ids_and_an_int32_mask(tokenizer, reference):
    packed = tokenizer.pack(TEXTS, sequence_length=32)
    expected = reference(TEXTS, padding="max_length", max_length=32)
    assert packed["token_ids"].dtype == packed["padding_mask"].dtype == np.int32
    np.testing.assert_array_equal(packed["token_ids"], expected["input_ids"])
    np.testing.assert_array_equal(packed["padding_mask"], expected["attention_mask"])


def test_truncation_only_when_asked_with_the_length_named(tokenizer, reference):
    with pytest.raises(ValueError, match="sequence_length=8"):
        tokenizer.pack(TEXTS, sequence_length=8)
    with pytest.raises(ValueError, match="sequence_length=8"):
        tokenizer.tokenize(TEXTS, sequence_length=8)
    with pytest.raises(ValueError, match="sequence_length=None"):
        tokenizer.tokenize(TEXTS, truncate=True)
    cut = tokenizer.tokenize(TEXTS, sequence_length=8, truncate=True)
    assert cut == reference(TEXTS, truncation=True, max_length=8)["input_ids"]
    packed = tokenizer.pack(TEXTS, sequence_length=8, truncate=True)
    np.testing.assert_array_equal(packed["token_ids"], cut)


def test_detokenize_round_trip_in_every_form(tokenizer):
    ids = tokenizer(TEXTS)
    assert tokenizer.detokenize(ids) == TEXTS
    assert tokenizer.detokenize(ids[0]) == TEXTS[0]
    assert tokenizer.detokenize(np.array(ids[0])) == TEXTS[0]
    assert tokenizer.detokenize(tokenizer.pack(TEXTS, 32)) == TEXTS
    assert tokenizer.detokenize(ids[0], skip_special_tokens=False).startswith("<s>")
    assert tokenizer.detokenize([]) == ""


def test_config_round_trip_needs_no_folder(tokenizer):
    config = json.loads(json.dumps(tokenizer.get_config()))
    restored = HuggingFaceTokenizer.from_config(config)
    assert restored(TEXTS) == tokenizer(TEXTS)
    assert restored.special_tokens == tokenizer.special_tokens
    assert restored.chat_template == tokenizer.chat_template


def test_checkpoints_re_exports_the_class():
    assert CheckpointsTokenizer is HuggingFaceTokenizer


def test_bad_arguments_are_refused(tmp_path, folder):
    with pytest.raises(ValueError, match="tokenizer.json"):
        HuggingFaceTokenizer(tmp_path)
    with pytest.raises(ValueError, match="either directory or tokenizer_json"):
        HuggingFaceTokenizer()
    with pytest.raises(ValueError, match="special_tokens"):
        HuggingFaceTokenizer(tokenizer_json=(folder / "tokenizer.json").read_text(),
                             special_tokens={"start": "<s>"})
    with pytest.raises(ValueError, match="texts must be a string"):
        HuggingFaceTokenizer(folder).tokenize([1, 2])
    with pytest.raises(ValueError, match="sequence_length"):
        HuggingFaceTokenizer(folder).pack(TEXTS, sequence_length=0)


def test_docstring_example_runs(folder):
    namespace = {"HuggingFaceTokenizer": HuggingFaceTokenizer,
                 "tokenizer": HuggingFaceTokenizer(folder)}
    calls = folders.docstring_calls(HuggingFaceTokenizer)
    assert len(calls) == 4
    for call in calls:
        exec(call, namespace)
    assert namespace["batch"]["token_ids"].shape == (1, 16)
    assert namespace["prompt"].endswith("<|im_start|>assistant\n\n")


def test_a_word_piece_folder_keeps_cls_and_sep_when_truncated(tmp_path):
    import tokenizers

    bert = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    bert.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    bert.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    bert.decoder = tokenizers.decoders.WordPiece()
    bert.train_from_iterator(folders.SHAKESPEARE * 4, tokenizers.trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    bert.post_processor = tokenizers.processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    bert.enable_padding(length=128)  # what sentence-transformers folders save
    bert.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HuggingFaceTokenizer(tmp_path)
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert tokenizer(TEXTS) == reference(TEXTS)["input_ids"]
    cut = tokenizer.tokenize(TEXTS, sequence_length=6, truncate=True)
    assert cut == reference(TEXTS, truncation=True, max_length=6)["input_ids"]
    assert [tokenizer.id_to_token(i) for i in (cut[0][0], cut[0][-1])] == ["[CLS]", "[SEP]"]
    assert tokenizer.detokenize(cut) == reference.batch_decode(cut, skip_special_tokens=True)
