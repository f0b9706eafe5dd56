"""In-memory keras-hub backbones → keras_xf `CausalLM`s with equal logits."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.models import TextEncoder
from keras_xf.models import VisionBackbone
from keras_xf.checkpoints import from_keras_hub

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


@pytest.mark.parametrize("name", ["gemma", "gpt2", "llama3", "mistral", "qwen"])
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


# Backbones keras-hub's exporter does not write, named as Hugging Face checkpoints in memory.
ENCODER_SIZES = dict(vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=16,
                     intermediate_dim=24, max_sequence_length=12)
CONVERTED = {
    # Three token types.
    "bert": lambda: keras_hub.models.BertBackbone(num_segments=3, **ENCODER_SIZES),
    "roberta": lambda: keras_hub.models.RobertaBackbone(**ENCODER_SIZES),
    # Six heads: ALiBi's slopes of 4 heads, then every other slope of 8.
    "bloom": lambda: keras_hub.models.BloomBackbone(
        vocabulary_size=VOCAB, num_layers=2, num_heads=6, hidden_dim=24, intermediate_dim=96,
        layer_norm_epsilon=1e-6),
    # Four experts, two per token, a window of 4 keys and linearly scaled rotary positions.
    "mixtral": lambda: keras_hub.models.MixtralBackbone(
        num_query_heads=4, num_key_value_heads=2, num_experts=4, top_k=2, sliding_window=4,
        rope_max_wavelength=500000, rope_scaling_factor=2.0, **SIZES),
    "vit": lambda: keras_hub.models.ViTBackbone(
        image_shape=(8, 8, 3), patch_size=4, num_layers=2, num_heads=4, hidden_dim=16,
        mlp_dim=24, layer_norm_epsilon=1e-6),
}
BACKBONES.update(CONVERTED)


def token_batch(length=10, segments=0):
    rng = np.random.default_rng(1)
    inputs = {"token_ids": rng.integers(3, VOCAB, size=(2, length)).astype("int32"),
              "padding_mask": np.ones((2, length), "int32")}
    inputs["padding_mask"][1, 6:] = 0  # right padding
    if segments:
        inputs["segment_ids"] = rng.integers(0, segments, size=(2, length)).astype("int32")
    return inputs


def numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize("name", ["bloom", "mixtral"])
def test_converted_decoders_give_the_keras_hub_logits(name):
    backbone = perturbed(name)
    model = from_keras_hub(backbone)
    assert isinstance(model, CausalLM)
    assert model.backbone.tie_embeddings == (name == "bloom")
    inputs = token_batch()
    real = inputs["padding_mask"].astype(bool)
    np.testing.assert_allclose(numpy(model(inputs))[real], hub_logits(backbone, inputs)[real],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_converted_encoders_give_the_keras_hub_states(name):
    backbone = perturbed(name)
    model = from_keras_hub(backbone)
    assert isinstance(model, TextEncoder)
    inputs = token_batch(segments=3 if name == "bert" else 0)
    assert sorted(model.input) == sorted(inputs)
    expected = backbone(inputs)
    real = inputs["padding_mask"].astype(bool)
    hidden = expected["sequence_output"] if name == "bert" else expected
    np.testing.assert_allclose(numpy(model.backbone(inputs))[real], numpy(hidden)[real],
                               atol=1e-5, rtol=1e-5)
    if name == "bert":  # BERT's pooler is the encoder's output; RoBERTa has none
        assert model.projection is not None
        np.testing.assert_allclose(numpy(model(inputs)), numpy(expected["pooled_output"]),
                                   atol=1e-5, rtol=1e-5)
    else:
        assert model.projection is None
        np.testing.assert_allclose(numpy(model(inputs)), numpy(hidden)[:, 0],
                                   atol=1e-5, rtol=1e-5)


def test_a_converted_vit_gives_the_keras_hub_states():
    backbone = perturbed("vit")
    model = from_keras_hub(backbone)
    assert isinstance(model, VisionBackbone)
    images = np.random.default_rng(2).normal(size=(2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(numpy(model({"images": images})), numpy(backbone(images)),
                               atol=1e-5, rtol=1e-5)


def test_settings_a_checkpoint_cannot_express_are_refused():
    bloom = keras_hub.models.BloomBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                           hidden_dim=8, intermediate_dim=24)
    with pytest.raises(ValueError, match="4 \\* hidden_dim wide.*intermediate_dim=24"):
        from_keras_hub(bloom)
    vit = keras_hub.models.ViTBackbone(image_shape=(8, 4, 3), patch_size=4, num_layers=1,
                                       num_heads=2, hidden_dim=8, mlp_dim=8,
                                       use_mlp_bias=False)
    with pytest.raises(ValueError, match="converts with square images, use_mlp_bias=True"):
        from_keras_hub(vit)


def test_other_backbones_are_refused():
    backbone = keras_hub.models.DistilBertBackbone(
        vocabulary_size=VOCAB, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16)
    with pytest.raises(ValueError, match="backbone must be one of .*BertBackbone.*DistilBert"):
        from_keras_hub(backbone)
