"""Self-attention projects queries, keys and values with one matmul (`project_fused`): the same
outputs and gradients as the three separate projections, and only where the layout allows."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers.attention.compressed_attention import CompressedAttention
from tests import layer_checks as checks
from tests.layer_checks import random_normal

B, T, D, H = 2, 6, 16, 4


def _loss_and_gradients(layer, x, fused):
    """`mean(layer(x)²)` and its gradients with respect to `x` and every trainable weight,
    with the fused projection on or off (the same weights)."""
    if not fused:
        layer._fuses_qkv = lambda: False
    weights = [checks.to_numpy(w) for w in layer.trainable_variables]
    state = [w.value for w in layer.non_trainable_variables]

    def loss(x, *values):
        y, _ = layer.stateless_call(list(values), state, x, use_causal_mask=True)
        return ops.mean(ops.square(ops.cast(y, "float32")))

    inputs = [x] + weights
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        value, grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(inputs)))))(
            *inputs)
    elif backend == "tensorflow":
        import tensorflow as tf

        tensors = [tf.constant(v) for v in inputs]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            value = loss(*tensors)
        grads = tape.gradient(value, tensors)
    else:
        import torch

        tensors = [torch.tensor(v, requires_grad=True) for v in inputs]
        value = loss(*tensors)
        value.backward()
        grads = [t.grad for t in tensors]
    if not fused:
        del layer._fuses_qkv
    return checks.to_numpy(value), [checks.to_numpy(g) for g in grads]


class _CountProjections:
    """Counts `ops.matmul` calls with a 2-D right operand (the projections' kernels)."""

    def __init__(self, monkeypatch):
        self.count = 0
        matmul = ops.matmul

        def counting(a, b):
            if len(b.shape) == 2:
                self.count += 1
            return matmul(a, b)

        monkeypatch.setattr(ops, "matmul", counting)


@pytest.mark.parametrize("kv_heads", [H, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("rotary", [False, True])
def test_fused_outputs_and_gradients_equal_the_three_projections(rng, kv_heads, use_bias, rotary):
    layer = MultiHeadAttention(H, num_key_value_heads=kv_heads, use_bias=use_bias,
                               position=RotaryEmbedding() if rotary else None)
    x = random_normal(rng, (B, T, D))
    layer.build(x.shape)
    checks.randomize_weights(layer, rng)
    assert layer._fuses_qkv()
    fused_value, fused_grads = _loss_and_gradients(layer, x, fused=True)
    plain_value, plain_grads = _loss_and_gradients(layer, x, fused=False)
    np.testing.assert_allclose(fused_value, plain_value, rtol=1e-6, atol=1e-7)
    assert len(fused_grads) == len(plain_grads) == 1 + len(layer.trainable_variables)
    for fused, plain in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)


def test_fused_with_low_dimensional_queries_and_keys(rng):
    """`qk_dim` ≠ `head_dim`: queries, keys and values split at three different widths."""
    layer = MultiHeadAttention(H, num_key_value_heads=2, qk_dim=6)
    x = random_normal(rng, (B, T, D))
    layer.build(x.shape)
    checks.randomize_weights(layer, rng)
    fused_value, fused_grads = _loss_and_gradients(layer, x, fused=True)
    plain_value, plain_grads = _loss_and_gradients(layer, x, fused=False)
    np.testing.assert_allclose(fused_value, plain_value, rtol=1e-6, atol=1e-7)
    for fused, plain in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)


def test_self_attention_projects_with_one_matmul(rng, monkeypatch):
    layer = MultiHeadAttention(H, num_key_value_heads=2)
    x = random_normal(rng, (B, T, D))
    layer(x)
    counter = _CountProjections(monkeypatch)
    layer(x)
    assert counter.count == 2  # q|k|v, then the output projection


def test_cross_attention_keeps_three_projections(rng, monkeypatch):
    layer = MultiHeadAttention(H, num_key_value_heads=2)
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, 3, D))
    layer(x, memory)
    expected = checks.to_numpy(layer(x, memory))
    counter = _CountProjections(monkeypatch)
    outputs = layer(x, memory)
    assert counter.count == 4
    np.testing.assert_array_equal(checks.to_numpy(outputs), expected)
    counter.count = 0
    layer(x, x, key=x)  # an explicit key or value is not fused either
    assert counter.count == 4


def test_cached_decoding_matches_the_full_pass_with_fusion(rng):
    layer = MultiHeadAttention(H, num_key_value_heads=2, causal=True,
                               position=RotaryEmbedding())
    x = random_normal(rng, (B, T, D))
    layer.build(x.shape)
    checks.randomize_weights(layer, rng)
    checks.check_cached_decoding(layer, x)


def test_compression_follows_the_fused_projection(rng):
    """`CompressedAttention` reduces the keys and values after the projections, so the fused
    projection gives the outputs of the three separate ones."""
    x = random_normal(rng, (B, T, D))
    compressed = CompressedAttention(H, compressed_length=2, max_length=T)
    compressed(x)
    checks.randomize_weights(compressed, rng)
    assert compressed._fuses_qkv()
    fused = checks.to_numpy(compressed(x))
    compressed._fuses_qkv = lambda: False
    np.testing.assert_allclose(checks.to_numpy(compressed(x)), fused, rtol=1e-5, atol=1e-5)


def test_layouts_that_do_not_fuse(rng):
    x = random_normal(rng, (B, T, D))
    quantized = MultiHeadAttention(H)
    quantized(x)
    expected = checks.to_numpy(quantized(x))
    quantized.key_dense.quantize("int8")  # as `model.quantize("int8")` does to each dense
    assert not quantized._fuses_qkv()
    np.testing.assert_allclose(checks.to_numpy(quantized(x)), expected, atol=0.1)
    lora = MultiHeadAttention(H)
    lora(x)
    lora.query_dense.enable_lora(2)
    assert not lora._fuses_qkv()


@pytest.mark.skipif(keras.config.backend() != "jax", reason="keras.distribution is JAX's")
def test_model_parallel_keeps_three_projections(rng):
    """Head-sharded kernels stay three local matmuls (a concatenation would gather them)."""
    import jax

    layer = MultiHeadAttention(H)
    layer(random_normal(rng, (B, T, D)))
    mesh = keras.distribution.DeviceMesh((1, len(jax.devices())), ("batch", "model"))
    layout = keras.distribution.LayoutMap(mesh)
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout))
    try:
        assert not layer._fuses_qkv()
    finally:
        keras.distribution.set_distribution(previous)
    assert layer._fuses_qkv()
