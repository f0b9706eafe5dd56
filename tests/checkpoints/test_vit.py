"""ViT checkpoints (`ViTForImageClassification`) ↔ keras_xf `VisionClassifier`, and the
encoder alone (`ViTModel` without pooler) ↔ `VisionBackbone`."""

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.models import VisionBackbone  # noqa: E402
from keras_xf.models import VisionClassifier  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import perturbed  # noqa: E402


def vit_config():
    return transformers.ViTConfig(
        hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
        image_size=8, patch_size=4, num_channels=3, num_labels=5)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    # Perturbed: a [CLS] token not zero.
    model = perturbed(transformers.ViTForImageClassification(vit_config()))
    folder = tmp_path_factory.mktemp("vit")
    model.save_pretrained(folder)
    return folder, model


def images(seed=0):
    return np.random.default_rng(seed).normal(size=(2, 8, 8, 3)).astype("float32")


def reference_logits(model, x):
    with torch.no_grad():  # transformers takes channels first
        return model(pixel_values=torch.tensor(x.transpose(0, 3, 1, 2))).logits.numpy()


def test_logits_equal_transformers(checkpoint):
    folder, reference = checkpoint
    model = from_huggingface(folder)
    assert isinstance(model, VisionClassifier)
    assert model.backbone.class_token.position
    x = images()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model({"images": x})),
                               reference_logits(reference, x), atol=1e-4, rtol=1e-4)


def test_written_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    folder, reference = checkpoint
    assert to_huggingface(from_huggingface(folder), tmp_path) == "ViTForImageClassification"
    reloaded = transformers.ViTForImageClassification.from_pretrained(tmp_path).eval()
    x = images(1)
    np.testing.assert_allclose(reference_logits(reloaded, x), reference_logits(reference, x),
                               atol=1e-6)


def test_a_classifier_vit_cannot_express_is_refused(tmp_path):
    model = VisionClassifier(3, image_shape=(8, 8, 3), patch_size=4, num_layers=1,
                             hidden_dim=8, num_heads=2, intermediate_dim=16)
    with pytest.raises(ValueError, match="ViT needs .*own position"):
        to_huggingface(model, tmp_path, family="vit")


def test_encoders_without_pooler_load_as_a_backbone_and_write_back(tmp_path):
    torch.manual_seed(0)
    reference = perturbed(transformers.ViTModel(vit_config(), add_pooling_layer=False))
    reference.save_pretrained(tmp_path / "in")
    model = from_huggingface(tmp_path / "in")
    assert isinstance(model, VisionBackbone)
    x = images(2)

    def hidden(vit):
        with torch.no_grad():
            pixels = torch.tensor(x.transpose(0, 3, 1, 2))
            return vit(pixel_values=pixels).last_hidden_state.numpy()

    np.testing.assert_allclose(keras.ops.convert_to_numpy(model({"images": x})),
                               hidden(reference), atol=1e-4, rtol=1e-4)
    assert to_huggingface(model, tmp_path / "out") == "ViTModel"
    reloaded = transformers.ViTModel.from_pretrained(tmp_path / "out",
                                                     add_pooling_layer=False).eval()
    np.testing.assert_allclose(hidden(reloaded), hidden(reference), atol=1e-6)


def test_an_encoder_with_pooler_is_refused(tmp_path):
    transformers.ViTModel(vit_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="ViTModel checkpoint .* has a pooler"):
        from_huggingface(tmp_path)
