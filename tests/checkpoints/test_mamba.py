"""Mamba checkpoints ↔ keras_xf `CausalLM` of `MambaMixer` blocks without a feedforward: tiny
random `transformers` models, every parameter perturbed, saved with `save_pretrained`,
loaded by `from_huggingface` on the current backend, and written back by `to_huggingface`.

The configs `mamba` (tied, a convolution bias, step rank "auto") and `mamba_biased_untied`
are in `hf_checks.CONFIGS`, so `test_causal_families.py` compares their logits on a
right-padded batch, their greedy generation and their written-back checkpoints as for every
causal family; this file checks what is Mamba's own. `transformers`' Mamba takes the
attention mask (it zeroes padded positions before `in_proj` and after the convolution), so
with right padding the real positions are exact; at padded positions the two libraries
differ where `in_proj` has a bias (keras_xf zeroes the whole padded output)."""

import json
import shutil

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MambaMixer  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import VOCAB  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import causal_reference  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import rewrite  # noqa: E402

NAME = "mamba_biased_untied"  # a config of `hf_checks.CONFIGS`


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """`(folder, reference model)`."""
    folder = tmp_path_factory.mktemp(NAME)
    model = causal_reference(NAME)
    model.save_pretrained(folder)
    return folder, model


def test_layers_are_the_general_options(checkpoint):
    folder, reference = checkpoint
    model = from_huggingface(folder)
    backbone = model.backbone
    assert backbone.position == "none" and not backbone.tie_embeddings
    for block in backbone.transformer_stack.blocks:
        assert type(block) is TransformerBlock and block.feedforward is None
        assert block.norm_placement == "pre" and block.normalization == "rms_norm"
        assert block.epsilon == 1e-6
        mixer = block.mixer
        assert type(mixer) is MambaMixer
        assert (mixer.state_size, mixer.expand, mixer.conv_kernel, mixer.rank) == (3, 1, 4, 3)
        assert mixer.use_bias and not mixer.use_conv_bias
    # Each layer's A_log and conv1d taps land where the equations read them.
    hf = reference.backbone.layers[1].mixer
    ours = backbone.transformer_stack.blocks[1].mixer
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours.a_log),
                               hf.A_log.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(ours.convolution.kernel),
                               hf.conv1d.weight.detach().numpy()[:, 0, :].T, rtol=1e-6)
    assert ours.get_config()["dt_rank"] == 3


def test_padding_stays_out_of_the_real_positions(checkpoint):
    folder, _ = checkpoint
    model = from_huggingface(folder)
    ids, mask = batch()
    padded = keras_logits(model, ids, mask)
    alone = keras_logits(model, ids[1:, :7], mask[1:, :7])
    np.testing.assert_allclose(padded[1, :7], alone[0], atol=1e-5, rtol=1e-5)


def test_written_config_and_tensors(checkpoint, tmp_path):
    folder, _ = checkpoint
    model = from_huggingface(folder)
    assert to_huggingface(model, tmp_path, family="mamba") == "MambaForCausalLM"
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["residual_in_fp32"] is False and config["time_step_rank"] == 3
    assert config["intermediate_size"] == 16 and config["tie_word_embeddings"] is False
    from safetensors.numpy import load_file

    written, original = load_file(tmp_path / "model.safetensors"), load_file(
        folder / "model.safetensors")
    assert sorted(written) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_missing_and_unused_tensors_are_named(checkpoint, tmp_path):
    folder, _ = checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    rewrite(broken, lambda t: t.pop("backbone.layers.1.mixer.A_log"))
    with pytest.raises(ValueError, match=r"MambaForCausalLM .* lacks tensor "
                                         r"'backbone\.layers\.1\.mixer\.A_log'"):
        from_huggingface(broken)
    shutil.rmtree(broken)
    shutil.copytree(folder, broken)
    rewrite(broken, lambda t: t.update({"backbone.layers.0.mixer.conv1d.bias":
                                        np.zeros(16, "float32")}))
    with pytest.raises(ValueError, match=r"no variable takes: \['backbone\.layers\.0\.mixer"
                                         r"\.conv1d\.bias'\]"):
        from_huggingface(broken)


@pytest.mark.parametrize("change, match", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"intermediate_size": 20}, "intermediate_size=20"),
])
def test_configs_keras_xf_does_not_read_are_refused(checkpoint, tmp_path, change, match):
    folder, _ = checkpoint
    shutil.copytree(folder, tmp_path / "other")
    config = json.loads((tmp_path / "other" / "config.json").read_text())
    (tmp_path / "other" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=match):
        from_huggingface(tmp_path / "other")


def test_models_mamba_cannot_express_are_refused(tmp_path):
    def lm(feedforward=None, **block):
        block = TransformerBlock(MambaMixer(4), feedforward, **{
            "normalization": "rms_norm", "norm_placement": "pre", **block})
        return CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, block=block,
                        position="none")

    for model in (lm(FeedForward(16)), lm(norm_placement="post"), lm(normalization="layer_norm")):
        with pytest.raises(ValueError, match="MambaMixer without a feedforward"):
            to_huggingface(model, tmp_path, family="mamba")


def test_bfloat16_checkpoint_loads_into_the_model_dtype(tmp_path):
    reference = causal_reference("mamba", seed=1).to(torch.bfloat16)
    reference.save_pretrained(tmp_path)
    model = from_huggingface(tmp_path, dtype="bfloat16")
    assert model.dtype_policy.name == "bfloat16"
    mixer = model.backbone.transformer_stack.blocks[0].mixer
    assert keras.backend.standardize_dtype(mixer.a_log.dtype) == "bfloat16"
    # The scan runs in float32 from the bfloat16 weights: close to the float32 model of the
    # same (rounded) weights.
    exact = from_huggingface(tmp_path)
    ids, mask = batch(3)
    half, full = keras_logits(model, ids, mask), keras_logits(exact, ids, mask)
    real = mask.astype(bool)
    assert np.all(np.isfinite(half))
    np.testing.assert_allclose(half[real], full[real], atol=0.1, rtol=0.02)
