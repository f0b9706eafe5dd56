"""Fused against three-matmul QKV projection: one `MultiHeadAttention` layer's forward and
backward (batch 8, length 256, width 256, 4 heads, causal), interleaved rounds, on the backend
that `KERAS_BACKEND` names (JAX `jit`, TensorFlow `tf.function(jit_compile=True)`, PyTorch
eager). Also counts the matmuls of the compiled step (JAX, TensorFlow) or dispatched ops
(PyTorch) to show that the fused path projects with one.

    KERAS_BACKEND=jax python -m benchmarks.fused_qkv
"""

import statistics
import time

import keras
import numpy as np

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention

BATCH, LENGTH, WIDTH, HEADS = 8, 256, 256, 4


def make_step(layer, backend):
    if backend == "jax":
        import jax

        def loss_fn(trainable, non_trainable, x):
            y, _ = layer.stateless_call(trainable, non_trainable, x, use_causal_mask=True)
            return (y.astype("float32") ** 2).mean()

        grad = jax.jit(jax.value_and_grad(loss_fn))
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def step(x):
            loss, grads = grad(trainable, non_trainable, x)
            jax.block_until_ready(grads)

        def matmuls(x):
            text = str(jax.make_jaxpr(jax.value_and_grad(loss_fn))(trainable, non_trainable, x))
            return text.count("dot_general")

        return step, matmuls
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def grad(x):
            with tf.GradientTape() as tape:
                y = layer(x, use_causal_mask=True)
                loss = tf.reduce_mean(tf.square(y))
            return loss, tape.gradient(loss, layer.trainable_variables)

        def step(x):
            loss, grads = grad(x)
            [g.numpy() for g in grads]

        def matmuls(x):
            graph = grad.get_concrete_function(x).graph
            return sum(op.type in ("MatMul", "BatchMatMulV2", "Einsum")
                       for op in graph.get_operations())

        return step, matmuls
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def step(x):
        layer.zero_grad() if hasattr(layer, "zero_grad") else None
        y = layer(x, use_causal_mask=True)
        (y ** 2).mean().backward()

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm", "matmul"):
                self.count += 1
            return func(*args, **(kwargs or {}))

    def matmuls(x):
        with Count() as counter:
            y = layer(x, use_causal_mask=True)
            (y ** 2).mean().backward()
        return counter.count

    return step, matmuls


def main(rounds=7, reps=5):
    backend = keras.backend.backend()
    x_np = np.random.default_rng(0).normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    layers, steps = {}, {}
    for fused in (True, False):
        layer = MultiHeadAttention(num_heads=HEADS, causal=True)
        layer.build((BATCH, LENGTH, WIDTH))
        if not fused:
            layer._fuses_qkv = lambda: False
        x = keras.ops.convert_to_tensor(x_np)
        if backend == "torch":
            x.requires_grad_(False)
        step, matmuls = make_step(layer, backend)
        print(f"{backend} fused={fused}: matmul ops in forward+backward = {matmuls(x)}")
        step(x)
        step(x)
        layers[fused], steps[fused] = layer, (step, x)
    times = {True: [], False: []}
    for _ in range(rounds):
        for fused in (True, False):
            step, x = steps[fused]
            start = time.perf_counter()
            for _ in range(reps):
                step(x)
            times[fused].append((time.perf_counter() - start) / reps * 1e3)
    for fused in (True, False):
        print(f"{backend} fused={fused}: median {statistics.median(times[fused]):.2f} ms, "
              f"best {min(times[fused]):.2f} ms")
    ratios = [u / f for f, u in zip(times[True], times[False])]
    print(f"{backend} unfused/fused per round: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
