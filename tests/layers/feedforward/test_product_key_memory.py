import keras
import numpy as np
import pytest

from keras_xf.layers import ProductKeyMemory
from tests import layer_checks as checks
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.reference import compressed as ref
from tests.layers.bad_inputs import raises_naming

B, T, D = 2, 5, 16


def _reference(layer, x):
    bias = layer.query_dense.bias
    return ref.product_key_memory(
        x.astype("float64"),
        to_float64(layer.query_dense.kernel),
        None if bias is None else to_float64(bias),
        to_float64(layer.sub_keys),
        to_float64(layer.values.embeddings),
        layer.top_k,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_keys=5, top_k=4, num_heads=2, key_dim=8, use_bias=False),
        dict(num_keys=4, top_k=4, num_heads=3, output_dim=12),
    ],
)
def test_matches_brute_force_reference(rng, kwargs):
    layer = ProductKeyMemory(**kwargs)
    x = random_normal(rng, (B, T, D))
    layer(x)
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype("float32"))
    out = checks.to_numpy(layer(x))
    assert out.shape == (B, T, kwargs.get("output_dim", D))
    np.testing.assert_allclose(out, _reference(layer, x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(num_keys=6, top_k=3), D * D + D + 6 * D + 36 * D),
        (dict(num_keys=5, top_k=2, num_heads=2, key_dim=8, use_bias=False), D * 16 + 2 * 5 * 8 + 25 * D),
        (dict(num_keys=4, top_k=2, query_batch_norm=True), D * D + D + 4 * D + 16 * D + 4 * D),
    ],
)
def test_exact_weight_count(kwargs, expected):
    layer = ProductKeyMemory(**kwargs)
    layer.build((B, T, D))
    assert checks.count_params(layer) == expected


def test_config_round_trip_fit_and_saving(rng, tmp_path):
    layer = ProductKeyMemory(num_keys=6, top_k=3, num_heads=2, query_batch_norm=True)
    checks.check_config_round_trip(layer)
    x = random_normal(rng, (B, T, D))
    model = checks.wrap_in_model(layer, [x])
    assert checks.check_config_round_trip(layer).key_dim == D
    checks.check_fit_step(model, [x])
    checks.check_saving(model, [x], tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    out = checks.check_mixed_precision(
        lambda **kw: ProductKeyMemory(num_keys=6, top_k=3, num_heads=2, query_batch_norm=True, **kw),
        [random_normal(rng, (B, T, D))],
        policy=policy,
    )
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    model = checks.wrap_in_model(ProductKeyMemory(num_keys=6, top_k=3, num_heads=2), [x])
    checks.check_jit_compile(model, [x])


# Training in a CausalLM (as the feedforward, with selection attention as the mixer):
# tests/layers/attention/test_compressed_attention.py::test_causal_lm_with_selection_and_memory_trains


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_keys=0), "num_keys=0"),
        (dict(num_keys=4, top_k=0), "top_k=0"),
        (dict(num_keys=4, top_k=5), "top_k=5, num_keys=4"),
        (dict(num_keys=4, num_heads=-1), "num_heads=-1"),
        (dict(num_keys=4, top_k=2, key_dim=7), "key_dim=7"),
        (dict(num_keys=4, top_k=2, output_dim=0), "output_dim=0"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProductKeyMemory(**kwargs)


def test_bad_inputs_raise(rng):
    layer = ProductKeyMemory(num_keys=4, top_k=2)
    layer(random_normal(rng, (B, T, D)))
    with pytest.raises(ValueError, match="width 16"):
        layer(random_normal(rng, (B, T, 8)))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kernel_initializer="not_an_initializer"), "kernel_initializer"),
        (dict(num_keys=True), "num_keys"),
        (dict(key_dim=2.0), "key_dim"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    kwargs = {"num_keys": 4, "top_k": 1, **kwargs}
    raises_naming(name, lambda: ProductKeyMemory(**kwargs))


def test_bad_input_width_names_inputs(rng):
    layer = ProductKeyMemory(num_keys=4, top_k=2)
    layer(random_normal(rng, (B, T, D)))
    raises_naming("inputs", lambda: layer(random_normal(rng, (B, T, 8))))
