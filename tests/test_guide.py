"""Every ```python block of docs/guide.md runs, in order, in one namespace, on JAX and on
PyTorch; files go to a temporary folder.

Not on TensorFlow, for the reason `tests/test_examples.py` gives for the examples: the guide
fits several models, and TensorFlow traces a graph for each (the longest test of its leg),
while every layer and model the guide calls has its unit tests on TensorFlow too."""

import os
import tempfile

import keras
import numpy as np
import pytest

from tests.markdown import compiled
from tests.markdown import python_blocks

pytestmark = pytest.mark.skipif(
    keras.config.backend() == "tensorflow",
    reason="the guide runs on JAX and PyTorch; TensorFlow traces a graph for each model it "
    "fits, and its unit tests cover every call the guide makes")

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                     "guide.md")


def test_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    # The guide's `tempfile.mkdtemp()` then makes its working folder inside `tmp_path`.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    blocks = python_blocks(GUIDE)
    assert len(blocks) >= 10, "docs/guide.md lost its code blocks"
    namespace = {"__name__": "guide"}
    for line, source in blocks:
        exec(compiled(GUIDE, line, source), namespace)
    assert namespace["workdir"].startswith(str(tmp_path))
    assert np.isfinite(namespace["history"].history["loss"][-1])
    assert namespace["greedy"].shape == (24,)
    assert namespace["classifier"].predict(namespace["passages"], verbose=0).shape == (
        len(namespace["labels"]), 3)
    assert os.path.exists(namespace["exported"])
    layers = np.asarray(namespace["exit_layers"])
    generated = layers[len(namespace["prompt"]):]  # prompt positions read 0
    assert generated.min() >= 1 and generated.max() <= 2
    assert (namespace["lm"].count_params() > namespace["small"].count_params()
            > namespace["shallow"].count_params())
    assert "Traceback" not in capsys.readouterr().err
