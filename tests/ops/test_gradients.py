"""`vjp`: each backend's vector-Jacobian product against the gradient written out by hand."""

import keras
import numpy as np

from keras_xf.ops.gradients import vjp
from tests import layer_checks as checks


def test_vjp_gives_the_outputs_and_the_gradients_of_every_primal(rng):
    """`y = tanh(x W)`: the pullback of a cotangent `c` is `((c ⊙ (1 − y²)) Wᵀ,
    xᵀ (c ⊙ (1 − y²)))`, and zeros for a primal that does not reach `y`."""
    x = rng.normal(size=(3, 4)).astype("float32")
    w = rng.normal(size=(4, 5)).astype("float32")
    unused = rng.normal(size=(2,)).astype("float32")
    cotangent = rng.normal(size=(3, 5)).astype("float32")

    def function(x, w, unused):
        return keras.ops.tanh(keras.ops.matmul(x, w))

    outputs, pullback = vjp(function, [keras.ops.convert_to_tensor(t) for t in (x, w, unused)])
    grad_x, grad_w, grad_unused = (checks.to_numpy(g) for g in
                                   pullback(keras.ops.convert_to_tensor(cotangent)))
    y = np.tanh(x @ w)
    local = cotangent * (1 - y * y)
    np.testing.assert_allclose(checks.to_numpy(outputs), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad_x, local @ w.T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad_w, x.T @ local, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(grad_unused, np.zeros_like(unused))
