"""PerceiverResampler: learned latent queries cross-attending to a padded input (survey §5.7)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import PerceiverResampler
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.reference import perceiver as ref

B, M, D, R, HEADS, FFN = 2, 10, 16, 4, 2, 32


def _make(**kwargs):
    return PerceiverResampler(**{"num_latents": R, "num_heads": HEADS, "intermediate_dim": FFN,
                                 **kwargs})


def _norm(layer):
    return to_float64(layer.gamma), to_float64(layer.beta)


def _params(layer):
    """The reference's weights of each resampler layer."""
    layers = []
    for index in range(layer.num_layers):
        mha, ffn = layer.attentions[index], layer.feedforwards[index]
        attention = {
            "wq": mha.query_dense.kernel, "bq": mha.query_dense.bias,
            "wk": mha.key_dense.kernel, "bk": mha.key_dense.bias,
            "wv": mha.value_dense.kernel, "bv": mha.value_dense.bias,
            "wo": mha.output_dense.kernel, "bo": mha.output_dense.bias,
        }
        layers.append({
            "input_norm": _norm(layer.input_norms[index]),
            "latent_norm": _norm(layer.latent_norms[index]),
            "feedforward_norm": _norm(layer.feedforward_norms[index]),
            "attention": {k: to_float64(v) for k, v in attention.items()},
            "feedforward": tuple(to_float64(w) for w in (
                ffn.hidden_dense.kernel, ffn.hidden_dense.bias,
                ffn.output_dense.kernel, ffn.output_dense.bias)),
        })
    return layers


def _expected_params(num_layers=1):
    attention = 4 * (D * D + D)
    feedforward = D * FFN + FFN + FFN * D + D
    return R * D + num_layers * (attention + feedforward + 3 * 2 * D) + 2 * D


@pytest.mark.parametrize("attend_to_latents,num_layers", [(False, 1), (True, 2)])
def test_matches_reference(rng, attend_to_latents, num_layers):
    layer = _make(num_layers=num_layers, attend_to_latents=attend_to_latents)
    x, padding = random_normal(rng, (B, M, D)), padding_mask([7, 3], M)
    layer(x, padding_mask=padding)
    randomize_weights(layer, rng)
    actual = checks.to_numpy(layer(x, padding_mask=padding))
    expected = ref.perceiver_resampler(
        x.astype("float64"), to_float64(layer.latents), _params(layer), _norm(layer.output_norm),
        HEADS, padding_mask=padding, attend_to_latents=attend_to_latents)
    assert actual.shape == (B, R, D)
    np.testing.assert_allclose(actual, expected, atol=2e-4, rtol=1e-4)
    assert checks.count_params(layer) == _expected_params(num_layers)


def test_padded_positions_are_ignored_and_length_varies(rng):
    layer = _make(attend_to_latents=True)
    x, padding = random_normal(rng, (B, M, D)), padding_mask([7, 3], M)
    noisy = np.where(padding[..., None], x, 100.0 * random_normal(rng, (B, M, D))).astype("float32")
    np.testing.assert_allclose(checks.to_numpy(layer(noisy, padding_mask=padding)),
                               checks.to_numpy(layer(x, padding_mask=padding)), atol=1e-5)
    # Only the real inputs matter: the first rows alone give the same latents.
    np.testing.assert_allclose(checks.to_numpy(layer(x[:1, :7])),
                               checks.to_numpy(layer(x, padding_mask=padding))[:1], atol=1e-5)
    assert tuple(layer(random_normal(rng, (B, 12, D))).shape) == (B, R, D)


@pytest.mark.parametrize("attend_to_latents", [False, True])
def test_fully_padded_inputs_are_finite(rng, attend_to_latents):
    layer = _make(attend_to_latents=attend_to_latents)
    out = checks.to_numpy(layer(random_normal(rng, (B, M, D)), padding_mask=np.zeros((B, M), bool)))
    assert np.all(np.isfinite(out))
    # Nothing to read: every example gets the same latents.
    np.testing.assert_allclose(out[0], out[1], atol=1e-6)


def test_config_fit_and_saving(rng, tmp_path):
    layer = _make(attend_to_latents=True, dropout=0.1, activation="swiglu")
    checks.check_config_round_trip(layer)
    x, padding = random_normal(rng, (B, M, D)), padding_mask([7, 3], M)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding})
    checks.check_config_round_trip(layer)
    checks.check_fit_step(model, [x, padding])
    checks.check_saving(model, [x, padding], tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    padding = padding_mask([7, 0], M)
    out = checks.check_mixed_precision(
        lambda **kw: _make(attend_to_latents=True, **kw), [random_normal(rng, (B, M, D))],
        {"padding_mask": padding}, policy=policy)
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    layer = _make(dtype=policy)
    assert np.all(np.isfinite(checks.to_numpy(
        keras.ops.cast(layer(random_normal(rng, (B, M, D)), padding_mask=padding), "float32"))))


@checks.xla_only
def test_jit_compile(rng):
    x, padding = random_normal(rng, (B, M, D)), padding_mask([7, 3], M)
    model = checks.wrap_in_model(_make(), [x], {"padding_mask": padding})
    checks.check_jit_compile(model, [x, padding])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"num_latents": 0}, "num_latents=0"),
        ({"num_heads": -1}, "num_heads=-1"),
        ({"intermediate_dim": 2.5}, "intermediate_dim=2.5"),
        ({"num_layers": 0}, "num_layers=0"),
        ({"attend_to_latents": "yes"}, "attend_to_latents='yes'"),
        ({"activation": "tanh"}, "activation='tanh'"),
        ({"dropout": 1.0}, "dropout=1.0"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _make(**kwargs)


def test_bad_inputs_raise(rng):
    with pytest.raises(ValueError, match="rank 3"):
        _make()(rng.normal(size=(B, D)).astype("float32"))
    with pytest.raises(ValueError, match="num_heads=3, hidden_dim=16"):
        _make(num_heads=3)(random_normal(rng, (B, M, D)))
    layer = _make()
    layer(random_normal(rng, (B, M, D)))
    with pytest.raises(ValueError, match=r"Received: inputs.shape=\(2, 10, 8\)"):
        layer(rng.normal(size=(B, M, 8)).astype("float32"))
