"""Residual's deep-model forms (survey §4.2.1): the weighted `LNorm(F(z) + β·z) + γ·z`
(post-norm and DeepNorm as cases), the sandwich norm `"pre_and_post"` and ReZero."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Residual
from keras_xf.layers import TransformerBlock
from keras_xf.layers import deep_norm
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.reference import deep_models as ref_deep
from tests.reference import layers as ref

WIDTH, HIDDEN = 8, 16
EPSILON = 1e-5
FORMS = {
    "weighted": {"norm_placement": "weighted", "inner_weight": 0.7, "outer_weight": 0.4},
    "learned": {"norm_placement": "weighted", "inner_weight": 0.7, "outer_weight": 0.4,
                "learned_weights": True},
    "pre_and_post": {"norm_placement": "pre_and_post"},
    "rezero": {"norm_placement": "rezero"},
}


def make_inputs(rng):
    return [rng.normal(size=(2, 5, WIDTH)).astype("float32")]


def make_layer(dtype=None, dropout=0.0, normalization="layer_norm", **form):
    ffn = FeedForward(HIDDEN, bias_initializer="random_normal", dtype=dtype)
    return Residual(ffn, normalization=normalization, dropout=dropout, epsilon=EPSILON,
                    dtype=dtype, **form)


def numpy_ffn(ffn):
    params = [to_float64(w) for w in (ffn.hidden_dense.kernel, ffn.hidden_dense.bias,
                                      ffn.output_dense.kernel, ffn.output_dense.bias)]
    return lambda h: ref.ffn(h, *params, activation=ref.relu)


def numpy_norm(norm):
    if isinstance(norm, keras.layers.LayerNormalization):
        return lambda h: ref.layer_norm(h, to_float64(norm.gamma), to_float64(norm.beta),
                                        epsilon=EPSILON)
    return lambda h: ref.rms_norm(h, to_float64(norm.scale), epsilon=EPSILON)


def randomize(layer, rng):
    """Non-trivial norm scales and shifts, and a non-zero ReZero α."""
    for weight in layer.weights:
        if "norm" in weight.path or weight.shape == ():
            weight.assign(rng.normal(size=weight.shape).astype("float32"))


# --- Correctness against the numpy oracle ----------------------------------------------------


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("learned", [False, True])
def test_weighted_matches_general_equation(rng, learned, normalization):
    layer = make_layer(norm_placement="weighted", inner_weight=0.7, outer_weight=0.4,
                       learned_weights=learned, normalization=normalization)
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize(layer, rng)
    beta, gamma = 0.7, 0.4
    if learned:
        beta, gamma = float(to_numpy(layer.inner_scale)), float(to_numpy(layer.outer_scale))
        assert (beta, gamma) != (0.7, 0.4)  # randomised: the layer must read its variables
    expected = ref_deep.general_residual(numpy_ffn(layer.layer), x.astype("float64"),
                                         numpy_norm(layer.norm), beta, gamma)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=5e-5, rtol=1e-5)


def test_weighted_one_zero_is_post_norm_exactly(rng):
    """β = 1, γ = 0 is post-norm `LNorm(F(z) + z)` (survey §4.2.1), to the bit."""
    (x,) = make_inputs(rng)
    post = make_layer(norm_placement="post")
    weighted = make_layer(norm_placement="weighted", inner_weight=1.0, outer_weight=0.0)
    post.build(x.shape)
    weighted.build(x.shape)
    randomize(post, rng)
    for a, b in zip(post.weights, weighted.weights):
        b.assign(a)
    np.testing.assert_array_equal(to_numpy(weighted(x)), to_numpy(post(x)))


def test_weighted_zero_one_keeps_the_identity_outside_the_norm(rng):
    """β = 0, γ = 1 gives `LNorm(F(z)) + z`: the identity path bypasses the norm as in
    pre-norm, but the norm acts on `F`'s output, so it differs from `"pre"`."""
    (x,) = make_inputs(rng)
    layer = make_layer(norm_placement="weighted", inner_weight=0.0, outer_weight=1.0)
    pre = make_layer(norm_placement="pre")
    layer.build(x.shape)
    pre.build(x.shape)
    randomize(layer, rng)
    for a, b in zip(layer.weights, pre.weights):
        b.assign(a)
    y = to_numpy(layer(x)).astype("float64")
    f, norm = numpy_ffn(layer.layer), numpy_norm(layer.norm)
    np.testing.assert_allclose(y, norm(f(x.astype("float64"))) + x, atol=5e-5, rtol=1e-5)
    assert not np.allclose(y, to_numpy(pre(x)), atol=1e-3)


def test_deep_norm_residual_matches_reference(rng):
    constants = deep_norm(decoder_layers=12)["decoder"]
    layer = make_layer(**constants.residual_arguments())
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize(layer, rng)
    alpha = ref_deep.deep_norm_constants(0, 12)["decoder"][0]
    expected = ref_deep.deep_norm_residual(numpy_ffn(layer.layer), x.astype("float64"),
                                           numpy_norm(layer.norm), alpha)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
def test_sandwich_matches_reference(rng, normalization):
    layer = make_layer(norm_placement="pre_and_post", normalization=normalization)
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize(layer, rng)
    expected = ref_deep.sandwich_residual(numpy_ffn(layer.layer), x.astype("float64"),
                                          numpy_norm(layer.norm), numpy_norm(layer.output_norm))
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=5e-5, rtol=1e-5)


def test_rezero_starts_as_identity_and_matches_reference(rng):
    layer = make_layer(norm_placement="rezero")
    (x,) = make_inputs(rng)
    np.testing.assert_array_equal(to_numpy(layer(x)), x)
    assert float(to_numpy(layer.rezero_scale)) == 0.0 and layer.norm is None
    layer.rezero_scale.assign(0.3)
    expected = ref_deep.rezero_residual(numpy_ffn(layer.layer), x.astype("float64"), 0.3)
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=5e-5, rtol=1e-5)


def test_rezero_weight_gets_a_gradient_at_zero(rng):
    """α = 0 makes `F`'s weights receive no gradient at first, but α itself does: one SGD
    step moves α off zero."""
    inputs = make_inputs(rng)
    layer = make_layer(norm_placement="rezero")
    model = wrap_in_model(layer, inputs)
    check_fit_step(model, inputs)
    assert float(to_numpy(layer.rezero_scale)) != 0.0


def test_residual_dropout_acts_on_the_branch(rng):
    layer = make_layer(dropout=0.5, norm_placement="rezero")
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    layer.rezero_scale.assign(1.0)
    trained = to_numpy(layer(x, training=True))
    dropped = np.isclose(trained, x, atol=1e-6)
    assert 0.2 < dropped.mean() < 0.8


# --- Behaviour -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form, extra",
    [("weighted", 0), ("learned", 2), ("pre_and_post", 2 * WIDTH), ("rezero", 1 - 2 * WIDTH)],
)
def test_weight_count(form, extra):
    layer = make_layer(**FORMS[form])
    layer.build((2, 5, WIDTH))
    ffn_params = 2 * WIDTH * HIDDEN + WIDTH + HIDDEN
    assert count_params(layer) == ffn_params + 2 * WIDTH + extra


@pytest.mark.parametrize("form", sorted(FORMS))
def test_config_round_trip(form):
    clone = check_config_round_trip(make_layer(**FORMS[form]))
    for key, value in FORMS[form].items():
        assert getattr(clone, key) == value


@pytest.mark.parametrize("form", sorted(FORMS))
def test_fit_step(rng, form):
    inputs = make_inputs(rng)
    check_fit_step(wrap_in_model(make_layer(dropout=0.1, **FORMS[form]), inputs), inputs)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_saving(rng, tmp_path, form):
    inputs = make_inputs(rng)
    layer = make_layer(**FORMS[form])
    model = wrap_in_model(layer, inputs)
    randomize(layer, rng)
    check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_mixed_bfloat16(rng, form):
    outputs = check_mixed_precision(lambda dtype: make_layer(dtype=dtype, **FORMS[form]),
                                    make_inputs(rng), policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_cache_passes_through(rng, form):
    """With a causal attention `F` and a cache, each form returns `(outputs, cache)` whose
    outputs equal the full pass."""
    layer = Residual(MultiHeadAttention(2, causal=True), epsilon=EPSILON, **FORMS[form])
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize(layer, rng)
    full = to_numpy(layer(x))
    outputs, new_cache = layer(x, cache=layer.layer.init_cache(2, x.shape[1]), cache_index=0)
    np.testing.assert_allclose(to_numpy(outputs), full, atol=1e-5)
    assert np.abs(to_numpy(new_cache)).sum() > 0


# --- Validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"norm_placement": "post", "inner_weight": 0.5},
         r"inner_weight is an argument of norm_placement='weighted' only. Received: "
         r"inner_weight=0.5 with norm_placement='post'"),
        ({"norm_placement": "rezero", "outer_weight": 1.0}, r"outer_weight=1.0"),
        ({"norm_placement": "pre", "learned_weights": True}, r"learned_weights=True"),
        ({"norm_placement": "weighted", "inner_weight": float("nan")},
         r"inner_weight must be a finite number. Received: inner_weight=nan"),
        ({"norm_placement": "weighted", "outer_weight": "1"}, r"outer_weight='1'"),
        ({"norm_placement": "weighted", "learned_weights": 1},
         r"learned_weights must be a bool. Received: learned_weights=1"),
        ({"norm_placement": "sandwich"}, r"norm_placement='sandwich'"),
    ],
)
@pytest.mark.parametrize("make", ["residual", "block"])
def test_invalid_arguments_name_them(make, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        if make == "residual":
            make_layer(**kwargs)
        else:
            TransformerBlock(MultiHeadAttention(2), FeedForward(8), **kwargs)
