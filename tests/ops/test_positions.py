import keras
import numpy as np
import pytest

from keras_xf import ops as xops
from tests.layer_checks import to_numpy
from tests.reference import positions as ref


@pytest.mark.parametrize("dim", [1, 2, 5, 8, 16])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_sinusoid_table_matches_reference(dim, base):
    table = xops.sinusoid_table(np.arange(8), dim, base=base)
    assert tuple(table.shape) == (8, dim)
    assert keras.backend.standardize_dtype(table.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(table), ref.sinusoidal(8, dim, base=base), atol=1e-5)


def test_sinusoid_table_is_interleaved_sin_cos():
    # Survey §2.2: PE(j, 2k) = sin(j ω_k), PE(j, 2k+1) = cos(j ω_k); ω_0 = 1 for every base.
    table = to_numpy(xops.sinusoid_table(np.arange(4), 6))
    np.testing.assert_allclose(table[:, 0], np.sin(np.arange(4)), atol=1e-6)
    np.testing.assert_allclose(table[:, 1], np.cos(np.arange(4)), atol=1e-6)
    np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1], atol=1e-6)


def test_sinusoid_table_base_changes_the_frequencies():
    a = to_numpy(xops.sinusoid_table(np.arange(1, 5), 8, base=10000.0))
    b = to_numpy(xops.sinusoid_table(np.arange(1, 5), 8, base=10.0))
    np.testing.assert_allclose(a[:, :2], b[:, :2], atol=1e-6)  # ω_0 = 1 whatever the base
    assert not np.allclose(a[:, 2:], b[:, 2:], atol=1e-3)


def test_sinusoid_table_keeps_leading_shape():
    positions = np.array([[0, 1, 2], [5, 6, 7]], "int32")
    table = to_numpy(xops.sinusoid_table(positions, 6))
    assert table.shape == (2, 3, 6)
    np.testing.assert_allclose(table[1], ref.sinusoidal(3, 6, start=5), atol=1e-5)


def test_sinusoid_inverse_frequencies():
    freqs = to_numpy(xops.sinusoid_inverse_frequencies(8, base=10000.0))
    np.testing.assert_allclose(freqs, 10000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-6)
    assert to_numpy(xops.sinusoid_inverse_frequencies(5)).shape == (3,)


@pytest.mark.parametrize("base", [10000.0, 50.0])
@pytest.mark.parametrize("offset", [1, 3, 7])
def test_sinusoid_table_linear_shift_property(offset, base):
    # Appendix A: PE(i + μ) = PE(i) R(μ), with R(μ) block-diagonal and independent of i.
    dim = 8
    positions = np.arange(12)
    table = to_numpy(xops.sinusoid_table(positions, dim, base=base)).astype("float64")
    shifted = to_numpy(xops.sinusoid_table(positions + offset, dim, base=base))
    rotation = ref.sinusoidal_shift_matrix(offset, dim, base=base)
    np.testing.assert_allclose(table @ rotation, shifted, atol=1e-5)
    # The footnote's form: R(μ) is built from PE(μ) itself.
    pe_mu = to_numpy(xops.sinusoid_table(np.array([offset]), dim, base=base))[0]
    sin, cos = table[:, 0::2], table[:, 1::2]
    np.testing.assert_allclose(sin * pe_mu[1::2] + cos * pe_mu[0::2], shifted[:, 0::2], atol=1e-5)
    np.testing.assert_allclose(cos * pe_mu[1::2] - sin * pe_mu[0::2], shifted[:, 1::2], atol=1e-5)
    # The shift is a true rotation of each pair, so the wrong offset does not fit.
    wrong = ref.sinusoidal_shift_matrix(offset + 1, dim, base=base)
    assert not np.allclose(table @ wrong, shifted, atol=1e-3)


def test_rotary_angles():
    angles = to_numpy(xops.rotary_angles(np.arange(4), 8, base=10000.0, scaling_factor=2.0))
    expected = (np.arange(4) / 2.0)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    assert angles.shape == (4, 4)
    np.testing.assert_allclose(angles, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("base,scaling_factor", [(10000.0, 1.0), (500.0, 1.0), (10000.0, 4.0)])
def test_apply_rotary_matches_reference(rng, base, scaling_factor):
    x = rng.normal(size=(2, 6, 3, 8)).astype("float32")
    positions = np.arange(6)
    out = xops.apply_rotary(x, positions, base=base, scaling_factor=scaling_factor)
    assert tuple(out.shape) == x.shape
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    expected = ref.rotary(x, positions, base=base, scaling_factor=scaling_factor)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)


def test_apply_rotary_per_batch_positions(rng):
    x = rng.normal(size=(2, 4, 2, 6)).astype("float32")
    positions = np.array([[0, 1, 2, 3], [5, 6, 7, 8]], "int32")
    out = to_numpy(xops.apply_rotary(x, positions))
    np.testing.assert_allclose(out, ref.rotary(x, positions), atol=1e-5)
    np.testing.assert_allclose(out[1], ref.rotary(x[1:], np.arange(5, 9))[0], atol=1e-5)


def test_apply_rotary_position_zero_is_identity_and_norm_is_kept(rng):
    x = rng.normal(size=(2, 5, 2, 8)).astype("float32")
    out = to_numpy(xops.apply_rotary(x, np.arange(5)))
    np.testing.assert_allclose(out[:, 0], x[:, 0], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    assert not np.allclose(out[:, 1:], x[:, 1:], atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_apply_rotary_keeps_the_input_dtype(rng, dtype):
    x = keras.ops.cast(rng.normal(size=(2, 4, 2, 8)), dtype)
    out = xops.apply_rotary(x, np.arange(4))
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    expected = ref.rotary(to_numpy(keras.ops.cast(x, "float32")), np.arange(4))
    np.testing.assert_allclose(to_numpy(keras.ops.cast(out, "float32")), expected, atol=0.05)


def test_rotary_scores_depend_only_on_relative_position(rng):
    # RoPE: ⟨R(i) q, R(j) k⟩ = ⟨q, R(j − i) k⟩, a function of i − j only.
    q = rng.normal(size=(1, 1, 1, 8)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 8)).astype("float32")

    def score(i, j):
        rq = to_numpy(xops.apply_rotary(q, np.array([i])))
        rk = to_numpy(xops.apply_rotary(k, np.array([j])))
        return float(np.sum(rq * rk))

    for distance in (0, 1, 3):
        scores = [score(i + distance, i) for i in (0, 2, 5)]
        np.testing.assert_allclose(scores, scores[0], atol=1e-4)
        np.testing.assert_allclose(scores, [score(distance, 0)] * 3, atol=1e-4)
    # …and it does depend on the distance.
    assert abs(score(3, 1) - score(3, 2)) > 1e-3
    assert abs(score(3, 1) - score(1, 3)) > 1e-3


def test_rotary_score_matrix_is_toeplitz(rng):
    q = rng.normal(size=(1, 1, 1, 8)).astype("float32")
    k = rng.normal(size=(1, 1, 1, 8)).astype("float32")
    length = 6
    queries = to_numpy(xops.apply_rotary(np.repeat(q, length, axis=1), np.arange(length)))
    keys = to_numpy(xops.apply_rotary(np.repeat(k, length, axis=1), np.arange(length)))
    scores = np.einsum("bthd,bshd->ts", queries, keys)
    for diagonal in range(-length + 1, length):
        values = np.diagonal(scores, diagonal)
        np.testing.assert_allclose(values, values[0], atol=1e-4)
    assert np.ptp(np.diagonal(scores, 0)) < 1e-4 and abs(scores[0, 0] - scores[0, 1]) > 1e-3
