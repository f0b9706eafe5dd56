"""The quick start in README.md runs as written on the current backend."""

import os

import numpy as np

from tests.markdown import compiled
from tests.markdown import python_blocks

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def quick_start_source():
    """`(line, source)` of the first ```python block of README.md."""
    blocks = python_blocks(README)
    assert blocks, "README.md has no ```python block"
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
