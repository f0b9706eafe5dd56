"""A checkpoint's end ids become the model's default stop ids: `generation_config.json`'s
`eos_token_id` (an int or a list), else `config.json`'s; `generate` then stops where
`transformers`' own `generate` stops with the folder's generation config, and the ids survive
a `.keras` round trip. One tiny GPT-2 (`hf_checks.CONFIGS["gpt2"]`, end id 2)."""

import json

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import causal_reference  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    reference = causal_reference("gpt2")
    reference.save_pretrained(folder)
    return folder, reference


def set_generation_config(folder, **values):
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config.update(values)
    path.write_text(json.dumps(config))


def test_end_ids_from_config_json(checkpoint, tmp_path):
    folder, _ = checkpoint
    (folder / "generation_config.json").unlink(missing_ok=True)
    model = from_huggingface(folder)
    assert model.stop_token_ids == (2,)
    model.save(tmp_path / "lm.keras")
    assert keras.saving.load_model(tmp_path / "lm.keras").stop_token_ids == (2,)


def test_generation_config_end_ids_stop_generate_as_in_transformers(checkpoint):
    folder, reference = checkpoint
    prompt = np.array([[5, 9, 14, 3]], "int32")
    with torch.no_grad():
        free = reference.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=6,
                                  do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    end = int(free[0, 6])  # a token that greedy search generates
    set_generation_config(folder, eos_token_id=[end, 60], pad_token_id=0)
    model = from_huggingface(folder)
    assert model.stop_token_ids == (end, 60)
    reference.generation_config = transformers.GenerationConfig.from_pretrained(folder)
    with torch.no_grad():
        expected = reference.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=6,
                                      do_sample=False).numpy()
    assert model.generate(prompt.tolist(), max_new_tokens=6) == [expected[0].tolist()]
    assert expected.shape[1] < free.shape[1]  # transformers stopped too
    assert model.generate(prompt.tolist(), max_new_tokens=6, stop_token_ids=None) == (
        free.tolist())
