"""RecurrentMixer: LSTM / GRU / bidirectional against the numpy loops, cached decoding,
padding, precision, XLA, saving, a classifier, errors (a CausalLM with it: test_hybrid_stack)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch
from tests.reference import recurrent as ref

B, T, D = 2, 8, 16
LENGTHS = [T, 5]


def _set_random_weights(layer, rng):
    """Weights drawn from numpy (non-zero biases, so that every term is tested)."""
    weights = [0.4 * rng.normal(size=w.shape).astype("float32") for w in layer.weights]
    layer.set_weights(weights)
    return weights


def _reference(layer, weights, x, mask=None, state=None):
    """The layer's output from its numpy weights, through the naive loops."""
    run = ref.lstm if layer.cell == "lstm" else ref.gru
    if layer.bidirectional:
        forward, _ = run(x, *weights[:3], mask=mask)
        backward, _ = run(x, *weights[3:6], mask=mask, reverse=True)
        hidden, state, rest = np.concatenate([forward, backward], -1), None, weights[6:]
    else:
        hidden, state = run(x, *weights[:3], mask=mask, state=state)
        rest = weights[3:]
    outputs = hidden
    if rest:
        outputs = hidden @ rest[0] + rest[1]
    if mask is not None:
        outputs = outputs * mask[..., None]
    return outputs, state


CONFIGS = [
    dict(cell="lstm"),
    dict(cell="gru", units=12),  # with the output projection 12 -> 16
    dict(cell="lstm", bidirectional=True, units=6),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_matches_reference_with_padding(rng, config):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer = RecurrentMixer(**config)
    layer.build(x.shape)
    weights = _set_random_weights(layer, rng)
    actual = to_float64(layer(x, padding_mask=mask))
    expected, _ = _reference(layer, weights, x, mask)
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-4)
    assert np.all(actual[1, 5:] == 0.0)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cached_decoding_equals_full_pass(rng, cell):
    """A prefill of 3 tokens, then one token at a time from the state, equals the full pass;
    the final state is the reference's `(h, c)` / `h`, float32."""
    x = random_normal(rng, (B, T, D))
    layer = RecurrentMixer(cell, units=12)
    layer.build(x.shape)
    weights = _set_random_weights(layer, rng)
    full = to_float64(layer(x, use_causal_mask=True))
    state = layer.init_cache(B, T)
    outputs, state = layer(x[:, :3], cache=state, cache_index=0)
    pieces = [to_float64(outputs)]
    for t in range(3, T):
        outputs, state = layer(x[:, t:t + 1], cache=state, cache_index=t)
        pieces.append(to_float64(outputs))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)
    expected, expected_state = _reference(layer, weights, x)
    np.testing.assert_allclose(full, expected, atol=1e-5, rtol=1e-4)
    assert len(state) == (2 if cell == "lstm" else 1)
    for actual, wanted in zip(state, expected_state):
        assert keras.backend.standardize_dtype(actual.dtype) == "float32"
        np.testing.assert_allclose(to_float64(actual), wanted, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_use_cudnn_false_takes_the_generic_loop_with_the_same_result(rng, cell):
    """`use_cudnn=False` reaches the Keras layer (the generic loop, no fused kernel) and
    gives the reference's outputs without a mask, the case the fused kernels take."""
    x = random_normal(rng, (B, T, D))
    layer = RecurrentMixer(cell, units=12, use_cudnn=False)
    layer.build(x.shape)
    assert layer.rnn.use_cudnn is False
    weights = _set_random_weights(layer, rng)
    expected, _ = _reference(layer, weights, x)
    np.testing.assert_allclose(to_float64(layer(x)), expected, atol=1e-5, rtol=1e-4)
    assert checks.check_config_round_trip(layer).use_cudnn is False


def test_config_weights_fit_and_saving(rng, tmp_path):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer = RecurrentMixer("gru", units=12, output_dim=10)
    layer.build(x.shape)
    checks.check_config_round_trip(layer)
    units = 12
    assert checks.count_params(layer) == 3 * units * (D + units) + 2 * 3 * units + units * 10 + 10
    bidirectional = RecurrentMixer("lstm", bidirectional=True)
    bidirectional.build(x.shape)  # 8 units each way, concatenated to the width: no projection
    assert checks.count_params(bidirectional) == 2 * (4 * 8 * (D + 8) + 4 * 8)

    bidirectional = RecurrentMixer("lstm", bidirectional=True, units=6)  # projection 12 -> 16
    model = checks.wrap_in_model(bidirectional, [x], {"padding_mask": mask})
    inputs = checks.model_inputs([x], {"padding_mask": mask})
    checks.check_fit_step(model, inputs)
    checks.check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)

    def make(dtype):
        return RecurrentMixer("lstm", units=12, dtype=dtype)

    checks.check_mixed_precision(make, [x], {"padding_mask": mask}, policy=policy)
    layer = make(policy)
    layer.build(x.shape)
    outputs, state = layer(x, cache=layer.init_cache(B, T, "float16"), cache_index=0)
    assert [keras.backend.standardize_dtype(s.dtype) for s in state] == ["float32"] * 2
    reference = make(None)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_float64(outputs), to_float64(reference(x)), atol=0.05, rtol=0.05)


@checks.xla_only
def test_jit_compile(rng):
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer = RecurrentMixer("gru", units=6, bidirectional=True)  # with the projection 12 -> 16
    model = checks.wrap_in_model(layer, [x], {"padding_mask": mask})
    checks.check_jit_compile(model, checks.model_inputs([x], {"padding_mask": mask}))


def test_bidirectional_text_classifier_trains(rng):
    """An encoder of a bidirectional GRU block and a non-causal AverageAttention block."""
    blocks = [TransformerBlock(RecurrentMixer("gru", bidirectional=True), FeedForward(FFN)),
              TransformerBlock(AverageAttention(causal=False), FeedForward(FFN))]
    model = text_classifier(block=blocks, num_layers=2)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    batch = token_batch(rng, lengths=[8, 5])
    labels = np.array([0, 1], "int32")
    losses = model.fit(batch, labels, epochs=4, batch_size=B, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_bad_configs_and_calls_raise(rng):
    for kwargs, match in [
        (dict(cell="rnn"), "cell"),
        (dict(units=0), "units"),
        (dict(units=4.5), "units"),
        (dict(output_dim=-1), "output_dim"),
        (dict(bidirectional="yes"), "bidirectional"),
        (dict(use_cudnn="yes"), "use_cudnn"),
    ]:
        with pytest.raises(ValueError, match=match):
            RecurrentMixer(**kwargs)
    x = random_normal(rng, (B, T, D))
    layer = RecurrentMixer("lstm")
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((B, T, T), bool))
    bidirectional = RecurrentMixer("gru", bidirectional=True)
    bidirectional.build(x.shape)
    with pytest.raises(ValueError, match="use_causal_mask"):
        bidirectional(x, use_causal_mask=True)
    with pytest.raises(ValueError, match="cache"):
        bidirectional.init_cache(B, T)
    with pytest.raises(ValueError, match="cache"):
        bidirectional(x, cache=(np.zeros((B, 8), "float32"),))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_bad_padding_mask_raises(rng, bidirectional, mask):
    layer = RecurrentMixer("gru", bidirectional=bidirectional)
    raises_naming("padding_mask", lambda: layer(random_normal(rng, (B, T, D)), padding_mask=mask))


def test_bad_inputs_and_cache_raise(rng):
    layer = RecurrentMixer("lstm")
    layer(random_normal(rng, (B, T, D)))
    step = random_normal(rng, (B, T, D))[:, :1]
    # A one-step input with a full-length mask was broadcast to [B, T, d] on PyTorch.
    raises_naming("padding_mask", lambda: layer(step, padding_mask=padding_mask(LENGTHS, T)))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T, D + 2)).astype("float32")))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, D)).astype("float32")))
    h, c = layer.init_cache(B)
    for bad in ((h,), (h, c, c), (np.zeros((1, D), "float32"), c),
                (h, np.zeros((B, D + 1), "float32")), h):
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kernel_initializer="not_an_initializer"), "kernel_initializer"),
        (dict(recurrent_initializer=1.5), "recurrent_initializer"),
        (dict(bias_initializer="nope"), "bias_initializer"),
        (dict(units=True), "units"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    raises_naming(name, lambda: RecurrentMixer("lstm", **kwargs))
