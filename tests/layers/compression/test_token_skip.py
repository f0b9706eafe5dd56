"""TokenSkip: a learned per-token skip decision around one encoder layer (survey §5.6)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.layers import ClassificationHead
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Pooling
from keras_xf.layers import TokenAndPositionEmbedding
from keras_xf.layers import TokenSkip
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import check_bad_padding_mask
from tests.layers.bad_inputs import check_bad_sequence_inputs
from tests.layers.bad_inputs import raises_naming
from tests.layers.blocks.test_transformer_block import make_block
from tests.layers.blocks.test_transformer_block import numpy_block
from tests.layers.blocks.test_transformer_block import randomize_weights
from tests.reference import token_skip as ref

B, T, D = 3, 6, 8  # D: the width of test_transformer_block's blocks


class _Recorder(keras.layers.Layer):
    """A block that doubles its inputs and records the shape it was called with."""

    def call(self, inputs, padding_mask=None, training=None):
        self.seen = tuple(inputs.shape)
        return inputs * 2.0


class _Pair(keras.layers.Layer):
    def call(self, inputs, padding_mask=None, training=None):
        return inputs, inputs


def _layer(rng, x, **kwargs):
    """A built TokenSkip around a post-norm block, every weight random (scores spread)."""
    layer = TokenSkip(make_block(), **kwargs)
    layer.build(x.shape)
    randomize_weights(layer.block, rng)
    layer.kernel.assign(rng.normal(size=(D,)).astype("float32"))
    layer.bias.assign(np.float32(0.2))
    return layer


def _scores(layer, x):
    return x.astype("float64") @ to_float64(layer.kernel) + float(to_float64(layer.bias))


def _numpy_layer(layer):
    return lambda rows, mask: numpy_block(layer.block, rows, padding=mask)


@pytest.mark.parametrize("gate,training", [
    ("straight_through", False), ("straight_through", True), ("multiply", False),
    ("multiply", True),
])
@pytest.mark.parametrize("capacity,threshold,lengths", [
    (0.5, 0.5, None), (0.5, 0.5, (6, 2, 0)), (0.3, 0.4, (5, 4, 1)), (1.0, 0.5, (6, 3, 0)),
    (1.0, 0.6, None), (0.1, 0.5, (1, 6, 6)),
])
def test_matches_reference(gate, training, capacity, threshold, lengths):
    rng = np.random.default_rng(0)
    x = random_normal(rng, (B, T, D))
    mask = None if lengths is None else padding_mask(lengths, T)
    layer = _layer(rng, x, capacity=capacity, threshold=threshold, gate=gate)
    expected, expected_processed = ref.token_skip(
        x.astype("float64"), _scores(layer, x), _numpy_layer(layer), capacity, threshold,
        mask, gate, training)
    results = layer(x, padding_mask=mask, training=training, return_processed=True)
    outputs, processed = (checks.to_numpy(results[k]) for k in ("outputs", "processed"))
    np.testing.assert_array_equal(processed, expected_processed)
    np.testing.assert_allclose(outputs, expected, atol=2e-5)
    # Skipped tokens, padding among them, pass through exactly.
    np.testing.assert_array_equal(outputs[~processed], x[~processed])
    if mask is not None:
        assert not np.any(processed & ~mask)
    assert np.all(np.isfinite(outputs))


def test_the_block_runs_on_the_capacity_only():
    """`k = ⌈c·n⌉` gathered tokens reach the block, whatever their scores."""
    rng = np.random.default_rng(1)
    x = random_normal(rng, (B, T, D))
    block = _Recorder()
    layer = TokenSkip(block, capacity=0.3, threshold=1.0)
    results = layer(x, return_processed=True)
    assert block.seen == (B, 2, D)
    processed = checks.to_numpy(results["processed"])
    np.testing.assert_array_equal(processed.sum(axis=1), [2, 2, 2])
    outputs = checks.to_numpy(results["outputs"])
    np.testing.assert_allclose(outputs, np.where(processed[:, :, None], 2 * x, x), atol=1e-6)
    # The processed tokens are the two of highest score.
    scores = _scores(layer, x)
    top = np.sort(np.argsort(-scores, axis=1)[:, :2], axis=1)
    np.testing.assert_array_equal(np.sort(np.nonzero(processed)[1].reshape(B, 2), axis=1), top)


@pytest.mark.parametrize("training", [False, True])
def test_full_capacity_never_skipping_is_the_plain_block(training):
    rng = np.random.default_rng(2)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((6, 4, 1), T)
    layer = _layer(rng, x, capacity=1.0, threshold=1.0)
    outputs = checks.to_numpy(layer(x, padding_mask=mask, training=training))
    plain = checks.to_numpy(layer.block(x, padding_mask=mask, training=training))
    np.testing.assert_allclose(outputs[mask], plain[mask], atol=1e-6)
    np.testing.assert_array_equal(outputs[~mask], x[~mask])


@pytest.mark.parametrize("gate", ["straight_through", "multiply"])
def test_fully_padded_rows(gate):
    rng = np.random.default_rng(3)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((0, 3, 0), T)
    layer = _layer(rng, x, capacity=0.5, gate=gate, target_rate=0.5)
    for training in (False, True):
        results = layer(x, padding_mask=mask, training=training, return_processed=True)
        outputs = checks.to_numpy(results["outputs"])
        assert np.all(np.isfinite(outputs))
        np.testing.assert_array_equal(outputs[[0, 2]], x[[0, 2]])
        assert not checks.to_numpy(results["processed"])[[0, 2]].any()
    all_padded = np.zeros((B, T), bool)
    np.testing.assert_array_equal(checks.to_numpy(layer(x, padding_mask=all_padded)), x)
    assert np.isfinite(checks.to_numpy(layer.losses[0]))


@pytest.mark.parametrize("gate", ["straight_through", "multiply"])
def test_scorer_gradient_matches_reference(gate):
    """`∂L/∂s_i = σ′(s_i)⟨∂L/∂h′_i, f(h)_i − h_i⟩` reaches `w` and `b` (under `jax.jit` /
    `tf.function(jit_compile=True)`, eager on PyTorch)."""
    rng = np.random.default_rng(4)
    x = random_normal(rng, (B, T, D))
    upstream = random_normal(rng, (B, T, D))
    mask = padding_mask((6, 3, 0), T)
    layer = _layer(rng, x, capacity=0.7, threshold=0.5, gate=gate)
    others = [v for v in layer.trainable_variables if v is not layer.kernel and v is not layer.bias]

    def loss(kernel, bias, inputs, weights):
        values = [kernel if v is layer.kernel else bias if v is layer.bias else v
                  for v in layer.trainable_variables]
        outputs, _ = layer.stateless_call(values, layer.non_trainable_variables, inputs,
                                          padding_mask=mask, training=True)
        return ops.sum(ops.cast(outputs, "float32") * weights)

    kernel, bias = checks.to_numpy(layer.kernel), np.asarray(checks.to_numpy(layer.bias))
    _, grads = checks.value_and_gradients(loss, [kernel, bias, x, upstream])
    expected = ref.scorer_gradient(x.astype("float64"), _scores(layer, x), _numpy_layer(layer),
                                   0.7, 0.5, upstream.astype("float64"), mask, gate)
    assert others and np.any(expected != 0)
    np.testing.assert_allclose(grads[1], expected.sum(), atol=1e-4)
    np.testing.assert_allclose(grads[0], np.einsum("bn,bnd->d", expected, x), atol=1e-4)


def test_rate_loss():
    rng = np.random.default_rng(5)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((6, 3, 1), T)
    layer = _layer(rng, x, target_rate=0.25, rate_loss_weight=0.5)
    layer(x, padding_mask=mask)
    assert len(layer.losses) == 1
    expected = ref.rate_loss(_scores(layer, x), 0.25, 0.5, mask)
    np.testing.assert_allclose(checks.to_numpy(layer.losses[0]), expected, rtol=1e-5)
    quiet = _layer(rng, x)
    quiet(x, padding_mask=mask)
    assert not quiet.losses


def _model(layer):
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    return keras.Model([x, mask], layer(x, padding_mask=mask))


@pytest.mark.parametrize("gate", ["straight_through", "multiply"])
def test_fit_trains_the_scorer(gate):
    rng = np.random.default_rng(6)
    layer = TokenSkip(make_block(), capacity=0.5, gate=gate, target_rate=0.5)
    model = _model(layer)
    before = [checks.to_numpy(w).copy() for w in (layer.kernel, layer.bias)]
    checks.check_fit_step(model, [random_normal(rng, (B, T, D)), padding_mask((6, 3, 0), T)])
    for old, new in zip(before, (layer.kernel, layer.bias)):
        assert not np.allclose(old, checks.to_numpy(new)), "fit did not train the scorer"


def test_config_and_saving(tmp_path):
    rng = np.random.default_rng(7)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3, 0), T)]
    layer = TokenSkip(make_block(), capacity=0.5, threshold=0.4, gate="multiply",
                      target_rate=0.3, rate_loss_weight=0.1)
    clone = checks.check_config_round_trip(layer)
    assert (clone.capacity, clone.threshold, clone.gate) == (0.5, 0.4, "multiply")
    assert isinstance(clone.block, TransformerBlock) and clone.block is not layer.block
    model = _model(layer)
    assert checks.count_params(layer) == checks.count_params(layer.block) + D + 1
    randomize_weights(layer, rng)
    loaded = checks.check_saving(model, inputs, tmp_path)
    assert isinstance(loaded.layers[-1], TokenSkip)


@checks.xla_only
def test_jit_compile():
    rng = np.random.default_rng(8)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3, 0), T)]
    checks.check_jit_compile(_model(TokenSkip(make_block(), capacity=0.5, target_rate=0.5)),
                             inputs)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    rng = np.random.default_rng(9)
    checks.check_mixed_precision(lambda **kw: TokenSkip(make_block(), capacity=0.5, **kw),
                                 [random_normal(rng, (B, T, D))], policy=policy)


def test_encoder_classifier_with_token_skip_trains_and_saves(tmp_path):
    """The docstring's composition: embeddings, TokenSkip layers, pooling and a head."""
    rng = np.random.default_rng(10)
    length, vocabulary = 8, 20
    ids = keras.Input((length,), dtype="int32", name="token_ids")
    mask = keras.Input((length,), dtype="bool", name="padding_mask")
    hidden = TokenAndPositionEmbedding(vocabulary, D, max_sequence_length=length)(ids)
    skips = []
    for _ in range(2):
        block = TransformerBlock(MultiHeadAttention(2), FeedForward(16), norm_placement="pre")
        skips.append(TokenSkip(block, capacity=0.5, target_rate=0.5))
        hidden = skips[-1](hidden, padding_mask=mask)
    logits = ClassificationHead(3)(Pooling("mean")(hidden, padding_mask=mask))
    model = keras.Model([ids, mask], logits)
    token_ids = rng.integers(1, vocabulary, size=(4, length)).astype("int32")
    masks = padding_mask((8, 5, 3, 8), length)
    labels = np.array([0, 1, 2, 1])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = checks.to_numpy(skips[0].kernel).copy()
    history = model.fit([token_ids, masks], labels, epochs=2, batch_size=4, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert not np.allclose(before, checks.to_numpy(skips[0].kernel))
    checks.check_saving(model, [token_ids, masks], tmp_path, atol=1e-5)


@pytest.mark.parametrize("kwargs,name", [
    (dict(capacity=0), "capacity"),
    (dict(capacity=1.5), "capacity"),
    (dict(capacity=True), "capacity"),
    (dict(threshold=-0.1), "threshold"),
    (dict(threshold=1.1), "threshold"),
    (dict(threshold="half"), "threshold"),
    (dict(gate="hard"), "gate"),
    (dict(target_rate=2.0), "target_rate"),
    (dict(rate_loss_weight=-1.0), "rate_loss_weight"),
    (dict(kernel_initializer="nope"), "kernel_initializer"),
])
def test_bad_arguments(kwargs, name):
    raises_naming(name, lambda: TokenSkip(make_block(), **kwargs))


def test_bad_block():
    raises_naming("block", lambda: TokenSkip("a block"))
    x = np.zeros((B, T, D), "float32")
    raises_naming("block", lambda: TokenSkip(_Pair())(x))


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    check_bad_padding_mask(TokenSkip(make_block()), mask, (B, T, D))


def test_bad_inputs():
    check_bad_sequence_inputs(lambda: TokenSkip(make_block(), capacity=0.5), (B, T, D),
                              static_length=True)
