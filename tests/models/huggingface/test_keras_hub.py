"""In-memory keras-hub backbones → keras_xf `CausalLM`s with equal logits."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.models import from_keras_hub

VOCAB = 61
SIZES = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=24)
BACKBONES = {
    "gpt2": lambda: keras_hub.models.GPT2Backbone(num_heads=4, max_sequence_length=32, **SIZES),
    "llama3": lambda: keras_hub.models.Llama3Backbone(
        num_query_heads=4, num_key_value_heads=2, rope_max_wavelength=500000, **SIZES),
    "mistral": lambda: keras_hub.models.MistralBackbone(
        num_query_heads=4, num_key_value_heads=1, sliding_window=4, **SIZES),
    "gemma": lambda: keras_hub.models.GemmaBackbone(
        num_query_heads=4, num_key_value_heads=1, head_dim=8, **SIZES),
    "qwen": lambda: keras_hub.models.QwenBackbone(
        num_query_heads=4, num_key_value_heads=2, **SIZES),
}


def perturbed(name):
    keras.utils.set_random_seed(0)
    backbone = BACKBONES[name]()
    rng = np.random.default_rng(0)
    for variable in backbone.weights:  # no zero bias, no unit norm scale
        variable.assign(np.asarray(keras.ops.convert_to_numpy(variable))
                        + rng.normal(scale=0.2, size=variable.shape).astype("float32"))
    return backbone


def hub_logits(backbone, inputs):
    hidden = backbone(inputs)
    return keras.ops.convert_to_numpy(backbone.token_embedding(hidden, reverse=True))


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_logits_equal_the_keras_hub_backbone(name):
    backbone = perturbed(name)
    model = from_keras_hub(backbone)
    assert isinstance(model, CausalLM)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, size=(2, 10)).astype("int32")
    mask = np.ones((2, 10), "int32")
    mask[1, 6:] = 0  # right padding
    inputs = {"token_ids": ids, "padding_mask": mask}
    expected = hub_logits(backbone, inputs)
    actual = keras.ops.convert_to_numpy(model(inputs))
    real = mask.astype(bool)
    np.testing.assert_allclose(actual[real], expected[real], atol=1e-4, rtol=1e-4)


def test_backbones_keras_hub_cannot_export_are_refused():
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                             hidden_dim=8, intermediate_dim=16)
    with pytest.raises(ValueError, match="backbone must be one that keras-hub exports.*BertBackbone"):
        from_keras_hub(backbone)
