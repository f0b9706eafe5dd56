"""`grouped_matmul`, the experts' matmuls of the grouped dispatch: `x[g] @ w[g]` per group,
on every backend (one `MatMul` per group on TensorFlow, a batched matmul elsewhere)."""

import keras
import numpy as np
import pytest

from keras_xf.ops.moe import grouped_matmul
from tests import layer_checks as checks


@pytest.mark.parametrize("groups", [1, 3, 65])  # 65: past TensorFlow's per-group form
def test_grouped_matmul_multiplies_each_group_by_its_own_matrix(rng, groups):
    x = rng.normal(size=(groups, 4, 3)).astype("float32")
    w = rng.normal(size=(groups, 3, 2)).astype("float32")
    result = grouped_matmul(keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(w))
    np.testing.assert_allclose(checks.to_numpy(result), np.einsum("gra,gab->grb", x, w),
                               rtol=1e-5, atol=1e-5)
