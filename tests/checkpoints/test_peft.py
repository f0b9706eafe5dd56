"""PEFT LoRA adapter folders ↔ keras_xf adapters (`to_peft`, `from_peft`): an adapter written
by keras_xf and loaded by `peft` on the base `transformers` model gives keras_xf's LoRA logits,
and an adapter written by `peft` and loaded into keras_xf gives `peft`'s."""

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import from_peft  # noqa: E402
from keras_xf.checkpoints import to_peft  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402
from tests.checkpoints.hf_checks import with_random_adapters  # noqa: E402
from tests.models.tiny import causal_lm  # noqa: E402

ALL = ["query", "key", "value", "attention_output", "ffn_gate", "ffn_hidden", "ffn_output",
       "output_head"]
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "lm_head"]


@pytest.fixture
def base(reference_folder):
    """A perturbed tiny Llama (4 query heads, 2 key/value heads) saved by `transformers`."""
    return reference_folder("llama")


@pytest.mark.parametrize("targets", [["query", "value"], ALL])
def test_keras_xf_adapter_loads_in_peft_with_the_same_logits(base, targets, tmp_path):
    model = from_huggingface(base)
    model.enable_lora(2, alpha=5, targets=targets)
    ids, mask = batch()
    expected = keras_logits(with_random_adapters(model), ids, mask)
    to_peft(model, tmp_path)
    with open(tmp_path / "adapter_config.json") as file:
        assert json.load(file)["lora_alpha"] == 5
    reference = transformers.AutoModelForCausalLM.from_pretrained(base)
    adapted = peft.PeftModel.from_pretrained(reference, tmp_path).eval()
    assert_logits_equal(reference_logits(adapted, ids, mask), expected, mask)


@pytest.mark.parametrize("use_rslora", [False, True])
def test_peft_adapter_loads_in_keras_xf_with_the_same_logits(base, use_rslora, tmp_path):
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_pretrained(base)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=MODULES, lora_dropout=0.0,
                             use_rslora=use_rslora, init_lora_weights=False)
    adapted = peft.get_peft_model(reference, config).eval()
    adapted.save_pretrained(tmp_path)
    ids, mask = batch()
    expected = reference_logits(adapted, ids, mask)
    model = from_peft(from_huggingface(base), tmp_path)
    assert model.lora_settings["rank"] == 4 and sorted(model.lora_settings["targets"]) == \
        sorted(ALL)
    assert_logits_equal(keras_logits(model, ids, mask), expected, mask)


def test_unsupported_adapters_and_models_are_refused(base, tmp_path):
    reference = transformers.AutoModelForCausalLM.from_pretrained(base)
    peft.get_peft_model(reference, peft.LoraConfig(
        r=2, target_modules=["q_proj"], bias="all")).save_pretrained(tmp_path / "bias")
    with pytest.raises(ValueError, match="bias='none'. Received: bias='all'"):
        from_peft(from_huggingface(base), tmp_path / "bias")
    with pytest.raises(ValueError, match="call enable_lora first"):
        to_peft(from_huggingface(base), tmp_path / "none")
    plain = causal_lm(num_layers=1)  # post-norm, learned positions: no Llama layout
    plain.enable_lora(2)
    with pytest.raises(ValueError, match="Llama layout"):
        to_peft(plain, tmp_path / "other")
    model = from_huggingface(base)
    model.enable_lora(3, targets=["query"])
    peft.get_peft_model(transformers.AutoModelForCausalLM.from_pretrained(base), peft.LoraConfig(
        r=2, target_modules=["q_proj"])).save_pretrained(tmp_path / "r2")
    with pytest.raises(ValueError, match="has the LoRA settings"):
        from_peft(model, tmp_path / "r2")
