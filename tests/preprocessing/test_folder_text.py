"""A task loaded from a Hugging Face folder with a tokenizer carries a preprocessor: text in,
text out, equal to `transformers`' greedy generation, and a rendered chat goes to
`generate` as it is."""

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

PROMPTS = ["To be, or", "The slings and arrows of"]
LENGTH = 20


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return folders.write_llama_folder(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def model(llama):
    return from_huggingface(llama[0])


def reference_ids(llama, prompt_ids):
    """transformers' greedy continuation of `prompt_ids` to `LENGTH` tokens."""
    with torch.no_grad():
        out = llama[1].generate(torch.tensor([prompt_ids]), max_length=LENGTH, do_sample=False,
                                eos_token_id=None, pad_token_id=2)
    return out[0].tolist()


def test_the_folder_tokenizer_becomes_the_preprocessor(model, llama):
    preprocessor = model.preprocessor
    assert isinstance(preprocessor, CausalLMPreprocessor)
    assert preprocessor.sequence_length == 64  # the model's max_position_embeddings
    assert preprocessor.add_start_token  # the folder's post-processor adds <s>
    assert preprocessor.tokenizer.chat_template == folders.CHAT_TEMPLATE
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llama[0]))
    assert preprocessor.generate_preprocess(PROMPTS) == tokenizer(PROMPTS)["input_ids"]


def test_generated_text_equals_transformers(model, llama):
    texts = model.generate(PROMPTS, max_length=LENGTH, stop_token_ids=None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llama[0]))
    prompts = tokenizer(PROMPTS)["input_ids"]
    expected = [reference_ids(llama, prompt) for prompt in prompts]
    assert model.generate(prompts, max_length=LENGTH, stop_token_ids=None) == expected
    assert texts == model.preprocessor.generate_postprocess(expected, prompts)
    for prompt, ids, text in zip(prompts, expected, texts):
        cut = ids[: len(prompt) + ids[len(prompt):].index(1)] if 1 in ids[len(prompt):] else ids
        assert text == tokenizer.decode(cut, skip_special_tokens=True)
    assert model.generate(PROMPTS[0], max_length=LENGTH) == texts[0]


def test_a_rendered_chat_goes_to_generate(model, llama):
    tokenizer = model.preprocessor.tokenizer
    chat = [{"role": "user", "content": "To be?"}]
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    reference = transformers.AutoTokenizer.from_pretrained(str(llama[0]))
    assert rendered == reference.apply_chat_template(chat, add_generation_prompt=True,
                                                     tokenize=False)
    # The template writes <s>: the prompt holds it once, as transformers tokenizes a chat.
    prompt_ids = model.preprocessor.generate_preprocess(rendered)[0]
    assert prompt_ids == list(reference.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False))
    length = len(prompt_ids) + 6
    answer = model.generate(rendered, max_length=length)
    ids = model.generate([prompt_ids], max_length=length)
    assert answer == model.preprocessor.generate_postprocess(ids, [prompt_ids])[0]
    # The prompt comes back without its special tokens, then the continuation.
    assert answer.startswith("\nsystem\nYou are a player.") and "To be?" in answer


def test_fit_on_strings_then_saved_and_reloaded(model, tmp_path):
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    history = model.fit(folders.SHAKESPEARE[:2], epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    path = str(tmp_path / "llama.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.preprocessor.tokenizer.chat_template == folders.CHAT_TEMPLATE
    assert loaded.generate(PROMPTS[0], max_length=LENGTH) == model.generate(
        PROMPTS[0], max_length=LENGTH)


def test_a_folder_without_a_tokenizer_gives_no_preprocessor(tmp_path):
    path, _ = folders.write_llama_folder(tmp_path, tokenizer=False)
    assert from_huggingface(path).preprocessor is None
