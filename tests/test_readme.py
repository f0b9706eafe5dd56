"""The quick start in README.md runs as written on the current backend."""

import os
import re

import numpy as np

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def quick_start_source():
    """The first ```python block of README.md."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert match, "README.md has no ```python block"
    return match.group(1)


def test_quick_start_is_short():
    lines = [line for line in quick_start_source().splitlines() if line.strip()]
    assert len(lines) <= 15, f"the quick start has {len(lines)} lines"


def test_quick_start_runs(capsys):
    namespace = {"__name__": "readme_quick_start"}
    exec(compile(quick_start_source(), README, "exec"), namespace)
    assert "(2, 16, 100)" in capsys.readouterr().out
    model = namespace["model"]
    logits = model.predict(namespace["tokens"][:2, :-1], verbose=0)
    assert np.all(np.isfinite(logits))


def test_vision_snippet_runs():
    """The ```python block of the "Vision" section: a five-line ViT."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"^## Vision\n.*?^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert match, "README.md has no Vision snippet"
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    assert len(lines) <= 6, f"the ViT snippet has {len(lines)} lines"
    namespace = {"__name__": "readme_vision"}
    exec(compile(match.group(1), README, "exec"), namespace)
    assert namespace["vit"].count_params() > 0
