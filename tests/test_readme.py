"""README.md's snippets run as written on the current backend; the folder snippet's paths
name tiny folders that the test writes the way `transformers` and `sentence-transformers`
write real ones."""

import os

import numpy as np
import pytest

from tests.markdown import compiled
from tests.markdown import python_blocks

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def quick_start_source():
    """`(line, source)` of the ```python block of README.md's "Quick start"."""
    blocks = python_blocks(README, section="Quick start")
    assert blocks, "README.md has no Quick start snippet"
    return blocks[0]


def test_quick_start_is_short():
    lines = [line for line in quick_start_source()[1].splitlines() if line.strip()]
    assert len(lines) <= 15, f"the quick start has {len(lines)} lines"


def test_quick_start_runs(capsys):
    namespace = {"__name__": "readme_quick_start"}
    exec(compiled(README, *quick_start_source()), namespace)
    assert "(2, 16, 100)" in capsys.readouterr().out
    model = namespace["model"]
    logits = model.predict(namespace["tokens"][:2, :-1], verbose=0)
    assert np.all(np.isfinite(logits))


def test_vision_snippet_runs():
    """The ```python block of the "Vision" section: a five-line ViT."""
    blocks = python_blocks(README, section="Vision")
    assert blocks, "README.md has no Vision snippet"
    line, source = blocks[0]
    lines = [text for text in source.splitlines() if text.strip()]
    assert len(lines) <= 6, f"the ViT snippet has {len(lines)} lines"
    namespace = {"__name__": "readme_vision"}
    exec(compiled(README, line, source), namespace)
    assert namespace["vit"].count_params() > 0


FOLDER_SECTION = "Load a folder, chat with it, embed sentences"


def test_the_first_snippet_loads_a_folder():
    assert python_blocks(README)[0] == python_blocks(README, section=FOLDER_SECTION)[0]


def test_folder_snippet_runs(tmp_path, capsys):
    pytest.importorskip("sentence_transformers")
    from tests.checkpoints.sentence_folders import write_sentence_folder
    from tests.checkpoints.sentence_folders import write_transformer_folder
    from tests.preprocessing.folders import write_llama_folder

    chat_model, _ = write_llama_folder(tmp_path / "chat-model")
    bert = write_transformer_folder(tmp_path / "bert")
    sentence_model = write_sentence_folder(bert, tmp_path / "sentence-model", "mean",
                                           normalize=True)
    line, source = python_blocks(README, section=FOLDER_SECTION)[0]
    for name, path in (("path/to/chat-model", chat_model), ("path/to/out", tmp_path / "out"),
                       ("path/to/sentence-model", sentence_model)):
        assert f'"{name}"' in source
        source = source.replace(f'"{name}"', repr(str(path)))
    namespace = {"__name__": "readme_folder"}
    exec(compiled(README, line, source), namespace)
    printed = capsys.readouterr().out
    assert isinstance(namespace["lm"].generate(namespace["chat"], max_new_tokens=2), str)
    assert (tmp_path / "out" / "tokenizer.json").exists()
    similarities = namespace["embeddings"] @ namespace["embeddings"].T
    np.testing.assert_allclose(np.diag(similarities), 1.0, atol=1e-5)
    assert "Who is there?" in printed
