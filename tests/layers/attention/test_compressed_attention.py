import keras
import numpy as np
import pytest

from keras_xf.layers import CompressedAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import ProductKeyMemory
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import LENGTH
from tests.models.tiny import causal_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch
from tests.reference import compressed as ref

B, T, D = 2, 8, 16

PROJECTION = dict(method="projection", compressed_length=4, max_length=10)
CONVOLUTION = dict(method="convolution", stride=3)
CONVOLUTION_BY_LENGTH = dict(method="convolution", compressed_length=4, max_length=8)
SELECTION = dict(method="selection", compressed_length=3)


def _weights(layer):
    names = {"wq": "query", "wk": "key", "wv": "value", "wo": "output"}
    denses = {
        "query": layer.query_dense,
        "key": layer.key_dense,
        "value": layer.value_dense,
        "output": layer.output_dense,
    }
    weights = {key: to_float64(denses[name].kernel) for key, name in names.items()}
    if layer.use_bias:
        weights.update({"b" + key[1]: to_float64(denses[name].bias) for key, name in names.items()})
    return weights


def _compression(layer):
    if layer.method == "projection":
        return to_float64(layer.key_compression), to_float64(layer.value_compression)
    if layer.method == "convolution":
        bias = lambda b: None if b is None else to_float64(b)  # noqa: E731
        return (
            to_float64(layer.key_compression),
            bias(layer.key_compression_bias),
            to_float64(layer.value_compression),
            bias(layer.value_compression_bias),
        )
    return None


def _reference(layer, x, memory=None, padding=None, causal=False):
    return ref.compressed_attention(
        x,
        x if memory is None else memory,
        _weights(layer),
        layer.num_heads,
        layer.method,
        _compression(layer),
        padding_mask=padding,
        num_key_value_heads=layer.num_key_value_heads,
        stride=layer.window if layer.method == "convolution" else None,
        compressed_length=layer.compressed_length,
        causal=causal,
    )


@pytest.mark.parametrize(
    "config,kv_heads,causal",
    [
        (PROJECTION, 2, False),
        (dict(PROJECTION, use_bias=False), 1, False),
        (CONVOLUTION, 2, False),
        (CONVOLUTION_BY_LENGTH, 1, False),
        (SELECTION, 2, False),
        (SELECTION, 1, True),
    ],
)
def test_matches_reference_with_padding(rng, config, kv_heads, causal):
    layer = CompressedAttention(num_heads=2, num_key_value_heads=kv_heads, **config)
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([8, 4], T)
    layer(x)
    randomize_weights(layer, rng)
    expected, expected_weights = _reference(layer, x, padding=padding, causal=causal)
    out = layer(x, padding_mask=padding, use_causal_mask=causal)
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    out, weights = checks.split_scores(layer(
        x, padding_mask=padding, use_causal_mask=causal, return_attention_scores=True
    ))
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(weights), expected_weights, atol=1e-5)


@pytest.mark.parametrize("config", [PROJECTION, CONVOLUTION])
def test_cross_attention_matches_reference(rng, config):
    layer = CompressedAttention(num_heads=2, **config)
    x, memory = random_normal(rng, (B, 5, D)), random_normal(rng, (B, T, 12))
    padding = padding_mask([7, 2], T)
    layer(x, memory)
    randomize_weights(layer, rng)
    expected, _ = _reference(layer, x, memory, padding=padding)
    out = layer(x, memory, padding_mask=padding)
    assert tuple(out.shape) == (B, 5, D)
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)


def test_selection_of_every_key_is_full_attention(rng):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([8, 5], T)
    full = MultiHeadAttention(num_heads=2)
    selection = CompressedAttention(num_heads=2, method="selection", compressed_length=T)
    full(x), selection(x)
    selection.set_weights(full.get_weights())
    np.testing.assert_allclose(
        checks.to_numpy(selection(x, padding_mask=padding, use_causal_mask=True)),
        checks.to_numpy(full(x, padding_mask=padding, use_causal_mask=True)),
        atol=1e-5,
    )


def test_selection_cached_decoding_equals_full_causal_pass(rng):
    layer = CompressedAttention(num_heads=2, num_key_value_heads=1, **SELECTION)
    x = random_normal(rng, (B, T, D))
    checks.check_cached_decoding(layer, x, prefill=4, cache_length=T + 2)


@pytest.mark.parametrize(
    "config,extra",
    [
        (PROJECTION, 2 * 4 * 10),
        (CONVOLUTION, 2 * (3 * D * D + D)),
        (dict(CONVOLUTION, use_bias=False), 2 * 3 * D * D),
        (SELECTION, 0),
    ],
)
def test_exact_weight_count(config, extra):
    layer = CompressedAttention(num_heads=2, **config)
    layer.build((B, T, D))
    base = MultiHeadAttention(num_heads=2, use_bias=layer.use_bias)
    base.build((B, T, D))
    assert checks.count_params(layer) == checks.count_params(base) + extra


def test_config_round_trip_fit_and_saving(rng, tmp_path):
    # One functional model holding the three methods: one fit step, one `.keras` round trip.
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([8, 3], T)
    layers = [
        CompressedAttention(num_heads=2, num_key_value_heads=1, dropout=0.1, **config)
        for config in (PROJECTION, CONVOLUTION, SELECTION)
    ]
    inputs = keras.Input((T, D)), keras.Input((T,), dtype="bool")
    hidden = inputs[0]
    for layer in layers:
        checks.check_config_round_trip(layer)
        hidden = layer(hidden, padding_mask=inputs[1])
        clone = checks.check_config_round_trip(layer)  # built: head_dim resolved
        assert (clone.method, clone.window if clone.method == "convolution" else None) == (
            layer.method, layer.window if layer.method == "convolution" else None)
    model = keras.Model(inputs, hidden)
    checks.check_fit_step(model, [x, padding])
    checks.check_saving(model, [x, padding], tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("config", [PROJECTION, CONVOLUTION, SELECTION])
def test_mixed_precision_and_fully_padded_rows(rng, policy, config):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([8, 0], T)
    out, weights = checks.split_scores(checks.check_mixed_precision(
        lambda **kw: CompressedAttention(num_heads=2, **config, **kw),
        [x],
        {"padding_mask": padding, "return_attention_scores": True},
        policy=policy,
    ))
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    np.testing.assert_array_equal(checks.to_numpy(weights)[1], 0.0)
    np.testing.assert_array_equal(checks.to_numpy(out)[1], 0.0)


@checks.xla_only
@pytest.mark.parametrize(
    "config,causal", [(PROJECTION, False), (CONVOLUTION, False), (SELECTION, True)]
)
def test_jit_compile(rng, config, causal):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([8, 5], T)
    layer = CompressedAttention(num_heads=2, **config)
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding, "use_causal_mask": causal})
    checks.check_jit_compile(model, [x, padding])


def _train(model, x, y, steps=4):
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = [float(model.train_on_batch(x, y)[0]) for _ in range(steps)]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize(
    "method", [dict(PROJECTION, max_length=LENGTH), CONVOLUTION], ids=["projection", "convolution"])
def test_text_classifier_with_compressed_attention_trains(rng, method):
    attention = CompressedAttention(num_heads=2, **method)
    model = text_classifier(block=TransformerBlock(attention, FeedForward(FFN)))
    _train(model, token_batch(rng, lengths=[8, 5]), np.array([0, 1], "int32"))


def test_causal_lm_with_selection_and_memory_trains(rng):
    # Selection attention is causal; the product-key memory is the block's feedforward.
    mixer = CompressedAttention(num_heads=2, **SELECTION)
    block = TransformerBlock(mixer, ProductKeyMemory(num_keys=8, top_k=4))
    model = causal_lm(block=block, num_layers=1)
    memory = model.backbone.transformer_stack.blocks[0].feedforward
    before = checks.to_numpy(memory.values.embeddings).copy()
    x = token_batch(rng, lengths=[8, 6])
    _train(model, x, np.roll(x["token_ids"], -1, axis=1))
    assert not np.allclose(checks.to_numpy(memory.values.embeddings), before)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"method": "lowrank", "compressed_length": 4}, "method='lowrank'"),
        ({"compressed_length": 0, "max_length": 8}, "compressed_length=0"),
        ({"compressed_length": -2, "max_length": 8}, "compressed_length=-2"),
        ({"compressed_length": 9, "max_length": 8}, "compressed_length=9, max_length=8"),
        ({"compressed_length": 4}, "max_length=None"),
        ({"method": "selection"}, "compressed_length=None"),
        ({"method": "selection", "compressed_length": 9, "max_length": 8}, "compressed_length=9"),
        ({"method": "convolution", "compressed_length": 3, "max_length": 8}, "compressed_length=3"),
        ({"method": "convolution"}, "stride=None"),
        ({"method": "convolution", "stride": 0}, "stride=0"),
        ({"method": "selection", "compressed_length": 2, "stride": 2}, "stride=2"),
        ({"compressed_length": 4, "max_length": 8, "causal": True}, "causal=True"),
        ({"method": "convolution", "stride": 2, "causal": True}, "causal=True"),
        ({"compressed_length": 4, "max_length": 8, "pattern": keras.layers.Identity()}, "pattern"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompressedAttention(num_heads=2, **kwargs)


@pytest.mark.parametrize("config", [PROJECTION, CONVOLUTION])
def test_length_compression_refuses_causal_cache_and_attention_mask(rng, config):
    layer = CompressedAttention(num_heads=2, **config)
    x = random_normal(rng, (B, T, D))
    layer(x)
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        layer(x, use_causal_mask=True)
    with pytest.raises(ValueError, match="cache_index=0"):
        layer(x, cache=layer.init_cache(B, T), cache_index=0)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(x, attention_mask=np.ones((B, T, T), bool))


def test_longer_input_than_max_length_raises(rng):
    layer = CompressedAttention(num_heads=2, **PROJECTION)
    with pytest.raises(ValueError, match="max_length=10"):
        layer(random_normal(rng, (B, 12, D)))
