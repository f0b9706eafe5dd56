"""ops.ssm: HiPPO initialisations, discretisations, the time-invariant model by FFT and the
selective scan, against the numpy recurrences of `tests/reference/state_space.py` (complex128,
one step at a time; survey §5.5.3)."""

import keras
import numpy as np
import pytest

from keras_xf.ops.ssm import DISCRETIZATIONS
from keras_xf.ops.ssm import check_scan_arguments
from keras_xf.ops.ssm import convolution_kernel
from keras_xf.ops.ssm import discretize
from keras_xf.ops.ssm import hippo_diagonal
from keras_xf.ops.ssm import selective_scan
from keras_xf.ops.ssm import step_bias_initializer
from keras_xf.ops.ssm import time_invariant_ssm
from tests import layer_checks as checks
from tests.reference import state_space as reference


def _tensor(x):
    return keras.ops.convert_to_tensor(np.asarray(x, "float32"))


def _pair(z, complex_valued):
    """A complex numpy array as the (real, imaginary or None) pair of the ops."""
    return _tensor(z.real), (_tensor(z.imag) if complex_valued else None)


def _system(rng, width=3, state=4, complex_valued=True):
    """A stable diagonal `A`, `B`, `C` `[d, N]` and steps `Δ` `[d]` in [0.05, 0.5]."""
    a = -rng.uniform(0.2, 1.5, size=(width, state))
    b = rng.normal(size=(width, state))
    c = rng.normal(size=(width, state))
    if complex_valued:
        a = a + 1j * rng.normal(size=(width, state))
        b = b + 1j * rng.normal(size=(width, state))
        c = c + 1j * rng.normal(size=(width, state))
    return a, b, c, rng.uniform(0.05, 0.5, size=(width,))


@pytest.mark.parametrize("init", ["s4d_lin", "s4d_inv", "s4d_real"])
def test_hippo_initialisations_match_the_survey_formulas(init):
    real, imaginary = hippo_diagonal(init, 8)
    np.testing.assert_allclose(real + 1j * imaginary, reference.hippo_diagonal(init, 8),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
@pytest.mark.parametrize("complex_valued", [False, True])
def test_discretizations_match_the_reference(rng, discretization, complex_valued):
    a, b, _, dt = _system(rng, complex_valued=complex_valued)
    (ar, ai), (br, bi) = discretize(discretization, _tensor(dt[:, None]), *_pair(a, complex_valued),
                                    *_pair(b, complex_valued))
    a_bar, b_bar = reference.discretize(discretization, dt[:, None], a, b)
    np.testing.assert_allclose(checks.to_numpy(ar), a_bar.real, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(checks.to_numpy(br), b_bar.real, rtol=1e-5, atol=1e-6)
    if complex_valued:
        np.testing.assert_allclose(checks.to_numpy(ai), a_bar.imag, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(checks.to_numpy(bi), b_bar.imag, rtol=1e-5, atol=1e-6)
    else:
        assert ai is None and bi is None


@pytest.mark.parametrize("complex_a", [False, True])
def test_zoh_euler_takes_a_bar_from_zoh_and_b_bar_from_euler(rng, complex_a):
    # Mamba's rule: Ā = exp(ΔA) (zero-order hold), B̄ = ΔB (Euler).
    dt = rng.uniform(0.05, 0.5, size=(3, 1)).astype("float32")
    a_re = -rng.uniform(0.5, 2.0, size=(3, 4)).astype("float32")
    a_im = rng.normal(size=(3, 4)).astype("float32") if complex_a else None
    b_re, b_im = rng.normal(size=(2, 3, 4)).astype("float32")
    b_im = b_im if complex_a else None
    (ar, ai), (br, bi) = discretize("zoh_euler", dt, a_re, a_im, b_re, b_im)
    a = a_re + (1j * a_im if complex_a else 0)
    b = b_re + (1j * b_im if complex_a else 0)
    a_bar, b_bar = reference.discretize("zoh_euler", dt, a, b)
    np.testing.assert_allclose(np.exp(dt * a), a_bar)
    np.testing.assert_allclose(dt * b, b_bar)
    np.testing.assert_allclose(checks.to_numpy(ar), a_bar.real, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(checks.to_numpy(br), b_bar.real, rtol=1e-5, atol=1e-6)
    if complex_a:
        np.testing.assert_allclose(checks.to_numpy(ai), a_bar.imag, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(checks.to_numpy(bi), b_bar.imag, rtol=1e-5, atol=1e-6)
    else:
        assert ai is None and bi is None
    # Ā is the zero-order hold's, B̄ Euler's.
    (zoh_r, _), _ = discretize("zoh", dt, a_re, a_im, b_re, b_im)
    _, (euler_r, _) = discretize("euler", dt, a_re, a_im, b_re, b_im)
    np.testing.assert_allclose(checks.to_numpy(ar), checks.to_numpy(zoh_r), rtol=1e-6)
    np.testing.assert_allclose(checks.to_numpy(br), checks.to_numpy(euler_r), rtol=1e-6)


@pytest.mark.parametrize("complex_valued", [False, True])
@pytest.mark.parametrize("length", [1, 7, 11])  # blocks of ⌈√T⌉ steps, the last one partial
def test_convolution_kernel_is_c_b_bar_times_the_powers_of_a_bar(rng, complex_valued, length):
    a, b, c, dt = _system(rng, complex_valued=complex_valued)
    a_bar, b_bar = reference.discretize("zoh", dt[:, None], a, b)
    cb = c * b_bar
    kernel = convolution_kernel(_tensor(cb.real), _tensor(cb.imag), _pair(a_bar, complex_valued),
                                length)
    expected = np.stack([np.real(np.sum(cb * a_bar**t, axis=-1)) for t in range(length)])
    np.testing.assert_allclose(checks.to_numpy(kernel), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("discretization", ["zoh", "bilinear"])
@pytest.mark.parametrize("complex_valued", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_time_invariant_ssm_equals_the_recurrence(rng, discretization, complex_valued,
                                                  with_state):
    a, b, c, dt = _system(rng, complex_valued=complex_valued)
    x = rng.normal(size=(2, 9, 3))
    z0 = None
    if with_state:
        z0 = rng.normal(size=(2, 3, 4)) + (1j * rng.normal(size=(2, 3, 4)) if complex_valued
                                           else 0.0)
    a_bar, b_bar = discretize(discretization, _tensor(dt[:, None]), *_pair(a, complex_valued),
                              *_pair(b, complex_valued))
    y, state = time_invariant_ssm(
        _tensor(x), a_bar, b_bar, _pair(c, complex_valued),
        initial_state=None if z0 is None else (_tensor(z0.real), _tensor(np.imag(z0))),
    )
    expected, z = reference.time_invariant(x, a, b, c, np.zeros(3), dt, discretization,
                                           initial_state=None if z0 is None else z0 + 0j)
    np.testing.assert_allclose(checks.to_numpy(y), expected, rtol=1e-4, atol=1e-4)
    if with_state:
        np.testing.assert_allclose(checks.to_numpy(state[0]), z.real, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(checks.to_numpy(state[1]), z.imag, rtol=1e-4, atol=1e-4)
    else:
        assert state is None


@pytest.mark.parametrize("discretization,method", [
    ("zoh", "chunked"), ("bilinear", "associative"), ("euler", "sequential"),
    ("zoh_euler", "chunked"),
])
@pytest.mark.parametrize("with_mask", [False, True])
def test_selective_scan_equals_the_recurrence(rng, discretization, method, with_mask):
    """`Δ_t`, `B_t`, `C_t` from the inputs as the reference makes them; padded steps hold the
    state; the final state continues from `z_0`."""
    width, state = 3, 4
    x = rng.normal(size=(2, 10, width))
    a = -rng.uniform(0.5, 2.0, size=(width, state))
    w_dt, w_b, w_c = (rng.normal(scale=0.5, size=shape)
                      for shape in ((width, width), (width, state), (width, state)))
    b_dt = rng.uniform(-2.0, 0.0, size=(width,))
    mask = None
    if with_mask:
        mask = np.ones((2, 10), bool)
        mask[0, 7:] = False
        mask[1, 2] = False
        x = x * mask[..., None]
    z0 = rng.normal(size=(2, width, state))
    dt = np.logaddexp(0, x @ w_dt + b_dt)
    y, z = selective_scan(
        _tensor(x), _tensor(dt), _tensor(x @ w_b), _tensor(x @ w_c), _tensor(a), discretization,
        mask=None if mask is None else _tensor(mask[..., None]), initial_state=_tensor(z0),
        method=method, chunk_size=4,
    )
    expected, expected_z = reference.selective(x, a, w_dt, b_dt, w_b, w_c, np.zeros(width),
                                               discretization, mask=mask, initial_state=z0)
    np.testing.assert_allclose(checks.to_numpy(y), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(z), expected_z, rtol=1e-4, atol=1e-4)
    if mask is None:  # without an initial state: from zeros, and no state returned
        y_alone, none = selective_scan(_tensor(x), _tensor(dt), _tensor(x @ w_b),
                                       _tensor(x @ w_c), _tensor(a), discretization,
                                       method=method, chunk_size=4)
        expected_alone, _ = reference.selective(x, a, w_dt, b_dt, w_b, w_c, np.zeros(width),
                                                discretization)
        assert none is None
        np.testing.assert_allclose(checks.to_numpy(y_alone), expected_alone, rtol=1e-4,
                                   atol=1e-4)

def test_step_bias_initializer_spans_the_step_range():
    bias = checks.to_numpy(step_bias_initializer(1e-3, 1e-1)((4096,)))
    dt = np.logaddexp(0, bias)  # softplus
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4)
    assert np.log(dt).std() > 0.5 * (np.log(1e-1) - np.log(1e-3)) / np.sqrt(12)


@pytest.mark.parametrize("kwargs,name", [
    ({"dt_min": 0.0}, "dt_min"), ({"dt_max": -1.0}, "dt_max"), ({"dt_min": 0.5}, "dt_min"),
    ({"method": "parallel"}, "method"), ({"chunk_size": 0}, "chunk_size"),
])
def test_bad_scan_arguments_raise(kwargs, name):
    arguments = {"dt_min": 1e-3, "dt_max": 1e-1, "method": "chunked", "chunk_size": 8,
                 **kwargs}
    with pytest.raises(ValueError, match=name):
        check_scan_arguments(**arguments)


def test_unknown_init_raises():
    with pytest.raises(ValueError, match="init"):
        hippo_diagonal("s4d_hippo", 4)
