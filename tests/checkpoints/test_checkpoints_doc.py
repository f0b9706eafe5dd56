"""`docs/checkpoints.md`'s snippets run as written on the current backend, their paths naming
tiny folders that the test writes the way `transformers` and `sentence-transformers` write
real ones."""

import pathlib

import numpy as np
import pytest

from tests.markdown import compiled
from tests.markdown import python_blocks

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
# The sections after the first snippet, one snippet each.
SECTIONS = ["LoRA", "PEFT adapters", "Sentence embeddings (sentence-transformers folders)",
            "GGUF files (llama.cpp)"]
IDS = {"token_ids": np.array([[3, 4, 5, 6]], "int32"), "padding_mask": np.ones((1, 4), "int32")}


def run_block(source, line, folders):
    for name, path in folders.items():
        assert f'"{name}"' in source, name
        source = source.replace(f'"{name}"', repr(str(path)))
    namespace = {"__name__": "checkpoints_doc"}
    exec(compiled(str(PAGE), line, source), namespace)
    return namespace


def test_page_has_the_five_snippets():
    assert len(python_blocks(str(PAGE))) == 5
    assert [len(python_blocks(str(PAGE), section)) for section in SECTIONS] == [1] * 4


def section_block(section):
    """`(line, source)` of the one snippet under the page's `## <section>` heading."""
    (block,) = python_blocks(str(PAGE), section)
    return block


def test_load_generate_fit_and_write_back(tmp_path, capsys):
    from tests.preprocessing.folders import write_llama_folder

    llama, _ = write_llama_folder(tmp_path / "llama")
    line, source = python_blocks(str(PAGE))[0]
    namespace = run_block(source, line, {"path/to/llama": llama, "path/to/out": tmp_path / "out"})
    assert "To be, or" in capsys.readouterr().out
    assert namespace["model"].preprocessor is not None
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (tmp_path / "out" / name).exists(), name


def test_sentence_embeddings(tmp_path):
    pytest.importorskip("sentence_transformers")
    from tests.checkpoints.sentence_folders import write_sentence_folder
    from tests.checkpoints.sentence_folders import write_transformer_folder

    folder = write_sentence_folder(write_transformer_folder(tmp_path / "bert"),
                                   tmp_path / "sentences", "mean", normalize=True)
    line, source = section_block("Sentence embeddings (sentence-transformers folders)")
    namespace = run_block(source, line, {"path/to/all-MiniLM-L6-v2": folder})
    assert namespace["embeddings"].shape == (2, 16)
    np.testing.assert_allclose(np.linalg.norm(namespace["embeddings"], axis=-1), 1.0, atol=1e-5)
    assert namespace["settings"]["max_seq_length"] == 24


def test_gguf_file(tmp_path, capsys):
    gguf = pytest.importorskip("gguf")
    from tests.checkpoints.gguf_files import tiny_model
    from tests.checkpoints.gguf_files import write_gguf

    path = write_gguf(tiny_model("llama"), tmp_path / "model-Q8_0.gguf",
                      types=lambda name, array: gguf.GGMLQuantizationType.Q8_0)
    line, source = section_block("GGUF files (llama.cpp)")
    namespace = run_block(source, line, {"path/to/model-Q8_0.gguf": path})
    printed = capsys.readouterr().out
    assert "To be, or" in printed and "'bos_token': '<s>'" in printed
    assert namespace["model"].preprocessor is not None


def test_lora(tmp_path):
    from tests.preprocessing.folders import write_llama_folder

    llama, _ = write_llama_folder(tmp_path / "llama")
    line, source = section_block("LoRA")
    names = ["path/to/adapters.lora.h5", "path/to/lora.keras", "path/to/merged"]
    namespace = run_block(source, line, {"path/to/llama": llama, **{
        name: tmp_path / name.split("/")[-1] for name in names}})
    model = namespace["model"]
    expected = np.asarray(model.predict(IDS, verbose=0))
    for other in (namespace["again"], namespace["reloaded"]):
        np.testing.assert_allclose(np.asarray(other.predict(IDS, verbose=0)), expected,
                                   atol=1e-5)
    assert (tmp_path / "merged" / "model.safetensors").exists()


def test_peft(tmp_path):
    pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from tests.preprocessing.folders import write_llama_folder

    llama, _ = write_llama_folder(tmp_path / "llama")
    line, source = section_block("PEFT adapters")
    namespace = run_block(source, line, {"path/to/llama": llama,
                                          "path/to/peft": tmp_path / "peft"})
    expected = np.asarray(namespace["model"].predict(IDS, verbose=0))
    np.testing.assert_allclose(np.asarray(namespace["again"].predict(IDS, verbose=0)),
                               expected, atol=1e-5)
    with torch.no_grad():
        adapted = namespace["adapted"](input_ids=torch.tensor(IDS["token_ids"]).long())
    np.testing.assert_allclose(adapted.logits.float().numpy(), expected, atol=1e-4)
    assert (tmp_path / "peft" / "adapter_model.safetensors").exists()
