"""ops.linear_attention: the feature maps, the causal key convolution and the normalised
linear attention, against the numpy recurrences of `tests/reference/linear_attention.py`
(survey §5.3.2, §5.5.2)."""

import keras
import numpy as np
import pytest

from keras_xf.ops.linear_attention import FEATURE_MAPS
from keras_xf.ops.linear_attention import causal_key_convolution
from keras_xf.ops.linear_attention import feature_map_of
from keras_xf.ops.linear_attention import feature_size
from keras_xf.ops.linear_attention import normalized_linear_attention
from tests.layer_checks import to_float64
from tests.reference import linear_attention as ref

B, T, H, DH = 2, 7, 2, 4


def _tensor(x):
    return keras.ops.convert_to_tensor(np.asarray(x, "float32"))


@pytest.mark.parametrize("kind", ["elu", "relu", "identity", "random_features"])
def test_feature_maps_match_the_reference(rng, kind):
    x = rng.normal(size=(B, T, H, DH))
    projection = rng.normal(size=(DH, 6)) if kind == "random_features" else None
    features = feature_map_of(_tensor(x), kind,
                              None if projection is None else _tensor(projection))
    assert features.shape[-1] == feature_size(kind, DH, None if projection is None else 6)
    np.testing.assert_allclose(to_float64(features), ref.feature_map(x, kind, projection),
                               rtol=1e-4, atol=1e-5)


def test_stabilized_random_features_differ_by_a_factor_per_row(rng):
    """Subtracting each row's largest exponent scales the row: `q′μ / q′ν` is unchanged."""
    x, projection = _tensor(rng.normal(size=(B, T, H, DH))), _tensor(rng.normal(size=(DH, 6)))
    plain = to_float64(feature_map_of(x, "random_features", projection))
    stable = to_float64(feature_map_of(x, "random_features", projection, stabilize=True))
    ratio = plain / stable
    np.testing.assert_allclose(ratio, ratio[..., :1] * np.ones_like(ratio), rtol=1e-4)
    assert stable.max(axis=-1).max() <= 1.0 / np.sqrt(6) + 1e-6


def test_taylor_features_give_the_second_order_expansion_of_exp(rng):
    """`φ(q)·φ(k) = 1 + s + s²/2` with `s = q·k/√d_h` (the Taylor kernel of Based), with
    the `d_h(d_h+1)/2` distinct products `x_i x_j`, `i ≤ j`."""
    q, k = rng.normal(size=(2, B, T, H, DH)).astype("float32")
    features = [to_float64(feature_map_of(_tensor(t), "taylor")) for t in (q, k)]
    assert features[0].shape[-1] == feature_size("taylor", DH) == 1 + DH + DH * (DH + 1) // 2
    s = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(DH)
    kernel = np.einsum("bthm,bshm->bhts", *features)
    np.testing.assert_allclose(kernel, 1 + s + s * s / 2, rtol=1e-4, atol=1e-4)


def test_random_features_approximate_softmax_attention(rng):
    """With many features, `D⁻¹Q′(K′ᵀV)` approaches `Softmax(QKᵀ/√d_h)V` (Performer)."""
    q, k, v = (0.5 * rng.normal(size=(B, T, H, DH)) for _ in range(3))
    projection = _tensor(rng.normal(size=(DH, 4096)))
    qf = to_float64(feature_map_of(_tensor(q), "random_features", projection, stabilize=True))
    kf = to_float64(feature_map_of(_tensor(k), "random_features", projection))
    mixed = ref.linear_attention(qf, kf, v, causal=False)[0]
    exact = ref.softmax_attention(q, k, v)
    assert np.abs(mixed - exact).mean() < 0.05 * np.abs(exact).mean() + 1e-3


@pytest.mark.parametrize("with_window", [False, True])
def test_causal_key_convolution_matches_the_loop(rng, with_window):
    keys = rng.normal(size=(B, T, H, DH))
    kernel = rng.normal(size=(3, H, DH))
    window = rng.normal(size=(B, 2, H, DH)) if with_window else None
    mixed, last = causal_key_convolution(_tensor(keys), _tensor(kernel),
                                         None if window is None else _tensor(window))
    expected, expected_last = ref.key_convolution(keys, kernel, window=window)
    np.testing.assert_allclose(to_float64(mixed), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(to_float64(last), expected_last, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal,decayed,normalize", [
    (False, False, True), (True, False, True), (True, True, True), (True, True, False),
])
def test_normalized_linear_attention_matches_the_recurrence(rng, causal, decayed, normalize):
    """Chunks of 3 over 7 positions: two full chunks and a padded one; the causal sums continue
    from a given state and end at the reference's."""
    qf, kf = (np.abs(rng.normal(size=(B, T, H, 5))) for _ in range(2))
    v = rng.normal(size=(B, T, H, DH))
    decay = rng.uniform(0.5, 0.95, size=(B, T, H)) if decayed else None
    state = None
    if causal:
        state = (rng.normal(size=(B, H, 5, DH)), np.abs(rng.normal(size=(B, H, 5))))
    outputs, sums = normalized_linear_attention(
        _tensor(qf), _tensor(kf), _tensor(v), causal,
        log_decay=None if decay is None else _tensor(np.log(decay)),
        scale=None if decay is None else _tensor(1 - decay),
        state=None if state is None else tuple(_tensor(s) for s in state),
        normalize=normalize, chunk_size=3,
    )
    expected, (mu, nu) = ref.linear_attention(qf, kf, v, causal, decay=decay,
                                              normalize=normalize, state=state)
    np.testing.assert_allclose(to_float64(outputs), expected, rtol=1e-4, atol=1e-4)
    if causal:
        np.testing.assert_allclose(to_float64(sums[0]), mu, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(to_float64(sums[1]), nu, rtol=1e-4, atol=1e-4)
    else:
        assert sums is None


def test_every_feature_map_has_a_size():
    for kind in FEATURE_MAPS:
        assert feature_size(kind, DH, 12) == {"taylor": 1 + DH + DH * (DH + 1) // 2,
                                              "random_features": 12}.get(kind, DH)
