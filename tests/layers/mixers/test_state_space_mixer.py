"""StateSpaceMixer: numpy recurrences, convolution ≡ recurrence, cached decoding, padding,
precision, XLA, saving, training in a CausalLM, and errors (survey §5.5.3)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import StateSpaceMixer
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import random_normal
from tests.models.tiny import WIDTH
from tests.models.tiny import cached_logits
from tests.models.tiny import causal_lm
from tests.models.tiny import check_cached_generation
from tests.models.tiny import token_batch
from tests.reference import state_space as reference

STATE = 4
LTI_CASES = [("s4d_lin", "zoh"), ("s4d_inv", "bilinear"), ("s4d_real", "euler"),
             ("s4d_lin", "zoh_euler")]
SELECTIVE_CASES = [("zoh", "chunked"), ("bilinear", "associative"), ("euler", "sequential"),
                   ("zoh_euler", "chunked"), ("zoh_euler", "associative")]


def _built(rng, **kwargs):
    """A built mixer with every weight randomised (steps in [0.05, 0.5])."""
    layer = StateSpaceMixer(STATE, chunk_size=4, **kwargs)
    layer.build((None, None, WIDTH))
    for weight in layer.weights:
        name = weight.path.split("/")[-1]
        value = checks.to_numpy(weight)
        if name == "log_dt":
            value = rng.uniform(np.log(0.05), np.log(0.5), size=value.shape)
        elif name == "dt_bias":
            value = rng.uniform(-2.0, 0.0, size=value.shape)
        elif name in ("a_log", "a_imag"):
            value = value + rng.normal(scale=0.1, size=value.shape)
        else:
            value = rng.normal(scale=0.5, size=value.shape)
        weight.assign(value.astype("float32"))
    return layer


def _w(layer, name):
    return checks.to_numpy(getattr(layer, name)).astype("float64")


def _reference(layer, x, mask=None, initial_state=None):
    x = np.asarray(x, np.float64)
    if mask is not None:
        x = x * mask[..., None]
    if layer.selective:
        o, z = reference.selective(
            x, -np.exp(_w(layer, "a_log")), _w(layer, "dt_kernel"), _w(layer, "dt_bias"),
            _w(layer, "b_kernel"), _w(layer, "c_kernel"), _w(layer, "d"), layer.discretization,
            mask=mask, initial_state=initial_state,
        )
    else:
        imag = (lambda n: _w(layer, n)) if layer.complex else (lambda n: 0.0)
        a = -np.exp(_w(layer, "a_log")) + 1j * imag("a_imag")
        b = _w(layer, "b_real") + 1j * imag("b_imag")
        c = _w(layer, "c_real") + 1j * imag("c_imag")
        o, z = reference.time_invariant(
            x, a, b, c, _w(layer, "d"), np.exp(_w(layer, "log_dt")), layer.discretization,
            initial_state=initial_state,
        )
    out = reference.project(o, _w(layer, "output_kernel"), _w(layer, "output_bias"))
    if mask is not None:
        out = out * mask[..., None]
    return out, z


def test_hippo_initialisations_match_the_survey_formulas():
    for init in ("s4d_lin", "s4d_inv", "s4d_real"):
        layer = StateSpaceMixer(8, init=init)
        layer.build((None, None, WIDTH))
        a = -np.exp(_w(layer, "a_log")) + (1j * _w(layer, "a_imag") if layer.complex else 0)
        np.testing.assert_allclose(a[3], reference.hippo_diagonal(init, 8), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("init,discretization", LTI_CASES)
def test_time_invariant_matches_the_numpy_recurrence(rng, init, discretization):
    layer = _built(rng, init=init, discretization=discretization)
    x = random_normal(rng, (2, 11, WIDTH))  # the kernel's blocks of ⌈√11⌉ = 4 steps, the last one partial
    expected, _ = _reference(layer, x)
    np.testing.assert_allclose(checks.to_numpy(layer(x)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("discretization,method", SELECTIVE_CASES)
def test_selective_matches_the_numpy_recurrence(rng, discretization, method):
    layer = _built(rng, selective=True, discretization=discretization, method=method)
    x = random_normal(rng, (2, 9, WIDTH))
    expected, _ = _reference(layer, x)
    np.testing.assert_allclose(checks.to_numpy(layer(x)), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("selective", [False, True])
def test_parallel_equals_recurrent_decoding(rng, selective):
    # A prefix of 4 tokens in one cached call, then one token per call.
    layer = _built(rng, selective=selective, init="s4d_real" if selective else "s4d_inv")
    x = random_normal(rng, (2, 9, WIDTH))
    full = checks.to_numpy(layer(x))
    cache = layer.init_cache(2, 9, "float32")
    outputs = []
    for start, stop in [(0, 4)] + [(t, t + 1) for t in range(4, 9)]:
        out, cache = layer(x[:, start:stop], cache=cache, cache_index=start)
        outputs.append(checks.to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, rtol=1e-4, atol=1e-4)
    # The state equals the reference's final state.
    _, z = _reference(layer, x)
    state = checks.to_numpy(cache)
    state = state if selective else state[..., 0] + 1j * state[..., 1]
    np.testing.assert_allclose(state, z, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("selective", [False, True])
def test_padding_keeps_padded_inputs_out_of_the_state(rng, selective):
    layer = _built(rng, selective=selective)
    x = random_normal(rng, (2, 9, WIDTH))
    mask = np.ones((2, 9), bool)
    mask[0, 6:] = False  # right padding
    if selective:
        mask[1, :3] = False  # left padding: the state is held over the padded steps
    out = checks.to_numpy(layer(x, padding_mask=mask))
    expected, _ = _reference(layer, x, mask=mask)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert np.all(out[~mask] == 0)
    # The valid prefix does not see what the padded positions held.
    np.testing.assert_allclose(
        out[0, :6], checks.to_numpy(layer(x[:1, :6]))[0], rtol=1e-4, atol=1e-4
    )
    if selective:
        np.testing.assert_allclose(
            out[1, 3:], checks.to_numpy(layer(x[1:, 3:]))[0], rtol=1e-4, atol=1e-4
        )


def _ssm_lm(selective=False):
    mixer = StateSpaceMixer(STATE, selective=selective, chunk_size=4)
    block = TransformerBlock(mixer=mixer, feedforward=FeedForward(32), norm_placement="pre")
    return causal_lm(num_layers=1, block=block, position="none")


@pytest.mark.parametrize("selective", [False, True])
def test_cached_decoding_in_a_causal_lm_equals_the_full_pass(rng, selective):
    model = _ssm_lm(selective)
    batch = token_batch(rng, length=8)
    full = checks.to_numpy(model(batch))
    np.testing.assert_allclose(cached_logits(model, batch, prefill=3), full, rtol=1e-4,
                               atol=1e-4)
    check_cached_generation(model)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (2, 9, WIDTH))
    for selective in (False, True):
        out = checks.check_mixed_precision(
            lambda **kw: StateSpaceMixer(STATE, selective=selective, **kw), [x], policy=policy
        )
        assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype


def test_config_round_trip_and_keras_saving(rng, tmp_path):
    layer = StateSpaceMixer(STATE, init="s4d_inv", discretization="bilinear", dt_min=0.01,
                            dt_max=0.2, use_bias=False)
    clone = checks.check_config_round_trip(layer)
    assert clone.init == "s4d_inv" and clone.discretization == "bilinear"
    x = random_normal(rng, (2, 9, WIDTH))
    for mixer in (layer, StateSpaceMixer(STATE, selective=True, method="associative")):
        model = checks.wrap_in_model(mixer, [x])
        checks.check_saving(model, [x], tmp_path, atol=1e-5)


@checks.xla_only
@pytest.mark.parametrize("selective", [False, True])
def test_jit_compile(rng, selective):
    x = random_normal(rng, (2, 9, WIDTH))
    model = checks.wrap_in_model(StateSpaceMixer(STATE, selective=selective, chunk_size=4), [x])
    checks.check_jit_compile(model, [x])


@pytest.mark.parametrize("selective", [False, True])
def test_a_tiny_causal_lm_trains(rng, selective):
    model = _ssm_lm(selective)
    batch = token_batch(rng, length=8, lengths=[8, 6])
    labels = np.roll(batch["token_ids"], -1, axis=1)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(batch, labels, sample_weight=batch["padding_mask"], epochs=4,
                        batch_size=2, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_bad_configs_raise():
    with pytest.raises(ValueError, match="state_size=0"):
        StateSpaceMixer(0)
    with pytest.raises(ValueError, match="discretization='rk4'"):
        StateSpaceMixer(4, discretization="rk4")
    with pytest.raises(ValueError, match="init='hippo_legs'"):
        StateSpaceMixer(4, init="hippo_legs")
    with pytest.raises(ValueError, match="init='s4d_lin'"):
        StateSpaceMixer(4, init="s4d_lin", selective=True)
    with pytest.raises(ValueError, match="dt_min=0.5, dt_max=0.1"):
        StateSpaceMixer(4, dt_min=0.5, dt_max=0.1)
    with pytest.raises(ValueError, match="method='fft'"):
        StateSpaceMixer(4, method="fft")
    layer = StateSpaceMixer(4)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(np.zeros((1, 3, 8), "float32"), attention_mask=np.ones((1, 3, 3), bool))


@pytest.mark.parametrize("mask", bad_padding_masks(2, 5))
@pytest.mark.parametrize("selective", [False, True])
def test_bad_padding_mask_raises(rng, selective, mask):
    layer = StateSpaceMixer(STATE, selective=selective)
    raises_naming("padding_mask", lambda: layer(random_normal(rng, (2, 5, WIDTH)), padding_mask=mask))


@pytest.mark.parametrize("selective", [False, True])
def test_bad_inputs_and_cache_raise(rng, selective):
    layer = StateSpaceMixer(STATE, selective=selective)
    layer(random_normal(rng, (2, 5, WIDTH)))
    step = random_normal(rng, (2, 1, WIDTH))
    raises_naming("inputs", lambda: layer(rng.normal(size=(2, 5, WIDTH + 2)).astype("float32")))
    raises_naming("inputs", lambda: layer(rng.normal(size=(2, WIDTH)).astype("float32")))
    cache = keras.ops.convert_to_numpy(layer.init_cache(2))
    for bad in (cache[:1], cache[..., :1], cache[0], (cache,)):
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(state_size=True), "state_size"),
        (dict(dt_min=-1.0), "dt_min"),
        (dict(dt_max="x"), "dt_max"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(selective="yes"), "selective"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: StateSpaceMixer(**kwargs))
