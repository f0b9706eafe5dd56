"""LinearAttention: feature maps and forms against the numpy recurrences, chunk-parallel ≡
recurrent, cached decoding in a CausalLM, padding, precision, XLA, saving, training, errors."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LinearAttention
from keras_xf.layers import TransformerBlock
from keras_xf.ops import causal_linear_attention
from tests import layer_checks as checks
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import linear_attention as ref

B, T, D, H = 2, 8, 16, 2
LENGTHS = [T, 5]


def _project(dense, x, equation):
    out = np.einsum(equation, np.asarray(x, np.float64), to_float64(dense.kernel))
    return out if dense.bias is None else out + to_float64(dense.bias)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _reference(layer, x, causal, padding_mask=None, state=None):
    """The layer's output from its weights, through the numpy recurrences; the state is
    `(μ, ν)`, or `(μ, ν, last keys)` with a key convolution."""
    q, k, v = (_project(d, x, "btd,dhk->bthk")
               for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    window = None
    if layer.key_convolution is not None:
        k, window = ref.key_convolution(k, to_float64(layer.key_convolution_kernel), padding_mask,
                                        None if state is None else state[2])
        state = None if state is None else state[:2]
    projection = None if layer.projection is None else to_float64(layer.projection)
    qf = ref.feature_map(q, layer.feature_map, projection)
    kf = ref.feature_map(k, layer.feature_map, projection)
    decay = None
    if layer.decay == "learned":
        decay = np.broadcast_to(_sigmoid(to_float64(layer.decay_logit)), q.shape[:3])
    elif layer.decay == "gated":
        decay = _sigmoid(_project(layer.gate_dense, x, "btd,dh->bth"))
    elif layer.decay is not None:
        decay = np.broadcast_to(np.array(layer.decay, np.float64), q.shape[:3])
    out, state = ref.linear_attention(qf, kf, v, causal, padding_mask, decay, layer.normalize,
                                      state, layer.epsilon)
    if window is not None:
        state = state + (window,)
    return _project(layer.output_dense, out, "bthk,hkd->btd"), state


CONFIGS = [
    dict(feature_map="elu"),
    dict(feature_map="relu"),
    dict(feature_map="random_features", num_features=12, seed=3),
    dict(feature_map="taylor"),
    dict(feature_map="elu", decay=[0.5, 0.9]),
    dict(feature_map="relu", decay="learned", decay_init=[0.6, 0.95]),
    dict(feature_map="random_features", decay="gated", seed=1),
    # Retention: fixed decay per head, identity features, no normalisation.
    dict(feature_map="identity", decay=[0.7, 0.97], normalize=False),
    # Keys through a causal depthwise convolution (both forms, and with a gate).
    dict(feature_map="relu", key_convolution=3),
    dict(feature_map="elu", decay="gated", key_convolution=2),
    dict(feature_map="taylor", decay="gated", key_convolution=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_matches_reference(rng, config):
    x = random_normal(rng, (B, T, D))
    mask = padding_mask(LENGTHS, T)
    forms = [True] if "decay" in config else [False, True]
    layer = LinearAttention(H, chunk_size=3, **config)
    for causal in forms:
        actual = layer(x, padding_mask=mask, use_causal_mask=causal)
        expected, _ = _reference(layer, x, causal, mask)
        np.testing.assert_allclose(to_float64(actual), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("decay, key_convolution", [(None, None), ("gated", None), ("gated", 4)])
def test_chunk_parallel_equals_recurrent(rng, decay, key_convolution):
    """One parallel pass (chunks of 3), a prefill of 3 then single tokens from the state, and
    the naive recurrence agree, outputs and final state (with a key convolution of 4, a
    prefill shorter than its window)."""
    x = random_normal(rng, (B, T, D))
    layer = LinearAttention(H, feature_map="elu", decay=decay, chunk_size=3, causal=True,
                            key_convolution=key_convolution)
    full = to_float64(layer(x))
    state = layer.init_cache(B, T)
    outputs, state = layer(x[:, :3], cache=state, cache_index=0)
    pieces = [to_float64(outputs)]
    for t in range(3, T):
        outputs, state = layer(x[:, t:t + 1], cache=state, cache_index=t)
        pieces.append(to_float64(outputs))
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=1e-5)
    expected, expected_state = _reference(layer, x, causal=True)
    np.testing.assert_allclose(full, expected, atol=2e-5, rtol=1e-4)
    assert len(state) == (2 if key_convolution is None else 3)
    assert {keras.backend.standardize_dtype(s.dtype) for s in state} == {"float32"}
    for actual, wanted in zip(state, expected_state):
        np.testing.assert_allclose(to_float64(actual), wanted, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_causal_op_from_a_state_matches_the_recurrence(rng, chunk_size):
    """`ops.causal_linear_attention` with decay, input scale and an initial state, for chunks
    smaller than, not dividing, and larger than the length."""
    qf, kf = (np.abs(rng.normal(size=(B, T, H, 3))).astype("float32") for _ in range(2))
    v = rng.normal(size=(B, T, H, 4)).astype("float32")
    a = rng.uniform(0.5, 1.0, size=(B, T, H)).astype("float32")
    mu0, nu0 = np.abs(rng.normal(size=(B, H, 3, 4))), np.abs(rng.normal(size=(B, H, 3)))
    values = np.concatenate([v, np.ones_like(v[..., :1])], axis=-1)
    state = np.concatenate([mu0, nu0[..., None]], axis=-1).astype("float32")
    mixed, last = causal_linear_attention(qf, kf, values, np.log(a), 1.0 - a, state, chunk_size)
    expected, (mu, nu) = ref.linear_attention(qf, kf, v, True, decay=a, state=(mu0, nu0))
    mixed = to_float64(mixed)
    np.testing.assert_allclose(mixed[..., :-1] / mixed[..., -1:], expected, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(to_float64(last), np.concatenate([mu, nu[..., None]], -1), atol=1e-5,
                               rtol=1e-5)


def test_fully_padded_rows_give_zeros_not_nan(rng):
    """Rows without a valid key (a fully padded sequence; the left padding of a causal pass)
    read zeros: the output is the output projection's bias."""
    x = random_normal(rng, (B, T, D))
    mask = np.zeros((B, T), bool)
    mask[1, 4:] = True  # row 1 is left-padded
    for causal, decay, size in ((False, None, None), (True, "gated", None), (True, "gated", 2)):
        layer = LinearAttention(H, feature_map="relu", decay=decay, key_convolution=size,
                                bias_initializer="ones")
        out = to_float64(layer(x, padding_mask=mask, use_causal_mask=causal))
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out[0], np.ones((T, D)), atol=1e-6)
        if causal:
            np.testing.assert_allclose(out[1, :4], np.ones((4, D)), atol=1e-6)
            expected, _ = _reference(layer, x, True, mask)
            np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4)


def test_redraw_draws_new_features_when_training(rng):
    x = random_normal(rng, (B, T, D))
    layer = LinearAttention(H, feature_map="random_features", redraw=True, seed=4)
    inference = to_float64(layer(x))
    fixed = to_float64(layer.projection).copy()
    np.testing.assert_allclose(to_float64(layer(x)), inference)
    layer(x, training=True)
    first = to_float64(layer.projection).copy()
    layer(x, training=True)
    assert not np.allclose(first, fixed) and not np.allclose(first, to_float64(layer.projection))
    # Inference uses the stored (last drawn) projection, exactly as the reference does.
    expected, _ = _reference(layer, x, causal=False)
    np.testing.assert_allclose(to_float64(layer(x)), expected, atol=2e-5, rtol=1e-4)


def test_config_weights_fit_and_saving(rng, tmp_path):
    x = random_normal(rng, (B, T, D))

    def make(**kwargs):
        return LinearAttention(H, feature_map="random_features", num_features=6,
                               decay="gated", causal=True, seed=2, **kwargs)

    layer = make()
    layer.build(x.shape)
    checks.check_config_round_trip(layer)
    dh = D // H
    gate = D * H + H
    assert checks.count_params(layer) == 3 * (D * H * dh + H * dh) + (H * dh * D + D) + gate + dh * 6
    assert len(layer.trainable_weights) == 10 and len(layer.non_trainable_weights) == 1

    model = checks.wrap_in_model(make(), [x], {"padding_mask": padding_mask(LENGTHS, T)})
    inputs = checks.model_inputs([x], {"padding_mask": padding_mask(LENGTHS, T)})
    checks.check_fit_step(model, inputs)
    projection = next(w for w in model.weights if "projection" in w.path)
    loaded = checks.check_saving(model, inputs, tmp_path)
    kept = next(w for w in loaded.weights if "projection" in w.path)
    # The fixed features, exactly.
    np.testing.assert_array_equal(to_float64(kept), to_float64(projection))


def test_key_convolution_weights_config_and_saving(rng, tmp_path):
    x = random_normal(rng, (B, T, D))

    def make():
        return LinearAttention(H, decay="gated", causal=True, key_convolution=3,
                               key_convolution_initializer="ones")

    layer = make()
    layer.build(x.shape)
    checks.check_config_round_trip(layer)
    dh = D // H
    assert tuple(layer.key_convolution_kernel.shape) == (3, H, dh)
    np.testing.assert_array_equal(to_float64(layer.key_convolution_kernel), np.ones((3, H, dh)))
    plain = LinearAttention(H, decay="gated", causal=True)
    plain.build(x.shape)
    assert checks.count_params(layer) == checks.count_params(plain) + 3 * H * dh
    # The default initializer: uniform in ±1/√K.
    default = LinearAttention(H, key_convolution=4)
    default.build(x.shape)
    assert np.abs(to_float64(default.key_convolution_kernel)).max() <= 0.5
    model = checks.wrap_in_model(make(), [x], {"padding_mask": padding_mask(LENGTHS, T)})
    inputs = checks.model_inputs([x], {"padding_mask": padding_mask(LENGTHS, T)})
    checks.check_fit_step(model, inputs)
    checks.check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x = random_normal(rng, (B, T, D))

    def make(dtype):
        return LinearAttention(H, feature_map="random_features", decay="gated", causal=True,
                               chunk_size=3, seed=0, key_convolution=2, dtype=dtype)

    checks.check_mixed_precision(make, [x], {"padding_mask": padding_mask(LENGTHS, T)},
                                 policy=policy)
    layer = make(policy)
    layer.build(x.shape)
    outputs, state = layer(x, cache=layer.init_cache(B, T, "float16"), cache_index=0)
    assert [keras.backend.standardize_dtype(s.dtype) for s in state] == ["float32"] * 3
    reference = LinearAttention(H, feature_map="random_features", decay="gated", causal=True,
                                chunk_size=3, seed=0, key_convolution=2)
    reference.build(x.shape)
    reference.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_float64(outputs), to_float64(reference(x)), atol=0.05, rtol=0.05)


@checks.xla_only
def test_jit_compile_and_redraw_in_compiled_steps(rng):
    x = random_normal(rng, (B, T, D))
    layer = LinearAttention(H, feature_map="random_features", redraw=True, decay="gated",
                            causal=True, chunk_size=3, seed=5)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding_mask(LENGTHS, T)})
    inputs = checks.model_inputs([x], {"padding_mask": padding_mask(LENGTHS, T)})
    checks.check_jit_compile(model, inputs)
    first = to_float64(layer.projection).copy()
    model.fit(inputs, np.zeros((B, T, D)), epochs=1, batch_size=B, verbose=0)
    assert not np.allclose(first, to_float64(layer.projection)), "no redraw in the compiled step"


@pytest.mark.skipif(checks.BACKEND != "tensorflow",
                    reason="only TensorFlow traces functions with an unknown sequence length")
@pytest.mark.parametrize("decay, key_convolution", [(None, None), ("gated", None), ("gated", 3)])
def test_unknown_length_in_a_tensorflow_trace(rng, decay, key_convolution):
    import tensorflow as tf

    x = random_normal(rng, (B, T, D))
    layer = LinearAttention(H, decay=decay, causal=True, chunk_size=3,
                            key_convolution=key_convolution)
    layer.build(x.shape)
    state = layer.init_cache(B, T)
    _, state = layer(x[:, :2], cache=state, cache_index=0)
    expected, expected_state = layer(x[:, 2:], cache=state, cache_index=2)
    spec = tf.TensorSpec([None, None, D])
    traced = tf.function(lambda t, *cache: layer(t, cache=cache, cache_index=2),
                         input_signature=[spec] + [tf.TensorSpec(None)] * len(state))
    actual, actual_state = traced(x[:, 2:], *state)
    np.testing.assert_allclose(to_float64(actual), to_float64(expected), atol=1e-5, rtol=1e-5)
    for got, wanted in zip(actual_state, expected_state):
        np.testing.assert_allclose(to_float64(got), to_float64(wanted), atol=1e-5, rtol=1e-5)


def _lm(**mixer):
    block = TransformerBlock(LinearAttention(H, causal=True, chunk_size=4, **mixer),
                             FeedForward(FFN), norm_placement="pre")
    return causal_lm(block=block)


def test_causal_lm_cached_decoding_equals_full_pass(rng):
    keras.utils.set_random_seed(1)
    lm = randomize_embeddings(_lm(feature_map="elu", decay="gated", key_convolution=3))
    batch = token_batch(rng)
    ids = batch["token_ids"]
    full = to_float64(lm.predict(batch, verbose=0))
    cache = lm.init_cache(B, ids.shape[1])
    logits, _, cache = lm.call_with_cache(ids[:, :2], cache, 0)
    steps = [to_float64(logits)]
    for t in range(2, ids.shape[1]):
        logits, _, cache = lm.call_with_cache(ids[:, t:t + 1], cache, t)
        steps.append(to_float64(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4, rtol=1e-4)
    # The compiled generation loop (state carried through `keras.ops.while_loop`, a traced
    # step on PyTorch) gives the greedy continuation computed here one token at a time.
    prompts = np.array([[3, 4, 5], [6, 7, 8]], "int32")
    generated = lm.generate(prompts, max_length=T)
    tokens, cache = prompts, lm.init_cache(B, T)
    for t in range(T - 1):
        logits, _, cache = lm.call_with_cache(tokens[:, t:t + 1], cache, t)
        if t + 1 >= prompts.shape[1]:
            tokens = np.concatenate([tokens, to_float64(logits[:, -1]).argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(generated, tokens)


def test_causal_lm_trains(rng):
    lm = _lm(feature_map="random_features", redraw=True, decay="learned")
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    batch = token_batch(rng)
    labels = np.roll(batch["token_ids"], -1, axis=1)
    losses = lm.fit(batch, labels, epochs=4, batch_size=B, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(feature_map="softmax"), "feature_map"),
        (dict(feature_map="random_features", num_features=0), "num_features"),
        (dict(feature_map="random_features", num_features=-3), "num_features"),
        (dict(feature_map="elu", num_features=8), "num_features"),
        (dict(feature_map="elu", redraw=True), "redraw"),
        (dict(decay=1.0), "decay"),
        (dict(decay=0.0), "decay"),
        (dict(decay=[0.5]), "decay"),
        (dict(decay="sometimes"), "decay"),
        (dict(decay="learned", decay_init=1.5), "decay_init"),
        (dict(feature_map="identity"), "normalize"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(epsilon=0.0), "epsilon"),
        (dict(key_convolution=0), "key_convolution"),
        (dict(key_convolution=2.0), "key_convolution"),
        (dict(key_convolution=True), "key_convolution"),
        (dict(epsilon=-1), "epsilon"),
        (dict(epsilon="x"), "epsilon"),
        (dict(kernel_initializer="not_an_initializer"), "kernel_initializer"),
        (dict(bias_initializer=3), "bias_initializer"),
        (dict(key_convolution=3, key_convolution_initializer="nope"),
         "key_convolution_initializer"),
        (dict(num_heads=True), "num_heads"),
        (dict(head_dim=0), "head_dim"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    kwargs = {"num_heads": H, **kwargs}
    with pytest.raises(ValueError, match=match):
        LinearAttention(**kwargs)


def test_bad_calls_raise(rng):
    x = random_normal(rng, (B, T, D))
    with pytest.raises(ValueError, match="decay"):
        LinearAttention(H, decay=0.5)(x, use_causal_mask=False)
    layer = LinearAttention(H, causal=True)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((B, T, T), bool))
    with pytest.raises(ValueError, match="use_causal_mask"):
        layer(x, cache=layer.init_cache(B, T), cache_index=0, use_causal_mask=False)
    with pytest.raises(ValueError, match="num_heads"):
        LinearAttention(3)(x)


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
@pytest.mark.parametrize("causal", [True, False])
def test_bad_padding_mask_raises(rng, causal, mask):
    layer = LinearAttention(H, causal=causal)
    raises_naming("padding_mask", lambda: layer(random_normal(rng, (B, T, D)), padding_mask=mask))


@pytest.mark.parametrize("key_convolution", [None, 3])
def test_bad_inputs_and_cache_raise(rng, key_convolution):
    layer = LinearAttention(H, causal=True, key_convolution=key_convolution)
    layer(random_normal(rng, (B, T, D)))
    step = random_normal(rng, (B, T, D))[:, :1]
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T, D + 2)).astype("float32")))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, D)).astype("float32")))
    cache = layer.init_cache(B)
    wrong_batch = tuple(np.zeros((B + 1,) + tuple(c.shape[1:]), "float32") for c in cache)
    for bad in (cache[:1], cache + cache[:1], wrong_batch, cache[0]):
        raises_naming("cache", lambda: layer(step, cache=bad, cache_index=0))
