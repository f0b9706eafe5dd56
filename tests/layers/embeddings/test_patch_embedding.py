import keras
import numpy as np
import pytest

from keras_xf.layers import PatchEmbedding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import vision as reference
from tests.layers.bad_inputs import raises_naming

PATCH, DIM = 2, 16


def make_layer(**kwargs):
    kwargs.setdefault("patch_size", PATCH)
    kwargs.setdefault("hidden_dim", DIM)
    return PatchEmbedding(**kwargs)


def images(rng, batch=2, height=4, width=6, channels=3):
    return rng.normal(size=(batch, height, width, channels)).astype("float32")


def test_build_weights_and_config():
    layer = make_layer(name="patches")
    layer.build((None, 4, 6, 3))
    assert count_params(layer) == PATCH * PATCH * 3 * DIM + DIM
    assert layer.compute_output_shape((None, 4, 6, 3)) == (None, 6, DIM)
    clone = check_config_round_trip(layer)
    assert clone.patch_size == PATCH and clone.hidden_dim == DIM and clone.name == "patches"
    no_bias = make_layer(use_bias=False)
    no_bias.build((None, 4, 4, 1))
    assert count_params(no_bias) == PATCH * PATCH * DIM


@pytest.mark.parametrize("use_bias", [True, False])
def test_matches_reference_and_strided_convolution(rng, use_bias):
    layer = make_layer(use_bias=use_bias, bias_initializer="random_normal")
    x = images(rng)
    outputs = to_numpy(layer(x))
    kernel = to_numpy(layer.projection.kernel)
    bias = to_numpy(layer.projection.bias) if use_bias else None
    assert outputs.shape == (2, 6, DIM)
    np.testing.assert_allclose(
        outputs, reference.patch_embedding(x, PATCH, kernel, bias), atol=1e-5, rtol=1e-5
    )
    conv = reference.strided_convolution(x, kernel.reshape(PATCH, PATCH, 3, DIM), PATCH)
    np.testing.assert_allclose(outputs, conv + (0 if bias is None else bias), atol=1e-5)


def test_patch_order_is_row_major():
    # One-hot images: the lit pixel lands in exactly the patch of its grid cell.
    layer = make_layer(kernel_initializer="ones", use_bias=False)
    x = np.zeros((1, 4, 6, 1), "float32")
    x[0, 3, 4, 0] = 1.0  # grid cell (1, 2) -> patch 1 * 3 + 2 = 5
    outputs = to_numpy(layer(x))[0, :, 0]
    np.testing.assert_array_equal(outputs, np.eye(6)[5])


def test_integer_images_fit_and_saving(rng, tmp_path):
    x = rng.integers(0, 17, size=(2, 4, 4, 1)).astype("uint8")
    layer = make_layer()
    model = wrap_in_model(layer, [x])
    assert keras.backend.standardize_dtype(layer(x).dtype) == "float32"
    check_fit_step(model, [x], learning_rate=0.001)
    check_saving(model, [x], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    outputs = check_mixed_precision(make_layer, [images(rng)], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == policy.split("_")[1]


@xla_only
def test_jit_compile(rng):
    x = images(rng)
    check_jit_compile(wrap_in_model(make_layer(), [x]), [x])


def test_errors(rng):
    for kwargs, name in [({"patch_size": 0}, "patch_size"), ({"hidden_dim": -1}, "hidden_dim"),
                         ({"use_bias": "yes"}, "use_bias")]:
        with pytest.raises(ValueError, match=f"{name}="):
            make_layer(**kwargs)
    layer = make_layer(patch_size=4)
    with pytest.raises(ValueError, match="height=6, patch_size=4"):
        layer(images(rng, height=6, width=8))
    with pytest.raises(ValueError, match="width=6, patch_size=4"):
        layer(images(rng, height=8, width=6))
    layer(images(rng, height=8, width=8, channels=3))
    with pytest.raises(ValueError, match="channels=1, expected channels=3"):
        layer(images(rng, height=8, width=8, channels=1))
    with pytest.raises(ValueError, match="rank 4"):
        make_layer()(np.zeros((2, 4, 4), "float32"))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"kernel_initializer": "not_an_initializer"}, "kernel_initializer"),
        ({"bias_initializer": 3}, "bias_initializer"),
        ({"patch_size": True}, "patch_size"),
        ({"hidden_dim": 2.0}, "hidden_dim"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: make_layer(**kwargs))
