"""Vector-Jacobian products, which `keras.ops` lacks: the gradients that a reversible stack's
custom backward pass (`keras_xf.layers.blocks.ReversibleStack`) and the gradient importance
scores of `keras_xf.surgery` take from each backend's own autodiff.
"""

import keras
from keras import ops


def vjp(function, primals):
    """`(outputs, pullback)`: `outputs = function(*primals)` (one tensor) and a function that
    maps a cotangent of `outputs` to the gradients of all `primals` (zeros for a primal that
    does not reach `outputs`).

    Why not `keras.ops`: Keras has no vector-Jacobian product. A reversible stack's custom
    gradient (`keras.ops.custom_gradient`) recomputes each block's sub-layers from the
    block's outputs and needs their gradients with respect to their inputs and weights;
    each backend's own autodiff gives them (`jax.vjp`, a `tf.GradientTape`, and
    `torch.autograd.grad` with gradients enabled, as PyTorch runs a custom backward without).
    """
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        outputs, pullback = jax.vjp(function, *primals)
        return outputs, lambda cotangent: tuple(pullback(ops.cast(cotangent, outputs.dtype)))
    if backend == "tensorflow":
        import tensorflow as tf

        primals = list(primals)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for primal in primals:
                tape.watch(primal)
            outputs = function(*primals)

        def tf_pullback(cotangent):
            return tuple(tape.gradient(outputs, primals,
                                       output_gradients=ops.cast(cotangent, outputs.dtype),
                                       unconnected_gradients=tf.UnconnectedGradients.ZERO))

        return outputs, tf_pullback
    if backend == "torch":
        import torch

        with torch.enable_grad():
            leaves = [primal.detach().requires_grad_() for primal in primals]
            outputs = function(*leaves)

        def torch_pullback(cotangent):
            grads = torch.autograd.grad(outputs, leaves, ops.cast(cotangent, outputs.dtype),
                                        allow_unused=True)
            return tuple(torch.zeros_like(leaf) if grad is None else grad
                         for grad, leaf in zip(grads, leaves))

        return outputs, torch_pullback
    raise ValueError(
        "vjp (the custom gradient of reversible layers) supports the tensorflow, jax and "
        f"torch backends. Received: backend={backend!r}")
