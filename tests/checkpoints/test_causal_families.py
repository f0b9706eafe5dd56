"""Hugging Face causal-LM checkpoints (GPT-2, Llama) ↔ keras_xf `CausalLM`: tiny random
`transformers` models, every parameter perturbed, saved with `save_pretrained`, loaded by
`from_huggingface` on the current backend, and written back by `to_huggingface`."""

import json
import os
import shutil

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import CONFIGS  # noqa: E402
from tests.checkpoints.hf_checks import VOCAB  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import causal_reference  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402
from tests.checkpoints.hf_checks import rewrite  # noqa: E402



reference_model = causal_reference


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """`(name, folder, reference model)`."""
    folder = tmp_path_factory.mktemp(request.param)
    model = reference_model(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


def test_logits_equal_transformers(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    assert isinstance(model, CausalLM)
    ids, mask = batch()
    assert_logits_equal(keras_logits(model, ids, mask), reference_logits(reference, ids, mask),
                        mask)


def test_greedy_generation_equals_transformers(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    ids = batch(1)[0][:, :4]
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor(ids, dtype=torch.long), attention_mask=torch.ones(ids.shape, dtype=torch.long),
            max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0,
        ).numpy()
    generated = model.generate({"token_ids": np.pad(ids, [(0, 0), (0, 6)]),
                                "padding_mask": np.pad(np.ones_like(ids), [(0, 0), (0, 6)])},
                               stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(generated["token_ids"]), expected)


def test_written_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    written = to_huggingface(model, tmp_path)
    assert written == json.loads((folder / "config.json").read_text())["architectures"][0]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = batch(2)
    assert_logits_equal(reference_logits(reloaded, ids, mask),
                        reference_logits(reference, ids, mask), mask, atol=1e-5)
    # And back into keras_xf: the same outputs.
    again = from_huggingface(tmp_path)
    np.testing.assert_array_equal(keras_logits(again, ids, mask), keras_logits(model, ids, mask))


def test_bfloat16_and_sharded_checkpoints(tmp_path):
    reference = reference_model("llama", seed=1).to(torch.bfloat16)
    reference.save_pretrained(tmp_path, max_shard_size="8KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    model = from_huggingface(tmp_path)
    expected = reference_model("llama", seed=1).to(torch.bfloat16).float()
    ids, mask = batch(3)
    assert_logits_equal(keras_logits(model, ids, mask), reference_logits(expected, ids, mask),
                        mask)
    half = from_huggingface(tmp_path, dtype="bfloat16")
    assert half.dtype_policy.name == "bfloat16"
    assert keras.backend.standardize_dtype(half.weights[0].dtype) == "bfloat16"


@pytest.fixture
def gpt2_folder(tmp_path):
    folder = tmp_path / "gpt2"
    reference_model("gpt2").save_pretrained(folder)
    return folder


def test_missing_unused_and_misshapen_tensors_are_named(gpt2_folder, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(gpt2_folder, broken)
    rewrite(broken, lambda t: t.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel .* lacks tensor "
                                         r"'transformer\.h\.1\.mlp\.c_fc\.bias'"):
        from_huggingface(broken)
    shutil.rmtree(broken)
    shutil.copytree(gpt2_folder, broken)
    rewrite(broken, lambda t: t.update(extra=np.zeros(3, "float32")))
    with pytest.raises(ValueError, match=r"tensors that no variable takes: \['extra'\]"):
        from_huggingface(broken)
    shutil.rmtree(broken)
    shutil.copytree(gpt2_folder, broken)
    rewrite(broken, lambda t: t.update(
        {"transformer.ln_f.weight": np.ones(17, "float32")}))
    with pytest.raises(ValueError, match=r"transformer\.ln_f\.weight.*\(17,\).*output_norm"):
        from_huggingface(broken)


def test_variables_take_their_first_value_from_the_checkpoint(gpt2_folder, tmp_path):
    # The model is built without values and filled tensor by tensor; a load that fails
    # midway leaves no half-initialised variables for Keras to trip over later.
    broken = tmp_path / "broken"
    shutil.copytree(gpt2_folder, broken)
    rewrite(broken, lambda t: t.pop("transformer.ln_f.bias"))
    with pytest.raises(ValueError, match="lacks tensor"):
        from_huggingface(broken)
    with keras.StatelessScope():
        keras.Variable(initializer="zeros", shape=(2,))
    model = from_huggingface(gpt2_folder)
    reference = reference_model("gpt2")
    expected = reference.transformer.wte.weight.detach().numpy()
    embedding = model.backbone.token_embedding.embeddings
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(embedding), expected)
    # Each variable owns writable memory: training updates it in place on every backend.
    embedding.assign(embedding + 1.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(embedding), expected + 1.0)
    if keras.config.backend() == "torch":  # torch.onnx and torch.export see every weight
        parameters = {id(p) for p in model.parameters()}
        assert all(id(v.value) in parameters for v in model.weights)


def test_other_architectures_and_folders_are_refused(gpt2_folder, tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        from_huggingface(tmp_path / "nowhere")
    other = tmp_path / "other"
    shutil.copytree(gpt2_folder, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"\['NoSuchModelForCausalLM'\].*Loadable architectures"):
        from_huggingface(other)
    os.remove(other / "model.safetensors")
    config["architectures"] = ["GPT2LMHeadModel"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="safetensors"):
        from_huggingface(other)


def test_models_no_family_expresses_are_refused(tmp_path):
    model = CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, num_heads=2,
                     intermediate_dim=16, position="sinusoidal")
    with pytest.raises(ValueError, match="No checkpoint family expresses this CausalLM"):
        to_huggingface(model, tmp_path)
    with pytest.raises(ValueError, match="family must be one of"):
        to_huggingface(model, tmp_path, family="no_such_family")
