"""A LoRA model written by `to_huggingface` holds the merged weights `W + (α/r)·A·B`: the
folder, read back by `from_huggingface` and by `transformers`, gives the LoRA model's logits
(GPT-2's fused `c_attn`, Llama's separate projections, feedforward and untied `lm_head`,
Mixtral's experts)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402
from tests.checkpoints.hf_checks import with_random_adapters  # noqa: E402

TARGETS = {
    "gpt2": ["query", "key", "value", "attention_output", "ffn_hidden", "ffn_output"],
    "llama": ["query", "key", "value", "attention_output", "ffn_hidden", "ffn_gate",
              "ffn_output", "output_head"],
    "mixtral": ["query", "value", "expert_in", "expert_gate", "expert_out"],
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_written_lora_model_reloads_with_the_same_logits(name, reference_folder, tmp_path):
    model = from_huggingface(reference_folder(name))
    ids, mask = batch()
    base = keras_logits(model, ids, mask)
    model.enable_lora(2, alpha=4, targets=TARGETS[name])
    lora = keras_logits(with_random_adapters(model), ids, mask)
    assert np.abs(lora - base).max() > 1e-2  # the adapters change the logits
    to_huggingface(model, tmp_path / "merged")
    assert_logits_equal(keras_logits(from_huggingface(tmp_path / "merged"), ids, mask), lora,
                        mask)
    written = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert_logits_equal(reference_logits(written, ids, mask), lora, mask)
