"""Residual: post-norm `LNorm(F(H) + H)` and pre-norm `F(LNorm(H)) + H` (survey §2.4)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import GatedCrossAttentionBlock
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Residual
from keras_xf.layers import TransformerBlock
from tests.layer_checks import attention_weights
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import attention as ref_attention
from tests.reference import layers as ref

WIDTH, HIDDEN = 8, 16
EPSILON = 1e-5

# Survey §2.4 worked example: m = 4 hidden states of d = 3 dimensions, α = 1, β = 0, ε = 0.1.
SURVEY_H = np.array([[1.0, 1.0, 2.0], [0.9, 0.9, 0.0], [0.7, 0.8, 0.0], [3.0, 1.0, 7.0]])
SURVEY_MU = np.array([1.3, 0.6, 0.5, 3.7])
SURVEY_SIGMA = np.array([0.5, 0.4, 0.4, 2.5])


def make_inputs(rng, width=WIDTH):
    return [rng.normal(size=(2, 5, width)).astype("float32")]


def make_layer(norm_placement="post", normalization="layer_norm", dropout=0.0, dtype=None):
    ffn = FeedForward(HIDDEN, bias_initializer="random_normal", dtype=dtype)
    return Residual(
        ffn,
        norm_placement=norm_placement,
        normalization=normalization,
        dropout=dropout,
        epsilon=EPSILON,
        dtype=dtype,
    )


def randomize_norm(layer, rng):
    """Gives the normalisation non-trivial scale (and shift) so that the oracle checks them."""
    for weight in layer.norm.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))


def numpy_norm(layer):
    norm = layer.norm
    if layer.normalization == "layer_norm":
        gamma, beta = (to_numpy(w).astype("float64") for w in (norm.gamma, norm.beta))
        return lambda h: ref.layer_norm(h, gamma, beta, epsilon=EPSILON)
    scale = to_numpy(norm.scale).astype("float64")
    return lambda h: ref.rms_norm(h, scale, epsilon=EPSILON)


def numpy_ffn(ffn):
    params = [
        to_numpy(w).astype("float64")
        for w in (
            ffn.hidden_dense.kernel,
            ffn.hidden_dense.bias,
            ffn.output_dense.kernel,
            ffn.output_dense.bias,
        )
    ]
    return lambda h: ref.ffn(h, *params, activation=ref.relu)


# --- The layer normalisation of survey §2.4 -------------------------------------------------


def test_survey_layer_norm_worked_example():
    """The oracle reproduces the survey's table: μ, σ (printed to one decimal) and
    `(h − μ) / (σ + ε)`."""
    mu = SURVEY_H.mean(axis=-1)
    sigma = SURVEY_H.std(axis=-1)
    np.testing.assert_allclose(np.round(mu, 1), SURVEY_MU)
    np.testing.assert_allclose(np.round(sigma, 1), SURVEY_SIGMA)

    out = ref.layer_norm_survey(SURVEY_H, epsilon=0.1)
    # Exact arithmetic with the unrounded statistics.
    exact = (SURVEY_H - mu[:, None]) / (sigma[:, None] + 0.1)
    np.testing.assert_allclose(out, exact, rtol=1e-12)
    # The survey's matrix, written with the rounded statistics, agrees to the rounding error.
    printed = (SURVEY_H - SURVEY_MU[:, None]) / (SURVEY_SIGMA[:, None] + 0.1)
    np.testing.assert_allclose(out, printed, atol=0.1)
    # A few entries computed by hand: h_4 = (3, 1, 7), μ = 11/3, σ = √(56/9).
    sigma_4 = np.sqrt(56.0 / 9.0)
    np.testing.assert_allclose(out[3], (np.array([3, 1, 7]) - 11 / 3) / (sigma_4 + 0.1))
    # Each row is centred; with ε > 0 its spread is shrunk below 1.
    np.testing.assert_allclose(out.mean(axis=-1), 0.0, atol=1e-12)
    assert np.all(out.std(axis=-1) < 1.0)


def test_survey_form_differs_from_epsilon_inside_the_root():
    """Keras (and `reference.layer_norm`) put ε inside the root: `(h − μ) / √(σ² + ε)`."""
    survey = ref.layer_norm_survey(SURVEY_H, epsilon=0.1)
    keras_form = ref.layer_norm(SURVEY_H, epsilon=0.1)
    assert not np.allclose(survey, keras_form, atol=1e-2)
    # With a negligible ε the two forms coincide.
    np.testing.assert_allclose(
        ref.layer_norm_survey(SURVEY_H, 1e-12), ref.layer_norm(SURVEY_H, epsilon=1e-24), atol=1e-9
    )


def test_keras_layer_normalization_matches_reference(rng):
    h = SURVEY_H.astype("float32")[None]
    norm = keras.layers.LayerNormalization(epsilon=0.1)
    expected = ref.layer_norm(SURVEY_H, epsilon=0.1)
    np.testing.assert_allclose(to_numpy(norm(h))[0], expected, atol=1e-6)

    x = rng.normal(size=(2, 5, WIDTH)).astype("float32")
    norm = keras.layers.LayerNormalization(epsilon=EPSILON)
    norm.build(x.shape)
    gamma = rng.normal(size=WIDTH).astype("float32")
    beta = rng.normal(size=WIDTH).astype("float32")
    norm.gamma.assign(gamma)
    norm.beta.assign(beta)
    expected = ref.layer_norm(x.astype("float64"), gamma, beta, epsilon=EPSILON)
    np.testing.assert_allclose(to_numpy(norm(x)), expected, atol=2e-5)


def test_keras_rms_normalization_matches_reference(rng):
    x = rng.normal(size=(2, 5, WIDTH)).astype("float32")
    norm = keras.layers.RMSNormalization(epsilon=EPSILON)
    norm.build(x.shape)
    scale = rng.normal(size=WIDTH).astype("float32")
    norm.scale.assign(scale)
    expected = ref.rms_norm(x.astype("float64"), scale, epsilon=EPSILON)
    np.testing.assert_allclose(to_numpy(norm(x)), expected, atol=2e-5)


# --- Behaviour ---------------------------------------------------------------------------------


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
def test_build(normalization):
    layer = make_layer(normalization=normalization)
    layer.build((2, 5, WIDTH))
    assert layer.built and layer.layer.built and layer.norm.built
    expected = (
        keras.layers.LayerNormalization
        if normalization == "layer_norm"
        else keras.layers.RMSNormalization
    )
    assert isinstance(layer.norm, expected)
    assert layer.norm.epsilon == EPSILON
    assert tuple(layer.compute_output_shape((2, 5, WIDTH))) == (2, 5, WIDTH)


def test_config_round_trip():
    layer = make_layer(norm_placement="pre", normalization="rms_norm", dropout=0.2)
    clone = check_config_round_trip(layer)
    assert isinstance(clone.layer, FeedForward)
    assert clone.layer.hidden_dim == HIDDEN
    assert (clone.norm_placement, clone.normalization, clone.dropout) == ("pre", "rms_norm", 0.2)
    assert isinstance(clone.norm, keras.layers.RMSNormalization)


@pytest.mark.parametrize(
    "normalization, norm_params", [("layer_norm", 2 * WIDTH), ("rms_norm", WIDTH)]
)
def test_weight_count(normalization, norm_params):
    layer = make_layer(normalization=normalization)
    layer.build((2, 5, WIDTH))
    ffn_params = 2 * WIDTH * HIDDEN + WIDTH + HIDDEN
    assert count_params(layer) == ffn_params + norm_params


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_fit_step(rng, norm_placement):
    inputs = make_inputs(rng)
    model = wrap_in_model(make_layer(norm_placement=norm_placement, dropout=0.1), inputs)
    check_fit_step(model, inputs)


def test_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    layer = make_layer(norm_placement="pre", normalization="rms_norm")
    model = wrap_in_model(layer, inputs)
    randomize_norm(layer, rng)
    loaded = check_saving(model, inputs, tmp_path)
    assert isinstance(loaded.layers[-1], Residual)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_mixed_precision(rng, policy, norm_placement):
    outputs = check_mixed_precision(
        lambda dtype: make_layer(norm_placement=norm_placement, dtype=dtype),
        make_inputs(rng),
        policy=policy,
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_layer(norm_placement="pre"), inputs), inputs)


# --- Correctness against the numpy oracle ----------------------------------------------------


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_matches_reference(rng, norm_placement, normalization):
    layer = make_layer(norm_placement=norm_placement, normalization=normalization)
    (x,) = make_inputs(rng)
    layer.build(x.shape)
    randomize_norm(layer, rng)
    placement = ref.post_norm if norm_placement == "post" else ref.pre_norm
    expected = placement(numpy_ffn(layer.layer), x.astype("float64"), numpy_norm(layer))
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=5e-5, rtol=1e-5)


def test_post_and_pre_norm_differ(rng):
    (x,) = make_inputs(rng)
    post = make_layer("post")
    pre = make_layer("pre")
    post.build(x.shape)
    pre.build(x.shape)
    for a, b in zip(post.weights, pre.weights):
        b.assign(a)
    y_post, y_pre = to_numpy(post(x)), to_numpy(pre(x))
    assert not np.allclose(y_post, y_pre, atol=1e-3)
    # Post-norm outputs are normalised (α = 1, β = 0); pre-norm keeps the identity path.
    np.testing.assert_allclose(y_post.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y_post.std(-1), 1.0, atol=1e-3)
    ffn_of_norm = numpy_ffn(pre.layer)(ref.layer_norm(x.astype("float64"), epsilon=EPSILON))
    np.testing.assert_allclose(y_pre - x, ffn_of_norm, atol=5e-5)


def test_residual_dropout(rng):
    layer = make_layer(dropout=0.5, norm_placement="pre")
    (x,) = make_inputs(rng)
    inference = to_numpy(layer(x, training=False))
    expected = ref.pre_norm(
        numpy_ffn(layer.layer), x.astype("float64"), numpy_norm(layer)
    )
    np.testing.assert_allclose(inference, expected, atol=5e-5, rtol=1e-5)
    trained = to_numpy(layer(x, training=True))
    assert not np.allclose(trained, inference)
    # Dropout acts on F's output only: where a unit is dropped, the output is the input itself.
    dropped = np.isclose(trained, x, atol=1e-6)
    assert 0.2 < dropped.mean() < 0.8


def test_cross_attention_context_and_mask_are_passed(rng):
    """`context` and `padding_mask` reach `F`: post-norm cross-attention equals the oracle.

    The context has its own width (d_kv = 4 ≠ d = 8): `F` is built with the context's shape.
    """
    mha = MultiHeadAttention(2, bias_initializer="random_normal")
    layer = Residual(mha, epsilon=EPSILON)
    (x,) = make_inputs(rng)
    context = rng.normal(size=(2, 6, 4)).astype("float32")
    padding = np.ones((2, 6), bool)
    padding[1, 4:] = False
    layer.build(x.shape, context.shape)
    for weight in layer.weights:  # independent values for each projection and the norm
        weight.assign(rng.normal(scale=0.5, size=weight.shape).astype("float32"))
    y = to_numpy(layer(x, context, padding_mask=padding))
    f = lambda h: ref_attention.multi_head_attention(  # noqa: E731
        h, context.astype("float64"), attention_weights(mha), 2, mask=padding[:, None, None, :]
    )[0]
    expected = ref.post_norm(f, x.astype("float64"), numpy_norm(layer))
    np.testing.assert_allclose(y, expected, atol=5e-5, rtol=1e-5)


def test_tuple_output_is_passed_through(rng):
    """When `F` returns `(outputs, cache)`, the residual applies to `outputs` only."""
    mha = MultiHeadAttention(2, causal=True)
    layer = Residual(mha, norm_placement="pre", epsilon=EPSILON)
    (x,) = make_inputs(rng)
    full = to_numpy(layer(x))
    cache = mha.init_cache(2, x.shape[1])
    outputs, new_cache = layer(x, cache=cache, cache_index=0)
    assert [tuple(p.shape) for p in new_cache] == [tuple(p.shape) for p in cache]
    np.testing.assert_allclose(to_numpy(outputs), full, atol=1e-5)
    assert np.abs(to_numpy(new_cache)).sum() > 0


# --- Validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"norm_placement": "sandwich"}, r"norm_placement='sandwich'"),
        ({"normalization": "batch_norm"}, r"normalization='batch_norm'"),
        ({"dropout": -0.5}, r"dropout=-0\.5"),
    ],
)
def test_invalid_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_layer(**kwargs)


@pytest.mark.parametrize("epsilon", [-1, 0, float("nan"), float("inf"), "x", None])
@pytest.mark.parametrize("make", ["residual", "block"])
def test_bad_epsilon_raises_naming_it(make, epsilon):
    """A negative epsilon used to give NaN outputs; now every bad value names `epsilon`."""
    with pytest.raises(ValueError, match=r"epsilon must be a positive number. Received: epsilon="):
        if make == "residual":
            Residual(FeedForward(8), epsilon=epsilon)
        else:
            TransformerBlock(MultiHeadAttention(2), FeedForward(8), epsilon=epsilon)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, "x", None])
def test_bad_dropout_raises_naming_it(dropout):
    with pytest.raises(ValueError, match=r"dropout must be a number in \[0, 1\). Received: dropout="):
        Residual(FeedForward(8), dropout=dropout)


def test_bad_gate_initializer_raises_naming_it():
    block = TransformerBlock(MultiHeadAttention(2), FeedForward(8))
    with pytest.raises(ValueError, match="gate_initializer must be a Keras initializer"):
        GatedCrossAttentionBlock(block, MultiHeadAttention(2), gate_initializer="not_one")
