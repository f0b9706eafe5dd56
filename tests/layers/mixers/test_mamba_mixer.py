"""MambaMixer: the numpy equations, prefill + step-by-step decoding ≡ one pass, padding kept
out of the state, a CausalLM of Mamba blocks (no feedforward), precision, XLA, saving and
errors (survey §5.5.3)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import MambaMixer
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import random_normal
from tests.models.tiny import cached_logits
from tests.models.tiny import causal_lm
from tests.models.tiny import check_cached_generation
from tests.models.tiny import token_batch
from tests.reference import state_space as reference

WIDTH, STATE, KERNEL, LENGTH = 16, 4, 3, 7
# Keras weight (by its path's last two parts) → name in `reference.mamba`.
NAMES = {
    "input_projection/kernel": "in_kernel", "input_projection/bias": "in_bias",
    "convolution/kernel": "conv_kernel", "convolution/bias": "conv_bias",
    "mamba_mixer/selection_kernel": "selection_kernel", "mamba_mixer/dt_kernel": "dt_kernel",
    "mamba_mixer/dt_bias": "dt_bias", "mamba_mixer/a_log": "a_log", "mamba_mixer/d": "d",
    "output_projection/kernel": "out_kernel", "output_projection/bias": "out_bias",
}


def _built(rng, use_bias=True, **kwargs):
    """A built mixer with every weight moved off its initial value (steps about 0.1–1)."""
    layer = MambaMixer(STATE, conv_kernel=KERNEL, use_bias=use_bias, chunk_size=4, **kwargs)
    layer.build((None, None, WIDTH))
    for weight in layer.weights:
        value = checks.to_numpy(weight)
        if weight.path.endswith("dt_bias"):
            value = rng.uniform(-2.0, 0.0, size=value.shape)
        elif weight.path.endswith("a_log"):
            value = value + rng.normal(scale=0.1, size=value.shape)
        else:
            value = value + rng.normal(scale=0.3, size=value.shape)
        weight.assign(value.astype("float32"))
    return layer


def _weights(layer):
    weights = {NAMES["/".join(w.path.split("/")[-2:])]: checks.to_float64(w) for w in layer.weights}
    return {name: weights.get(name) for name in NAMES.values()}


def _reference(layer, x, **kwargs):
    return reference.mamba(np.asarray(x, np.float64), _weights(layer), layer.rank, **kwargs)


@pytest.mark.parametrize("method", ["chunked", "associative", "sequential"])
def test_matches_the_numpy_equations(rng, method):
    layer = _built(rng, method=method)
    assert layer.rank == 1  # "auto": ⌈16 / 16⌉
    x = random_normal(rng, (2, LENGTH, WIDTH))
    expected, _, _ = _reference(layer, x)
    np.testing.assert_allclose(checks.to_numpy(layer(x)), expected, rtol=1e-4, atol=1e-4)


def test_weights_and_their_shapes(rng):
    layer = MambaMixer(STATE, expand=3, conv_kernel=KERNEL, dt_rank=2, use_conv_bias=False)
    layer.build((None, None, WIDTH))
    inner = 3 * WIDTH
    shapes = {"/".join(w.path.split("/")[-2:]): tuple(w.shape) for w in layer.weights}
    assert shapes == {
        "input_projection/kernel": (WIDTH, 2 * inner), "convolution/kernel": (KERNEL, inner),
        "mamba_mixer/selection_kernel": (inner, 2 + 2 * STATE),
        "mamba_mixer/dt_kernel": (2, inner), "mamba_mixer/dt_bias": (inner,),
        "mamba_mixer/a_log": (inner, STATE), "mamba_mixer/d": (inner,),
        "output_projection/kernel": (inner, WIDTH),
    }
    # S4D-Real A = −(n + 1), D = 1, and initial steps softplus(b_Δ) in [dt_min, dt_max].
    np.testing.assert_allclose(-np.exp(checks.to_numpy(layer.a_log))[5], -np.arange(1, 5),
                               rtol=1e-6)
    np.testing.assert_array_equal(checks.to_numpy(layer.d), 1.0)
    steps = np.logaddexp(0, checks.to_float64(layer.dt_bias))
    assert np.all((steps > 1e-3 * 0.99) & (steps < 1e-1 * 1.01))


def test_prefill_then_step_by_step_decoding_equals_one_pass(rng):
    layer = _built(rng)
    x = random_normal(rng, (2, LENGTH, WIDTH))
    full = checks.to_numpy(layer(x))
    cache = layer.init_cache(2, LENGTH, "float32")
    outputs = []
    for start, stop in [(0, 4)] + [(t, t + 1) for t in range(4, LENGTH)]:
        out, cache = layer(x[:, start:stop], cache=cache, cache_index=start)
        outputs.append(checks.to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, rtol=1e-4, atol=1e-4)
    # The cache is the last K − 1 convolution inputs and the state of the equations.
    _, window, state = _reference(layer, x)
    assert [keras.backend.standardize_dtype(c.dtype) for c in cache] == ["float32"] * 2
    np.testing.assert_allclose(checks.to_numpy(cache[0]), window, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(cache[1]), state, rtol=1e-4, atol=1e-4)


def test_right_padding_stays_out_of_the_outputs_and_the_cache(rng):
    layer = _built(rng)
    x = random_normal(rng, (2, LENGTH, WIDTH))
    mask = checks.padding_mask([LENGTH, 2], LENGTH)  # row 1: 2 tokens, then padding
    out, cache = layer(x, padding_mask=mask, cache=layer.init_cache(2), cache_index=0)
    out = checks.to_numpy(out)
    expected, window, state = _reference(layer, x, mask=mask)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    assert np.all(out[~mask] == 0)
    # Row 1's outputs and cache are those of its 2 tokens alone: padding never entered.
    alone, alone_cache = layer(x[1:, :2], cache=layer.init_cache(1), cache_index=0)
    np.testing.assert_allclose(out[1, :2], checks.to_numpy(alone)[0], rtol=1e-5, atol=1e-5)
    for padded, short, ref in zip(cache, alone_cache, (window, state)):
        np.testing.assert_allclose(checks.to_numpy(padded)[1], checks.to_numpy(short)[0],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(checks.to_numpy(padded), ref, rtol=1e-4, atol=1e-4)
    # Decoding on from the padded call equals decoding on from the unpadded one.
    step = x[1:, 2:3]
    after_padded, _ = layer(step, cache=tuple(c[1:] for c in cache), cache_index=2)
    after_alone, _ = layer(step, cache=alone_cache, cache_index=2)
    np.testing.assert_allclose(checks.to_numpy(after_padded), checks.to_numpy(after_alone),
                               rtol=1e-5, atol=1e-5)


def _mamba_lm():
    block = TransformerBlock(MambaMixer(STATE, conv_kernel=KERNEL, chunk_size=4), None,
                             normalization="rms_norm", norm_placement="pre")
    return causal_lm(num_layers=2, block=block, position="none")


def test_a_causal_lm_of_mamba_blocks_decodes_generates_and_trains(rng):
    model = _mamba_lm()
    assert model.backbone.transformer_stack.blocks[1].feedforward is None
    batch = token_batch(rng, length=8)
    full = checks.to_numpy(model(batch))
    np.testing.assert_allclose(cached_logits(model, batch, prefill=3), full, rtol=1e-4,
                               atol=1e-4)
    check_cached_generation(model)
    labels = np.roll(batch["token_ids"], -1, axis=1)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(batch, labels, sample_weight=batch["padding_mask"], epochs=3,
                        batch_size=2, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (2, LENGTH, WIDTH))
    out = checks.check_mixed_precision(
        lambda **kw: MambaMixer(STATE, conv_kernel=KERNEL, **kw), [x], policy=policy
    )
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype


def test_config_round_trip_and_keras_saving(rng, tmp_path):
    layer = MambaMixer(STATE, expand=1, conv_kernel=2, dt_rank=3, use_bias=True,
                       use_conv_bias=False, dt_min=0.01, dt_max=0.2, method="associative",
                       chunk_size=8)
    clone = checks.check_config_round_trip(layer)
    assert clone.dt_rank == 3 and clone.method == "associative" and not clone.use_conv_bias
    assert checks.check_config_round_trip(MambaMixer()).dt_rank == "auto"
    x = random_normal(rng, (2, LENGTH, WIDTH))
    checks.check_saving(checks.wrap_in_model(layer, [x]), [x], tmp_path, atol=1e-5)


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (2, LENGTH, WIDTH))
    checks.check_jit_compile(checks.wrap_in_model(MambaMixer(STATE, chunk_size=4), [x]), [x])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(state_size=0), "state_size"),
        (dict(expand=1.5), "expand"),
        (dict(conv_kernel=0), "conv_kernel"),
        (dict(dt_rank="full"), "dt_rank"),
        (dict(dt_rank=0), "dt_rank"),
        (dict(use_bias="yes"), "use_bias"),
        (dict(use_conv_bias=None), "use_conv_bias"),
        (dict(dt_min=-1.0), "dt_min"),
        (dict(dt_min=0.5, dt_max=0.1), "dt_max"),
        (dict(method="fft"), "method"),
        (dict(chunk_size=0), "chunk_size"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: MambaMixer(**kwargs))


@pytest.mark.parametrize("mask", bad_padding_masks(2, 5))
def test_bad_padding_mask_raises(rng, mask):
    layer = MambaMixer(STATE)
    x = random_normal(rng, (2, 5, WIDTH))
    raises_naming("padding_mask", lambda: layer(x, padding_mask=mask))


def test_bad_inputs_and_cache_raise(rng):
    layer = MambaMixer(STATE, conv_kernel=KERNEL)
    raises_naming("init_cache", lambda: layer.init_cache(2))
    layer(random_normal(rng, (2, 5, WIDTH)))
    step = random_normal(rng, (2, 1, WIDTH))
    raises_naming("inputs", lambda: layer(random_normal(rng, (2, 5, WIDTH + 2))))
    raises_naming("inputs", lambda: layer(random_normal(rng, (2, WIDTH))))
    raises_naming("attention_mask", lambda: layer(step, attention_mask=np.ones((2, 1, 1), bool)))
    window, state = (keras.ops.convert_to_numpy(c) for c in layer.init_cache(2))
    bad_caches = ((window,), (window, state[:1]), (window[..., :1], state), window,
                  [window, state[0]])
    for bad in bad_caches:
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))
