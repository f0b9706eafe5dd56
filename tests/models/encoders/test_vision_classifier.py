"""VisionBackbone and VisionClassifier (ViT, survey §6.4): pooling, block templates, training,
saving, mixed precision, XLA, SavedModel export and argument errors."""

import keras
import numpy as np
import pytest

from keras_xf import export
from keras_xf.layers import FeedForward
from keras_xf.layers import LinearAttention
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.models import VisionBackbone
from keras_xf.models import VisionClassifier
from tests.layer_checks import check_saving
from tests.layer_checks import xla_only
from tests.models.tiny import FFN
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.models.tiny import dtype_name
from tests.layer_checks import to_numpy

BACKEND = keras.config.backend()
IMAGE, PATCH, CLASSES = (4, 4, 1), 2, 3
SIZES = dict(image_shape=IMAGE, patch_size=PATCH, hidden_dim=WIDTH, num_heads=2,
             intermediate_dim=FFN, num_layers=1)


def vit(num_classes=CLASSES, **kwargs):
    return VisionClassifier(num_classes=num_classes, **{**SIZES, **kwargs})


def images(rng, batch=2, shape=IMAGE):
    return {"images": rng.uniform(size=(batch,) + tuple(shape)).astype("float32")}


def quadrant_task(rng, size=32):
    """Class 1 iff the bright pixels lie in the top half: a task that needs positions."""
    x = rng.uniform(0.0, 0.2, size=(size,) + IMAGE).astype("float32")
    labels = np.arange(size) % 2
    for index, label in enumerate(labels):
        row = rng.integers(0, 2) if label else rng.integers(2, 4)
        x[index, row, :, 0] += 0.8
    return {"images": x}, labels.astype("int32")


def test_shapes_and_weight_count():
    # Symbolic shapes only: eager calls of a whole model are slow on JAX.
    model = vit()
    assert tuple(model.outputs[0].shape) == (None, CLASSES)
    assert dtype_name(model.outputs[0]) == "float32"
    backbone = model.backbone
    assert backbone.grid_size == (2, 2) and backbone.num_patches == 4
    assert tuple(backbone.outputs[0].shape) == (None, 5, WIDTH)  # [CLS] + 4 patches
    patch = PATCH * PATCH * 1 * WIDTH + WIDTH
    positions, cls, final_norm = 4 * WIDTH, WIDTH, 2 * WIDTH
    assert model.count_params() == (
        patch + positions + cls + block_params() + final_norm + WIDTH * CLASSES + CLASSES)
    no_cls = VisionBackbone(**{**SIZES, "positions": "sinusoidal_2d", "class_token": False})
    assert no_cls.num_prefix_tokens == 0
    assert tuple(no_cls.outputs[0].shape) == (None, 4, WIDTH)
    assert no_cls.count_params() == patch + block_params() + final_norm


def test_mean_pooling_reads_the_patch_states(rng):
    # "mean" averages the patch states only; the [CLS] state (position 0) is left out.
    model = vit(pooling="mean")
    batch = images(rng)
    hidden = model.backbone.predict(batch, verbose=0)
    expected = to_numpy(model.head(hidden[:, 1:].mean(axis=1)))
    np.testing.assert_allclose(model.predict(batch, verbose=0), expected, atol=1e-5)
    assert not np.allclose(to_numpy(model.head(hidden[:, 0])), expected, atol=1e-3)


def gqa_block():
    return TransformerBlock(MultiHeadAttention(4, head_dim=4, num_key_value_heads=2),
                            FeedForward(FFN, activation="gelu"), norm_placement="pre")


def linear_block():
    return TransformerBlock(LinearAttention(2, causal=False), FeedForward(FFN),
                            norm_placement="pre")


@pytest.mark.parametrize("block, positions", [(gqa_block, "learned"),
                                              (linear_block, "sinusoidal_2d")],
                         ids=["gqa", "linear_attention"])
def test_any_block_template_trains(rng, block, positions):
    model = VisionClassifier(num_classes=2, block=block(), positions=positions,
                             **{k: v for k, v in SIZES.items()
                                if k not in ("num_heads", "intermediate_dim")})
    mixer = model.backbone.transformer_stack.blocks[0].mixer
    assert type(mixer) is type(block().mixer)
    x, y = quadrant_task(rng)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, batch_size=16, epochs=6, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.8 * losses[0], losses


def test_config_round_trip_and_keras_saving(rng, tmp_path):
    model = VisionClassifier(num_classes=CLASSES, block=linear_block(), pooling="max",
                             positions="sinusoidal_2d", class_token=False, head_intermediate_dim=8,
                             image_shape=(4, 6, 3), patch_size=2, num_layers=2, hidden_dim=WIDTH)
    config = model.get_config()
    clone = VisionClassifier.from_config(config)
    assert clone.get_config() == config and clone.count_params() == model.count_params()
    batch = images(rng, shape=(4, 6, 3))
    loaded = check_saving(model, batch, tmp_path)
    assert isinstance(loaded, VisionClassifier) and isinstance(loaded.backbone, VisionBackbone)


def test_mixed_precision():
    # mixed_float16 trains (loss scaling); mixed_bfloat16 predicts: finite float32 logits and
    # float32 weights under both.
    rng = np.random.default_rng(0)
    for policy in ("mixed_float16", "mixed_bfloat16"):
        model = vit(dtype=policy)
        half = keras.DTypePolicy(policy).compute_dtype
        for layer in model._flatten_layers(include_self=False):
            if layer.weights:
                assert layer.compute_dtype == half, (layer.name, layer.dtype_policy.name)
        assert dtype_name(model.backbone.outputs[0]) == half
        assert dtype_name(model.outputs[0]) == "float32"
        x, y = quadrant_task(rng, size=8)
        if policy == "mixed_float16":
            model.compile(optimizer=keras.optimizers.SGD(1e-2))
            history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
            assert np.isfinite(history.history["loss"][0])
        assert np.all(np.isfinite(model.predict(x, verbose=0)))
        assert all(dtype_name(w) == "float32" for w in model.weights)
        assert all(np.isfinite(to_numpy(w)).all() for w in model.trainable_weights)


@xla_only
def test_fits_and_predicts_under_xla(rng):
    model = vit(pooling="mean", positions="sinusoidal_2d")
    x, y = quadrant_task(rng, size=8)
    expected = model.predict(x, verbose=0)
    model.compile(optimizer=keras.optimizers.SGD(1e-2), jit_compile=True)
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-5, rtol=1e-4)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.skipif(BACKEND == "torch", reason="Keras exports SavedModels from torch only "
                    "through torch_xla, which has no release for this torch version")
def test_saved_model_export(rng, tmp_path):
    import tensorflow as tf

    model = vit()
    assert export.sequence_dimensions(model) == {"images": ("batch",)}
    path = export.export_saved_model(model, str(tmp_path / "vit"))
    served = tf.saved_model.load(path)
    for batch in (2, 3):  # the batch stays dynamic
        x = images(rng, batch=batch)
        actual = np.asarray(served.serve({"images": tf.constant(x["images"])}))
        np.testing.assert_allclose(actual, model.predict(x, verbose=0), atol=1e-4, rtol=0)


def test_errors(rng):
    with pytest.raises(ValueError, match=r"image_shape=\(6, 6, 1\), patch_size=4"):
        vit(image_shape=(6, 6, 1), patch_size=4)
    with pytest.raises(ValueError, match="image_shape="):
        vit(image_shape=(8, 8))
    with pytest.raises(ValueError, match="positions='rotary'"):
        vit(positions="rotary")
    with pytest.raises(ValueError, match="pooling='cls'.*class_token=False"):
        vit(class_token=False)
    with pytest.raises(ValueError, match="class_token_position=True needs class_token=True"):
        vit(class_token=False, class_token_position=True, pooling="mean")
    with pytest.raises(ValueError, match="class_token_position"):
        vit(class_token_position="yes")
    with pytest.raises(ValueError, match="pooling='first'"):
        vit(pooling="first")
    with pytest.raises(ValueError, match="num_classes"):
        vit(num_classes=0)
    with pytest.raises(ValueError, match="Received both"):
        VisionClassifier(num_classes=2, backbone=VisionBackbone(**SIZES), patch_size=2)
    model = vit()
    with pytest.raises(ValueError, match="channels"):
        model.predict(images(rng, shape=(4, 4, 3)), verbose=0)
