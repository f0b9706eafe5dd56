"""VisionLanguageEncoder: text tokens and image patches in one encoder (survey §6.5, ViLT)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import PerceiverResampler
from keras_xf.layers import TransformerBlock
from keras_xf.layers import FeedForward
from keras_xf.models import VisionLanguageEncoder
from tests import layer_checks as checks
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.layer_checks import to_numpy
from tests.models.tiny import token_batch
from tests.reference import vision_language as ref

IMAGE, PATCH, LATENTS = (8, 8, 1), 4, 3
NUM_PATCHES = (IMAGE[0] // PATCH) * (IMAGE[1] // PATCH)


def make(**kwargs):
    return VisionLanguageEncoder(**{
        "vocabulary_size": VOCAB, "image_shape": IMAGE, "patch_size": PATCH, "num_layers": 1,
        "hidden_dim": WIDTH, "num_heads": HEADS, "intermediate_dim": FFN,
        "max_sequence_length": LENGTH, **kwargs})


def resampler():
    return PerceiverResampler(num_latents=LATENTS, num_heads=HEADS, intermediate_dim=FFN)


def batch(rng, lengths=(8, 3), size=2):
    x = token_batch(rng, batch=size, lengths=list(lengths))
    x["images"] = rng.normal(size=(size,) + IMAGE).astype("float32")
    return x


def test_embeddings_match_reference_and_weight_count(rng):
    model = make()
    x = batch(rng)
    for weight in model.weights:  # unit-scale embeddings, so every term is visible
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.5)
    out = model(x)
    assert tuple(out["sequence_output"].shape) == (2, 8 + NUM_PATCHES, WIDTH)
    assert tuple(out["pooled_output"].shape) == (2, WIDTH)
    weights = {
        "token": to_float64(model.text_embedding.token_embedding.embeddings),
        "text_position": to_float64(model.text_embedding.position_embedding.position_embeddings),
        "patch_kernel": to_float64(model.patch_embedding.projection.kernel),
        "patch_bias": to_float64(model.patch_embedding.projection.bias),
        "image_position": to_float64(model.image_position_embedding.position_embeddings),
        "type": to_float64(model.type_embedding.embeddings),
    }
    inputs, mask = ref.encoder_inputs(x["token_ids"], x["padding_mask"],
                                      x["images"].astype("float64"), weights, PATCH)
    expected = to_numpy(model.transformer_stack(inputs.astype("float32"), padding_mask=mask))
    np.testing.assert_allclose(to_numpy(out["sequence_output"]), expected, atol=1e-4)
    np.testing.assert_allclose(to_numpy(out["pooled_output"]), ref.mean_pool(expected, mask),
                               atol=1e-4)
    embeddings = VOCAB * WIDTH + LENGTH * WIDTH + (PATCH * PATCH + 1) * WIDTH
    embeddings += NUM_PATCHES * WIDTH + 2 * WIDTH
    final_norm = 2 * WIDTH  # the default block is pre-norm
    assert model.count_params() == embeddings + block_params() + final_norm


def test_text_padding_is_respected_with_the_image_present(rng):
    """Padded text positions change nothing at the real positions, with the patches
    compressed by a resampler (survey §5.7) before the encoder."""
    model = make(num_classes=3, resampler=resampler())
    extractor = model.feature_extractor()
    x = batch(rng)
    noisy = dict(x, token_ids=np.where(x["padding_mask"] > 0, x["token_ids"],
                                       rng.integers(1, VOCAB, size=x["token_ids"].shape)
                                       ).astype("int32"))
    clean, changed = extractor(x), extractor(noisy)
    assert model.num_image_tokens == LATENTS
    assert tuple(clean["sequence_output"].shape) == (2, 8 + LATENTS, WIDTH)
    valid = np.concatenate([x["padding_mask"] > 0, np.ones((2, LATENTS), bool)], axis=1)
    np.testing.assert_allclose(to_numpy(changed["sequence_output"])[valid],
                               to_numpy(clean["sequence_output"])[valid], atol=1e-5)
    np.testing.assert_allclose(to_numpy(changed["pooled_output"]),
                               to_numpy(clean["pooled_output"]), atol=1e-5)
    np.testing.assert_allclose(to_numpy(model(noisy)), to_numpy(model(x)), atol=1e-5)


def synthetic_task(rng, size=16):
    """Class = (image bright on its left half) + 2·(token 5 in the text): needs both inputs."""
    x = batch(rng, lengths=rng.integers(2, 9, size=size), size=size)
    bright = np.arange(size) % 2
    x["images"][bright == 1, :, :4] += 2.0
    keyword = (np.arange(size) // 2) % 2
    x["token_ids"][keyword == 1, 0] = 5
    x["token_ids"][keyword == 0] = np.where(x["token_ids"][keyword == 0] == 5, 6,
                                            x["token_ids"][keyword == 0])
    x["token_ids"] *= x["padding_mask"]
    return x, (bright + 2 * keyword).astype("int32")


def test_classifier_trains(rng):
    x, y = synthetic_task(rng)
    model = make(num_classes=4)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, batch_size=8, epochs=6, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


def test_config_saving_and_block_template(rng, tmp_path):
    block = TransformerBlock(MultiHeadAttention(num_heads=4, num_key_value_heads=2),
                             FeedForward(FFN, activation="swiglu"), norm_placement="pre")
    model = make(num_classes=3, block=block, resampler=resampler(), pooling="cls",
                 head_intermediate_dim=8)
    config = model.get_config()
    clone = VisionLanguageEncoder.from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()
    assert model.transformer_stack.blocks[0].mixer.num_key_value_heads == 2
    checks.check_saving(model, batch(rng), tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    model = make(dtype=policy)
    out = model(batch(rng, lengths=(8, 0)))
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    for key in ("sequence_output", "pooled_output"):
        assert keras.backend.standardize_dtype(out[key].dtype) == compute_dtype
        assert np.all(np.isfinite(to_numpy(keras.ops.cast(out[key], "float32"))))
    for weight in model.weights:
        assert keras.backend.standardize_dtype(weight.dtype) == "float32", weight.path


@checks.xla_only
def test_jit_compile(rng):
    x, y = synthetic_task(rng, size=4)
    model = make(num_classes=4)
    expected = model.predict(x, verbose=0)
    model.compile(optimizer="sgd", jit_compile=True)
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-5)
    history = model.fit(x, y, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"image_shape": (8, 6, 1)}, r"divisible by patch_size. Received: image_shape=\(8, 6, 1\)"),
        ({"image_shape": (8, 8)}, r"image_shape=\(8, 8\)"),
        ({"patch_size": 0}, "patch_size=0"),
        ({"num_classes": 0}, "num_classes=0"),
        ({"resampler": MultiHeadAttention(2)}, "resampler=MultiHeadAttention"),
        ({"num_heads": None}, "num_heads=None"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_bad_inputs_raise(rng):
    model = make(num_classes=2)
    x = batch(rng)
    with pytest.raises(ValueError, match=r"images must have shape \[batch, 8, 8, 1\].* images.shape=\(2, 8, 8, 3\)"):
        model(dict(x, images=np.zeros((2, 8, 8, 3), "float32")))
    with pytest.raises(ValueError, match="images"):
        model(dict(x, images=np.zeros((2, 4, 8, 1), "float32")))
    for missing in ("images", "token_ids"):
        with pytest.raises(ValueError, match=missing):
            model({key: value for key, value in x.items() if key != missing})
