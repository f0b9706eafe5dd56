"""RungeKuttaResidual: `z + Σ γ_i g_i`, `g_i = h f(z + Σ β_ij g_j)` (survey §4.3)."""

import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Residual
from keras_xf.layers import RungeKuttaResidual
from tests.layer_checks import attention_weights
from tests.layer_checks import check_cached_decoding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import attention as ref_attention
from tests.reference import layers as ref
from tests.reference import numerical_blocks as ref_rk

WIDTH, HIDDEN = 8, 16
STAGES = {"euler": 1, "rk2": 2, "rk2_midpoint": 2, "rk4": 4}


def make_inputs(rng):
    return [rng.normal(size=(2, 5, WIDTH)).astype("float32")]


def make_layer(dtype=None, **kwargs):
    return RungeKuttaResidual(FeedForward(HIDDEN, dtype=dtype), dtype=dtype, **kwargs)


def numpy_ffn(ffn):
    params = [to_float64(w) for w in (ffn.hidden_dense.kernel, ffn.hidden_dense.bias,
                                      ffn.output_dense.kernel, ffn.output_dense.bias)]
    return lambda h: ref.ffn(h, *params, activation=ref.relu)


def numpy_norm(norm):
    gamma, beta = to_float64(norm.gamma), to_float64(norm.beta)
    return lambda h: ref.layer_norm(h, gamma, beta)


def numpy_stages(layer):
    """`f_i` of every stage as numpy functions (`F∘LNorm` or `LNorm∘F`)."""
    functions = []
    for index in range(layer.num_stages):
        sub, norm = layer._stage(index)
        f, n = numpy_ffn(sub), numpy_norm(norm)
        if layer.stage_norm == "input":
            functions.append(lambda h, f=f, n=n: f(n(h)))
        else:
            functions.append(lambda h, f=f, n=n: n(f(h)))
    return functions


@pytest.mark.parametrize("method", sorted(STAGES))
@pytest.mark.parametrize("share_weights", [True, False])
@pytest.mark.parametrize("stage_norm", ["input", "output"])
def test_matches_numpy_reference(rng, method, share_weights, stage_norm):
    (x,) = make_inputs(rng)
    layer = make_layer(method=method, share_weights=share_weights, stage_norm=stage_norm,
                       step_size=0.7)
    layer.build(x.shape)
    randomize_weights(layer, rng)
    expected = ref_rk.runge_kutta_step(x.astype("float64"), numpy_stages(layer), method, h=0.7)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-5, rtol=1e-5)


def test_stages_of_unshared_weights_differ(rng):
    (x,) = make_inputs(rng)
    layer = make_layer(method="rk4", share_weights=False)
    layer.build(x.shape)
    kernels = [to_numpy(sub.hidden_dense.kernel) for sub in layer.stage_layers]
    assert len(kernels) == 4
    assert not np.allclose(kernels[0], kernels[1])


@pytest.mark.parametrize("method", sorted(STAGES))
def test_weight_count(rng, method):
    """Shared stages add no parameter to the plain residual; unshared ones one `F` and one
    norm per stage."""
    (x,) = make_inputs(rng)
    plain = Residual(FeedForward(HIDDEN), norm_placement="pre")
    plain.build(x.shape)
    shared = make_layer(method=method)
    shared.build(x.shape)
    unshared = make_layer(method=method, share_weights=False)
    unshared.build(x.shape)
    learned = make_layer(method=method, learned_coefficients=True)
    learned.build(x.shape)
    assert count_params(shared) == count_params(plain)
    assert count_params(unshared) == STAGES[method] * count_params(plain)
    assert count_params(learned) == count_params(plain) + STAGES[method]


def test_euler_is_the_pre_norm_residual(rng):
    (x,) = make_inputs(rng)
    plain = Residual(FeedForward(HIDDEN), norm_placement="pre")
    euler = make_layer(method="euler")
    plain.build(x.shape)
    euler.build(x.shape)
    randomize_weights(plain, rng)
    euler.set_weights(plain.get_weights())
    np.testing.assert_allclose(to_numpy(euler(x)), to_numpy(plain(x)), atol=1e-6)


def test_learned_coefficients(rng):
    (x,) = make_inputs(rng)
    layer = make_layer(method="rk4", learned_coefficients=True)
    layer.build(x.shape)
    np.testing.assert_allclose(to_numpy(layer.coefficients), [1 / 6, 1 / 3, 1 / 3, 1 / 6],
                               rtol=1e-6)
    randomize_weights(layer, rng)
    gammas = to_float64(layer.coefficients)
    expected = ref_rk.runge_kutta_step(x.astype("float64"), numpy_stages(layer), "rk4",
                                       gammas=gammas)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-5, rtol=1e-5)


def test_attention_stages_match_reference(rng):
    """With attention as `F`, every stage attends over its own inputs `z + Σ β g`."""
    x = rng.normal(size=(2, 5, WIDTH)).astype("float32")
    layer = RungeKuttaResidual(MultiHeadAttention(2), method="rk2_midpoint")
    layer(x, use_causal_mask=True)
    randomize_weights(layer, rng)
    weights = attention_weights(layer.layer)
    mask = ref_attention.causal_mask(5)
    norm = numpy_norm(layer.norms[0])

    def f(h):
        h = norm(h)
        return ref_attention.multi_head_attention(h, h, weights, 2, mask=mask)[0]

    expected = ref_rk.runge_kutta_step(x.astype("float64"), [f, f], "rk2_midpoint")
    np.testing.assert_allclose(to_numpy(layer(x, use_causal_mask=True)), expected,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share_weights", [True, False])
def test_cached_decoding_keeps_one_cache_per_stage(rng, share_weights):
    x = rng.normal(size=(2, 6, WIDTH)).astype("float32")
    layer = RungeKuttaResidual(MultiHeadAttention(2), method="rk4", share_weights=share_weights)
    layer(x, use_causal_mask=True)
    randomize_weights(layer, rng)
    cache = layer.init_cache(2, 6)
    assert len(cache) == 4
    check_cached_decoding(layer, x, prefill=2)


def test_wrong_cache_length_raises(rng):
    x = rng.normal(size=(2, 3, WIDTH)).astype("float32")
    layer = RungeKuttaResidual(MultiHeadAttention(2), method="rk4")
    layer(x)
    with pytest.raises(ValueError, match="one entry per stage"):
        layer(x, cache=layer.init_cache(2, 3)[:2], cache_index=0)


def test_attention_scores_of_the_first_stage(rng):
    x = rng.normal(size=(2, 4, WIDTH)).astype("float32")
    layer = RungeKuttaResidual(MultiHeadAttention(2), method="rk2")
    results = layer(x, return_attention_scores=True)
    assert set(results) == {"outputs", "attention_scores"}
    scores = layer.layer(layer.norms[0](x), return_attention_scores=True)["attention_scores"]
    np.testing.assert_allclose(to_numpy(results["attention_scores"]), to_numpy(scores),
                               atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"method": "rk3"}, "method"),
        ({"stage_norm": "middle"}, "stage_norm"),
        ({"share_weights": 1}, "share_weights"),
        ({"learned_coefficients": "yes"}, "learned_coefficients"),
        ({"step_size": 0.0}, "step_size"),
        ({"normalization": "batch_norm"}, "normalization"),
        ({"dropout": 1.5}, "dropout"),
    ],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_layer(**kwargs)


def test_config_round_trip():
    check_config_round_trip(make_layer(method="rk4", share_weights=False,
                                       learned_coefficients=True, stage_norm="output",
                                       step_size=0.5))


def test_fit_and_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    model = wrap_in_model(make_layer(method="rk4", share_weights=False,
                                     learned_coefficients=True), inputs)
    check_fit_step(model, inputs)
    check_saving(model, inputs, tmp_path)


def test_mixed_bfloat16(rng):
    check_mixed_precision(lambda dtype: make_layer(method="rk4", learned_coefficients=True,
                                                   dtype=dtype),
                          make_inputs(rng), policy="mixed_bfloat16")


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_layer(method="rk4"), inputs), inputs)
