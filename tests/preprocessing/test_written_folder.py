"""`to_huggingface` completes the folder: a model loaded with its tokenizer is written back
with the tokenizer files and a generation config, and `transformers` (its tokenizer, its
greedy `generate` and the text-generation pipeline) gives what keras_xf gives."""

import json
import os

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from keras_xf.checkpoints.generation_config import generation_config  # noqa: E402
from keras_xf.checkpoints.tokenizer_files import write_tokenizer_files  # noqa: E402
from keras_xf.models import Seq2SeqLM  # noqa: E402
from keras_xf.preprocessing import HuggingFaceTokenizer  # noqa: E402
from keras_xf.preprocessing import Seq2SeqLMPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

PROMPTS = ["To be, or", "The slings and arrows of"]
NEW_TOKENS = 12
CHAT = [{"role": "user", "content": "To be?"}, {"role": "assistant", "content": "Or not."},
        {"role": "user", "content": "That is the question."}]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return folders.write_llama_folder(tmp_path_factory.mktemp("llama"))[0]


@pytest.fixture(scope="module")
def model(llama):
    return from_huggingface(llama)


@pytest.fixture(scope="module")
def written(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("written")
    assert to_huggingface(model, out) == "LlamaForCausalLM"
    return out


def test_the_folder_holds_the_tokenizer_and_generation_config(model, written):
    assert sorted(os.listdir(written)) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    saved = json.loads((written / "tokenizer.json").read_text())
    # The source folder's padding and truncation to 16 are not written back.
    assert saved["padding"] is None and saved["truncation"] is None
    config = json.loads((written / "tokenizer_config.json").read_text())
    assert {k: config[k] for k in ("bos_token", "eos_token", "pad_token")} == {
        "bos_token": folders.BOS, "eos_token": folders.EOS, "pad_token": folders.PAD}
    assert config["model_max_length"] == model.backbone.max_sequence_length
    assert (written / "chat_template.jinja").read_text() == folders.CHAT_TEMPLATE
    assert json.loads((written / "generation_config.json").read_text()) == {
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


def test_transformers_tokenizer_of_the_written_folder_equals_the_original(llama, written):
    original = transformers.AutoTokenizer.from_pretrained(str(llama))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(written))
    assert tokenizer(PROMPTS)["input_ids"] == original(PROMPTS)["input_ids"]
    assert tokenizer.model_max_length == 64
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        folders.BOS, folders.EOS, folders.PAD)
    for prompt in (True, False):
        assert tokenizer.apply_chat_template(CHAT, add_generation_prompt=prompt,
                                             tokenize=False) == original.apply_chat_template(
            CHAT, add_generation_prompt=prompt, tokenize=False)


def test_transformers_greedy_generate_on_the_written_folder_equals_keras_xf(model, written):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(written))
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(written)).eval()
    assert reference.generation_config.eos_token_id == 1
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        with torch.no_grad():
            out = reference.generate(torch.tensor([ids]), do_sample=False,
                                     max_new_tokens=NEW_TOKENS)[0].tolist()
        # The written generation config stops at the end token, as keras_xf's text does.
        assert model.generate([ids], max_length=len(ids) + NEW_TOKENS,
                              stop_token_ids=(1,)) == [out]


def test_the_pipeline_runs_on_the_written_folder(model, written):
    pipe = transformers.pipeline("text-generation", model=str(written),
                                 tokenizer=str(written))
    tokenizer = model.preprocessor.tokenizer
    for prompt in PROMPTS:
        result = pipe(prompt, do_sample=False, max_new_tokens=NEW_TOKENS)
        length = len(tokenizer(prompt)) + NEW_TOKENS
        assert result[0]["generated_text"] == model.generate(prompt, max_length=length)


def test_keras_xf_reloads_the_written_folder(model, written):
    reloaded = from_huggingface(written)
    tokenizer = reloaded.preprocessor.tokenizer
    assert tokenizer.special_tokens == model.preprocessor.tokenizer.special_tokens
    assert tokenizer.chat_template == folders.CHAT_TEMPLATE
    assert reloaded.generate(PROMPTS, max_length=20) == model.generate(PROMPTS, max_length=20)


def test_a_model_without_a_preprocessor_writes_no_tokenizer_files(tmp_path):
    path, _ = folders.write_llama_folder(tmp_path / "in", tokenizer=False)
    model = from_huggingface(path)
    to_huggingface(model, tmp_path / "out")
    # Its stop ids (config.json's end id) are its generation config; no tokenizer files.
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", "generation_config.json",
                                                   "model.safetensors"]
    assert json.loads((tmp_path / "out" / "generation_config.json").read_text()) == {
        "eos_token_id": 1}
    model.stop_token_ids = None
    assert generation_config(model) is None
    to_huggingface(model, tmp_path / "bare")
    assert sorted(os.listdir(tmp_path / "bare")) == ["config.json", "model.safetensors"]


def test_the_model_stop_ids_are_the_written_end_ids(model, tmp_path):
    assert model.stop_token_ids == (1,)  # the folder's eos_token_id
    model.stop_token_ids = [1, 4]
    try:
        assert generation_config(model)["eos_token_id"] == [1, 4]
        to_huggingface(model, tmp_path)
        reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
        assert reference.generation_config.eos_token_id == [1, 4]
    finally:
        model.stop_token_ids = [1]


def test_a_seq2seq_generation_config_names_its_decoder_start(llama):
    tokenizer = HuggingFaceTokenizer(llama)
    model = Seq2SeqLM(preprocessor=Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=8,
                                                         decoder_sequence_length=8),
                      start_token_id=0, pad_token_id=2, vocabulary_size=folders.VOCABULARY_SIZE,
                      num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=16,
                      max_sequence_length=8)
    assert generation_config(model) == {"bos_token_id": 0, "eos_token_id": 1,
                                        "pad_token_id": 2, "decoder_start_token_id": 0}


def test_write_tokenizer_files_refuses_another_tokenizer(tmp_path):
    with pytest.raises(ValueError, match="tokenizer must be a HuggingFaceTokenizer"):
        write_tokenizer_files("tokenizer.json", tmp_path)


def test_docstring_examples_run():
    import doctest

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(generation_config, "generation_config",
                            globs={"generation_config": generation_config}):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
