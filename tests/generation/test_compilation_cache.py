"""enable_compilation_cache: a second process compiles nothing new and gives the same tokens;
TensorFlow refuses a cache named after its first compilation; arguments are checked.

Each run is a fresh process, as the cache is a setting of the whole process."""

import json
import os
import subprocess
import sys

import keras
import pytest

from keras_xf.generation import enable_compilation_cache

_SCRIPT = """
import json, pathlib, sys
import keras
import keras_xf

folder = pathlib.Path(sys.argv[1])
enabled = keras_xf.generation.enable_compilation_cache(folder, min_compile_seconds=0)
before = set(folder.iterdir())
keras.utils.set_random_seed(0)
model = keras_xf.models.CausalLM(vocabulary_size=32, num_layers=1, hidden_dim=8, num_heads=2,
                                 intermediate_dim=16, max_sequence_length=16)
tokens = model.generate([[1, 2, 3], [4, 5]], max_length=8)
result = dict(enabled=enabled, tokens=tokens, written=len(set(folder.iterdir()) - before))
if keras.config.backend() == "tensorflow":
    try:
        keras_xf.generation.enable_compilation_cache(folder / "later")
    except ValueError as error:
        result["later"] = str(error)
print(json.dumps(result))
"""


def _run(folder):
    environment = dict(os.environ, KERAS_BACKEND=keras.config.backend())
    environment.pop("TF_XLA_FLAGS", None)
    completed = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder)], env=environment,
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_its_programs_back(tmp_path):
    first = _run(tmp_path)
    if keras.config.backend() == "torch":
        # TorchScript traces live in memory: nothing on disk to reuse.
        assert first["enabled"] is False and first["written"] == 0
        return
    second = _run(tmp_path)
    assert second["tokens"] == first["tokens"]
    assert first["enabled"] is True and second["enabled"] is True
    assert first["written"] > 0  # the decoding loop's program, at least
    assert second["written"] == 0  # every program read back
    if keras.config.backend() == "tensorflow":
        assert "before the first compiled function" in second["later"]


@pytest.mark.parametrize("arguments, message", [
    ((None,), "directory must be a path"),
    (("cache", -1.0), "min_compile_seconds must be a number >= 0"),
    (("cache", True), "min_compile_seconds must be a number >= 0"),
])
def test_bad_arguments_raise(arguments, message):
    with pytest.raises(ValueError, match=message):
        enable_compilation_cache(*arguments)
