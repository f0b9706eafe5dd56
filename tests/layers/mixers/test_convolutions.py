"""Convolutional mixers (DepthwiseConvolution, LightweightConvolution, DynamicConvolution,
ConformerConvolution): numpy references, rolling-cache decoding, a tiny CausalLM, padding,
precision, XLA, saving and errors (survey §5.5.1)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import ConformerConvolution
from keras_xf.layers import DepthwiseConvolution
from keras_xf.layers import DynamicConvolution
from keras_xf.layers import FeedForward
from keras_xf.layers import LightweightConvolution
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import causal_lm
from tests.models.tiny import check_cached_generation
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import convolutions as ref

B, T, D, H = 2, 8, 16, 2
LENGTHS = [T, 5]

# One configuration per class; even and odd kernel sizes, with and without the projections.
FACTORIES = {
    "depthwise": lambda **kw: DepthwiseConvolution(4, **kw),
    "lightweight": lambda **kw: LightweightConvolution(3, H, use_glu=True, **kw),
    "dynamic": lambda **kw: DynamicConvolution(4, H, use_glu=True, **kw),
    "conformer": lambda **kw: ConformerConvolution(3, **kw),
}
KINDS = list(FACTORIES)


def _built(kind, rng, **kwargs):
    """A built layer with every weight randomised (positive moving variances)."""
    layer = FACTORIES[kind](**kwargs)
    layer.build((None, None, D))
    for weight in layer.weights:
        value = rng.normal(scale=0.5, size=weight.shape)
        if "moving_variance" in weight.path:
            value = np.abs(value) + 0.5
        weight.assign(value.astype("float32"))
    return layer


def _dense(layer, x):
    bias = None if layer.bias is None else to_float64(layer.bias)
    return ref.dense(x, to_float64(layer.kernel), bias)


def _reference(layer, x, causal, mask=None, history=None):
    """The layer's output from its weights, through the numpy equations."""
    x = np.asarray(x, np.float64)
    keep = np.ones(x.shape[:2]) if mask is None else np.asarray(mask, np.float64)
    keep = keep[..., None]
    if isinstance(layer, DepthwiseConvolution):
        bias = None if layer.bias is None else to_float64(layer.bias)
        return ref.depthwise(x * keep, to_float64(layer.kernel), bias, causal, history) * keep
    if isinstance(layer, ConformerConvolution):
        u = ref.glu(_dense(layer.pointwise_in, x)) * keep
        v = ref.depthwise(u, to_float64(layer.depthwise_kernel),
                          to_float64(layer.depthwise_bias), causal, history)
        norm = layer.norm
        if layer.normalization == "layer_norm":
            v = ref.layer_norm(v, to_float64(norm.gamma), to_float64(norm.beta), norm.epsilon)
        else:
            v = ref.batch_norm_inference(v, to_float64(norm.gamma), to_float64(norm.beta),
                                         to_float64(norm.moving_mean),
                                         to_float64(norm.moving_variance), norm.epsilon)
        return _dense(layer.pointwise_out, ref.swish(v)) * keep
    u = x if not layer.use_glu else ref.glu(_dense(layer.input_projection, x))
    u = u * keep
    if isinstance(layer, LightweightConvolution):
        y = ref.lightweight(u, to_float64(layer.kernel), causal, layer.weight_softmax, history)
    else:
        dense = layer.kernel_dense
        y = ref.dynamic(u, to_float64(dense.kernel), to_float64(dense.bias), layer.num_heads,
                        layer.kernel_size, causal, layer.weight_softmax, history)
    if layer.use_glu:
        y = _dense(layer.output_projection, y)
    return y * keep


@pytest.mark.parametrize("kind", KINDS)
def test_matches_reference_with_padding(rng, kind):
    layer = _built(kind, rng)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask(LENGTHS, T)
    for causal in (False, True):
        actual = to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
        np.testing.assert_allclose(actual, _reference(layer, x, causal, mask), atol=1e-5,
                                   rtol=1e-4)
        # Whatever the padded positions hold, the valid ones do not change.
        noise = 100.0 * random_normal(rng, (B, T, D))
        noisy = np.where(mask[..., None], x, noise).astype("float32")
        again = to_float64(layer(noisy, padding_mask=mask, use_causal_mask=causal))
        np.testing.assert_allclose(again, actual, atol=1e-5, rtol=1e-5)
    # A fully padded row gives zeros, never NaN.
    empty = np.stack([np.zeros(T, bool), np.ones(T, bool)])
    out = to_float64(layer(x, padding_mask=empty))
    assert np.all(np.isfinite(out)) and np.all(out[0] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_cached_decoding_equals_the_full_causal_pass(rng, kind):
    """A prefill of 3 tokens then one token per call, from the rolling cache, equals one
    causal pass; a cache holding earlier inputs acts as the left context (reference)."""
    layer = _built(kind, rng, causal=True)
    x = random_normal(rng, (B, T, D))
    full = to_float64(layer(x))
    cache = layer.init_cache(B, T)
    outputs, cache = layer(x[:, :3], cache=cache, cache_index=0)
    pieces = [to_float64(outputs)]
    for t in range(3, T):
        outputs, cache = layer(x[:, t:t + 1], cache=cache, cache_index=t)
        pieces.append(to_float64(outputs))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)
    channels = D if kind != "conformer" else layer.inner_dim
    assert tuple(cache.shape) == (B, layer.kernel_size - 1, channels)
    assert keras.backend.standardize_dtype(cache.dtype) == "float32"
    history = rng.normal(size=tuple(cache.shape)).astype("float32")
    outputs, _ = layer(x[:, :2], cache=history, cache_index=T)
    np.testing.assert_allclose(to_float64(outputs),
                               _reference(layer, x[:, :2], True, history=history),
                               atol=1e-5, rtol=1e-4)


def test_kernel_size_one_has_an_empty_cache(rng):
    layer = DepthwiseConvolution(1, causal=True)
    x = random_normal(rng, (B, T, D))
    full = to_float64(layer(x))
    cache = layer.init_cache(B, T)
    assert tuple(cache.shape) == (B, 0, D)
    outputs, cache = layer(x[:, :1], cache=cache, cache_index=0)
    np.testing.assert_allclose(to_float64(outputs), full[:, :1], atol=1e-6)
    assert tuple(cache.shape) == (B, 0, D)


def _lm(kind):
    mixer = FACTORIES[kind](causal=True)
    block = TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")
    return causal_lm(num_layers=1, block=block)


@pytest.mark.parametrize("kind", KINDS)
def test_causal_lm_generates_with_the_cache_and_trains(rng, kind):
    keras.utils.set_random_seed(1)
    lm = randomize_embeddings(_lm(kind))
    # The compiled generation loop (one token per step from the rolling caches) gives the
    # tokens of the uncached loop.
    check_cached_generation(lm)

    batch = token_batch(rng, lengths=[8, 6])
    labels = np.roll(batch["token_ids"], -1, axis=1)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = lm.fit(batch, labels, sample_weight=batch["padding_mask"], epochs=3,
                    batch_size=B, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (B, T, D))
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    for kind in KINDS:
        out = checks.check_mixed_precision(
            lambda **kw: FACTORIES[kind](causal=True, **kw), [x],
            {"padding_mask": padding_mask(LENGTHS, T)},
            policy=policy,
        )
        assert keras.backend.standardize_dtype(out.dtype) == compute_dtype
        layer = FACTORIES[kind](causal=True, dtype=policy)
        layer.build(x.shape)
        outputs, cache = layer(x, cache=layer.init_cache(B, T, compute_dtype), cache_index=0)
        assert keras.backend.standardize_dtype(cache.dtype) == "float32"
        reference = FACTORIES[kind](causal=True)
        reference.build(x.shape)
        reference.set_weights(layer.get_weights())
        np.testing.assert_allclose(to_float64(outputs), to_float64(reference(x)), atol=0.1,
                                   rtol=0.05)


def _param_count(kind):
    glu = (D * 2 * D + 2 * D) + (D * D + D)
    if kind == "depthwise":
        return 4 * D + D
    if kind == "lightweight":
        return H * 3 + glu
    if kind == "dynamic":
        return D * H * 4 + H * 4 + glu
    inner = D  # expansion 2: d → 2d, GLU → d
    return (D * 2 * inner + 2 * inner) + (3 * inner + inner) + 4 * inner + (inner * D + D)


def test_config_round_trip_and_weight_counts(rng):
    x = random_normal(rng, (B, T, D))
    for kind in KINDS:
        layer = FACTORIES[kind](causal=kind in ("lightweight", "conformer"), name="mixer")
        layer.build(x.shape)
        checks.check_config_round_trip(layer)
        assert checks.count_params(layer) == _param_count(kind), kind


CHAIN = {
    "depthwise": dict(),
    "lightweight": dict(causal=True, weight_dropout=0.2, seed=3),
    "dynamic": dict(weight_dropout=0.1, seed=1),
    "conformer": dict(causal=True, dropout=0.1),
}


def _chain(x):
    """A functional model stacking the four mixers (one of each, causal and not, with weight
    dropout and dropout), so that one compilation covers them all."""
    inputs = keras.Input(shape=x.shape[1:], name="inputs")
    mask = keras.Input(shape=(T,), dtype="bool", name="padding_mask")
    hidden = inputs
    for kind, kwargs in CHAIN.items():
        hidden = FACTORIES[kind](name=kind, **kwargs)(hidden, padding_mask=mask)
    return keras.Model([inputs, mask], hidden)


def test_fit_step_and_keras_saving(rng, tmp_path):
    x = random_normal(rng, (B, T, D))
    model = _chain(x)
    inputs = [x, padding_mask(LENGTHS, T)]
    checks.check_fit_step(model, inputs)
    checks.check_saving(model, inputs, tmp_path, atol=1e-5)


def test_dynamic_convolution_summed_in_blocks_matches_reference(rng, monkeypatch):
    """A sequence longer than the block size is summed block by block (blocks of 3 positions
    over 8: 3, 3 and 2), in both paddings, with the same result as the numpy equations."""
    from keras_xf.layers.mixers import dynamic_convolution

    layer = _built("dynamic", rng)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask(LENGTHS, T)
    whole = {causal: to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
             for causal in (False, True)}
    monkeypatch.setattr(dynamic_convolution, "POSITION_BLOCK", 3)
    for causal in (False, True):
        blocked = to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
        np.testing.assert_allclose(blocked, _reference(layer, x, causal, mask), atol=1e-5,
                                   rtol=1e-4)
        np.testing.assert_allclose(blocked, whole[causal], atol=1e-6, rtol=1e-6)


@checks.xla_only
def test_dynamic_convolution_summed_in_blocks_compiles(rng, monkeypatch):
    from keras_xf.layers.mixers import dynamic_convolution

    monkeypatch.setattr(dynamic_convolution, "POSITION_BLOCK", 3)
    x = random_normal(rng, (B, T, D))
    inputs = keras.Input(shape=x.shape[1:])
    mask = keras.Input(shape=(T,), dtype="bool")
    outputs = FACTORIES["dynamic"](causal=True)(inputs, padding_mask=mask)
    checks.check_jit_compile(keras.Model([inputs, mask], outputs), [x, padding_mask(LENGTHS, T)])


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    checks.check_jit_compile(_chain(x), [x, padding_mask(LENGTHS, T)])


def test_weight_dropout_drops_normalised_taps_when_training(rng):
    x = random_normal(rng, (B, T, D))
    layer = LightweightConvolution(3, H, weight_dropout=0.5, seed=0)
    inference = to_float64(layer(x))
    np.testing.assert_allclose(to_float64(layer(x, training=False)), inference)
    assert not np.allclose(to_float64(layer(x, training=True)), inference)
    kernel = to_float64(layer.channel_kernel(training=True))
    assert np.any(kernel == 0)


def test_bad_configs_raise():
    cases = [
        (lambda: DepthwiseConvolution(0), "kernel_size=0"),
        (lambda: DepthwiseConvolution(2.5), "kernel_size=2.5"),
        (lambda: DepthwiseConvolution(3, causal="yes"), "causal='yes'"),
        (lambda: LightweightConvolution(-1, H), "kernel_size=-1"),
        (lambda: LightweightConvolution(3, 0), "num_heads=0"),
        (lambda: DynamicConvolution(3, H, weight_dropout=1.0), "weight_dropout=1.0"),
        (lambda: ConformerConvolution(3, expansion=0), "expansion=0"),
        (lambda: ConformerConvolution(3, normalization="group_norm"), "normalization='group_norm'"),
        (lambda: ConformerConvolution(3, activation="not_an_activation"), "activation="),
        (lambda: ConformerConvolution(3, dropout=-0.1), "dropout=-0.1"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()


@pytest.mark.parametrize("kind", KINDS)
def test_bad_calls_raise(rng, kind):
    x = random_normal(rng, (B, T, D))
    layer = FACTORIES[kind]()
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((B, T, T), bool))
    layer(x)
    with pytest.raises(ValueError, match="causal=False"):
        layer.init_cache(B, T)
    cache = np.zeros((B, layer.kernel_size - 1, layer._channels()), "float32")
    with pytest.raises(ValueError, match="causal=False"):
        layer(x, cache=cache, cache_index=0)
    causal = FACTORIES[kind](causal=True)
    with pytest.raises(ValueError, match="use_causal_mask=False"):
        causal(x, cache=cache, cache_index=0, use_causal_mask=False)
    if kind in ("lightweight", "dynamic"):
        with pytest.raises(ValueError, match="num_heads=3, hidden_dim=16"):
            type(layer)(3, 3)(x)


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
@pytest.mark.parametrize("kind", KINDS)
def test_bad_padding_mask_raises(rng, kind, mask):
    layer = FACTORIES[kind]()
    message = raises_naming("padding_mask", lambda: layer(random_normal(rng, (B, T, D)), padding_mask=mask))
    assert f"Received: padding_mask.shape={mask.shape}" in message


@pytest.mark.parametrize("kind", KINDS)
def test_bad_inputs_and_cache_raise(rng, kind):
    layer = FACTORIES[kind](causal=True)
    layer(random_normal(rng, (B, T, D)))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T, D + 2)).astype("float32")))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T)).astype("float32")))
    cache = layer.init_cache(B)
    step = random_normal(rng, (B, 1, D))
    for bad in (np.zeros((B + 1,) + tuple(cache.shape[1:]), "float32"),
                np.zeros(tuple(cache.shape[:2]) + (cache.shape[2] + 1,), "float32"),
                np.zeros(tuple(cache.shape[1:]), "float32")):
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: DepthwiseConvolution(3, kernel_initializer="not_an_initializer"),
         "kernel_initializer"),
        (lambda: LightweightConvolution(3, H, bias_initializer=3), "bias_initializer"),
        (lambda: DynamicConvolution(3, H, weight_dropout="x"), "weight_dropout"),
        (lambda: ConformerConvolution(3, activation=7), "activation"),
        (lambda: ConformerConvolution(3, expansion=True), "expansion"),
    ],
)
def test_bad_constructor_arguments_raise(make, name):
    raises_naming(name, make)
