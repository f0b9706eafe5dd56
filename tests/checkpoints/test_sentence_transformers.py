"""sentence-transformers folders → keras_xf `TextEncoder`: a tiny random BERT with a WordPiece
tokenizer, wrapped in `SentenceTransformer` modules (pooling, an optional Dense and Normalize)
and saved with `SentenceTransformer.save`, loaded by `from_huggingface` on the current backend
and compared with `SentenceTransformer(folder).encode`."""

import json

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
st = pytest.importorskip("sentence_transformers")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import sentence_transformers_settings  # noqa: E402
from keras_xf.checkpoints.sentence_transformers import pooling_mode  # noqa: E402
from keras_xf.models import TextEncoder  # noqa: E402
from tests.checkpoints.sentence_folders import MAX_LENGTH  # noqa: E402
from tests.checkpoints.sentence_folders import WIDTH  # noqa: E402
from tests.checkpoints.sentence_folders import WORDS  # noqa: E402
from tests.checkpoints.sentence_folders import wordpiece_tokenizer as _tokenizer  # noqa: E402
from tests.checkpoints.sentence_folders import write_sentence_folder as _save  # noqa: E402
from tests.checkpoints.sentence_folders import write_transformer_folder as _transformer_folder  # noqa: E402,E501

TEXTS = ["The cat sat on the mat", "A dog", "quick brown fox jumped over the lazy dogs",
         "Red and blue"]
# Each case: pooling mode, Dense module arguments (or None), Normalize.
CASES = {
    "mean": ("mean", None, False),
    "cls_normalized": ("cls", None, True),
    "max_dense_normalized": ("max", dict(out_features=8), True),
    "mean_dense_linear_unbiased": ("mean", dict(out_features=12, bias=False,
                                                activation_function=None), False),
}


@pytest.fixture(scope="module")
def transformer_folder(tmp_path_factory):
    return _transformer_folder(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, transformer_folder, tmp_path_factory):
    """`(name, folder, sentence-transformers embeddings of TEXTS, keras_xf model)`."""
    pooling, dense, normalize = CASES[request.param]
    folder = _save(transformer_folder, tmp_path_factory.mktemp(request.param), pooling,
                   dense, normalize)
    reference = st.SentenceTransformer(str(folder), device="cpu")
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    return request.param, folder, expected, from_huggingface(folder)


def _inputs(model, length=None, filler=None):
    """TEXTS tokenized by the folder's tokenizer, right-padded to the longest text (or to
    `length`, the padded positions holding the id `filler` instead of the padding id)."""
    tokenizer = _tokenizer()
    encodings = tokenizer.encode_batch(TEXTS)
    length = length or max(len(e.ids) for e in encodings)
    ids = np.zeros((len(TEXTS), length), "int32")
    mask = np.zeros((len(TEXTS), length), "int32")
    if filler is not None:
        ids[:] = filler
    for row, encoding in enumerate(encodings):
        ids[row, :len(encoding.ids)] = encoding.ids
        mask[row, :len(encoding.ids)] = 1
    inputs = {"token_ids": ids, "padding_mask": mask}
    if "segment_ids" in model.input:
        inputs["segment_ids"] = np.zeros_like(ids)
    return inputs


def test_embeddings_equal_sentence_transformers(case):
    name, folder, expected, model = case
    assert isinstance(model, TextEncoder)
    actual = model.predict(_inputs(model), verbose=0)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=0)
    if CASES[name][2]:
        np.testing.assert_allclose(np.linalg.norm(actual, axis=-1), 1.0, atol=1e-6)


def test_text_embeddings_equal_sentence_transformers(case):
    """The folder's tokenizer comes with the model: `encode` on text is `encode` on text."""
    name, folder, expected, model = case
    assert model.preprocessor is not None
    np.testing.assert_allclose(model.encode(TEXTS, batch_size=2), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.encode(TEXTS[0]), expected[0], atol=1e-5, rtol=0)


def test_long_text_is_cut_at_max_seq_length_as_sentence_transformers_cuts_it(case):
    name, folder, expected, model = case
    long_text = " ".join(["the quick brown fox jumped over the lazy dog"] * 4)  # > 24 tokens
    assert len(_tokenizer().encode(long_text).ids) > MAX_LENGTH
    reference = st.SentenceTransformer(str(folder), device="cpu").encode([long_text])
    assert model.preprocessor.sequence_length == MAX_LENGTH
    np.testing.assert_allclose(model.encode([long_text]), reference, atol=1e-5, rtol=0)


def test_padded_positions_do_not_change_the_embedding(case):
    name, folder, expected, model = case
    # Four more positions holding a real token's id, masked out.
    padded = model.predict_on_batch(_inputs(model, length=16, filler=WORDS.index("cat")))
    np.testing.assert_allclose(padded, expected, atol=1e-5, rtol=0)


def test_roberta_transformer(tmp_path):
    transformer = _transformer_folder(tmp_path / "roberta", "roberta")
    folder = _save(transformer, tmp_path / "folder", "mean", normalize=True)
    expected = st.SentenceTransformer(str(folder), device="cpu").encode(
        TEXTS, convert_to_numpy=True)
    model = from_huggingface(folder)
    assert "segment_ids" not in model.input
    np.testing.assert_allclose(model.predict_on_batch(_inputs(model)), expected, atol=1e-5,
                               rtol=0)


def test_lowercasing_and_prompts_as_sentence_transformers_applies_them(tmp_path):
    """A case-sensitive tokenizer under a Transformer module with `do_lower_case`, and
    prompts with a default: `encode` equals sentence-transformers' with the default prompt,
    a named one, an explicit one, and none (an empty `prompt`)."""
    transformer = _transformer_folder(tmp_path / "cased", lowercase=False)
    prompts = {"query": "the quick ", "document": "a big "}
    folder = _save(transformer, tmp_path / "folder", "mean", do_lower_case=True,
                   prompts=prompts, default_prompt_name="query")
    reference = st.SentenceTransformer(str(folder), device="cpu")
    model = from_huggingface(folder)
    assert model.prompts == prompts and model.default_prompt_name == "query"
    texts = ["The Cat SAT on the Mat", "Red And Blue"]
    for arguments in ({}, {"prompt_name": "document"}, {"prompt": "Small "}, {"prompt": ""}):
        np.testing.assert_allclose(model.encode(texts, **arguments),
                                   reference.encode(texts, **arguments), atol=1e-5, rtol=0)
    # Without the lowercasing the cased tokenizer reads "The" as [UNK]: the texts differ.
    cased = from_huggingface(transformer)
    assert cased.preprocessor.tokenizer.tokenize("The")[1] == WORDS.index("[UNK]")
    assert model.preprocessor.tokenizer.tokenize("The")[1] == WORDS.index("the")
    # A .keras round trip keeps the prompts and the lowercasing.
    model.save(tmp_path / "encoder.keras")
    loaded = keras.saving.load_model(tmp_path / "encoder.keras")
    np.testing.assert_allclose(loaded.encode(texts), reference.encode(texts), atol=1e-5,
                               rtol=0)
    with pytest.raises(ValueError, match="prompt_name"):
        model.encode(texts, prompt_name="passage")
    with pytest.raises(ValueError, match="not both"):
        model.encode(texts, prompt="a ", prompt_name="query")


def test_prompt_arguments_are_checked():
    sizes = dict(vocabulary_size=len(WORDS), num_layers=1, hidden_dim=8, num_heads=2,
                 intermediate_dim=16)
    with pytest.raises(ValueError, match="default_prompt_name"):
        TextEncoder(**sizes, prompts={"query": "q: "}, default_prompt_name="document")
    with pytest.raises(ValueError, match="prompts"):
        TextEncoder(**sizes, prompts={"query": 3})


def test_pooling_without_the_prompt_is_refused(mean_folder, tmp_path):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder)
    config_path = folder / "1_Pooling" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "include_prompt": False}))
    with pytest.raises(ValueError, match="include_prompt=False"):
        from_huggingface(folder)


def test_settings_are_the_tokenizers(case):
    name, folder, expected, model = case
    settings = sentence_transformers_settings(folder)
    assert {k: settings[k] for k in ("max_seq_length", "do_lower_case", "include_prompt",
                                     "default_prompt_name")} == {
        "max_seq_length": MAX_LENGTH, "do_lower_case": False, "include_prompt": True,
        "default_prompt_name": None}
    # sentence-transformers writes its prompts (empty ones for "query" and "document").
    assert all(text == "" for text in settings["prompts"].values())


@pytest.fixture(scope="module")
def mean_folder(transformer_folder, tmp_path_factory):
    return _save(transformer_folder, tmp_path_factory.mktemp("plain"), "mean")


@pytest.mark.parametrize("mode", ["weightedmean", "lasttoken", "mean_sqrt_len_tokens",
                                  ["cls", "mean"]])
def test_unsupported_pooling_is_named(mean_folder, tmp_path, mode):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder)
    config_path = folder / "1_Pooling" / "config.json"
    config = json.loads(config_path.read_text())
    config["pooling_mode"] = mode
    config_path.write_text(json.dumps(config))
    named = "'cls', 'mean'" if isinstance(mode, list) else repr(mode)
    with pytest.raises(ValueError, match=named):
        from_huggingface(folder)


def test_legacy_pooling_keys():
    legacy = {key: False for key in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                     "pooling_mode_max_tokens")}
    assert pooling_mode(legacy) == "mean"  # none set: mean, as sentence-transformers reads it
    assert pooling_mode({**legacy, "pooling_mode_cls_token": True}) == "cls"
    assert pooling_mode({**legacy, "pooling_mode_max_tokens": True}) == "max"
    with pytest.raises(ValueError, match="weightedmean"):
        pooling_mode({**legacy, "pooling_mode_weightedmean_tokens": True})
    with pytest.raises(ValueError, match=r"\['cls', 'mean'\]"):
        pooling_mode({**legacy, "pooling_mode_cls_token": True,
                      "pooling_mode_mean_tokens": True})


def test_unknown_module_is_named(mean_folder, tmp_path):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LayerNorm",
                    "type": "sentence_transformers.models.LayerNorm"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="LayerNorm"):
        from_huggingface(folder)


def test_older_layout_loads(mean_folder, tmp_path):
    """The layout of older sentence-transformers releases: the transformer in `0_Transformer`,
    `sentence_transformers.models.*` module types, and boolean pooling flags (here `[CLS]`)."""
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder / "0_Transformer")
    shutil.move(folder / "0_Transformer" / "1_Pooling", folder / "1_Pooling")
    shutil.move(folder / "0_Transformer" / "modules.json", folder / "modules.json")
    (folder / "0_Transformer" / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 20, "do_lower_case": False}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer",
         "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": WIDTH, "pooling_mode_cls_token": True,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    expected = st.SentenceTransformer(str(folder), device="cpu").encode(
        TEXTS, convert_to_numpy=True)
    model = from_huggingface(folder)
    assert model.pooling.mode == "cls"
    np.testing.assert_allclose(model.predict_on_batch(_inputs(model)), expected, atol=1e-5,
                               rtol=0)
    assert sentence_transformers_settings(folder)["max_seq_length"] == 20


def test_legacy_transformer_config_settings(mean_folder, tmp_path):
    """An older folder's `sentence_bert_config.json` with `max_seq_length` and
    `do_lower_case`, and pooling that leaves the prompt out."""
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 10, "do_lower_case": True}))
    config_path = folder / "1_Pooling" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "include_prompt": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: "}, "default_prompt_name": "query"}))
    assert sentence_transformers_settings(folder) == {
        "max_seq_length": 10, "do_lower_case": True, "include_prompt": False,
        "prompts": {"query": "query: "}, "default_prompt_name": "query"}


@pytest.mark.parametrize("change, named", [
    ({"use_residual": True}, "use_residual"),
    ({"activation_function": "torch.nn.modules.activation.Softplus"}, "Softplus"),
    ({"module_input_name": "token_embeddings"}, "token_embeddings"),
    (None, "model.safetensors"),
])
def test_inexpressible_dense_is_named(mean_folder, tmp_path, change, named):
    import shutil

    from safetensors.numpy import save_file

    folder = tmp_path / "folder"
    shutil.copytree(mean_folder, folder)
    dense = folder / "2_Dense"
    dense.mkdir()
    config = {"in_features": WIDTH, "out_features": 4, "bias": True,
              "activation_function": "torch.nn.modules.activation.Tanh"}
    (dense / "config.json").write_text(json.dumps({**config, **(change or {})}))
    if change is not None:
        save_file({"linear.weight": np.ones((4, WIDTH), "float32"),
                   "linear.bias": np.ones(4, "float32")}, str(dense / "model.safetensors"))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.base.modules.dense.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=named):
        from_huggingface(folder)
