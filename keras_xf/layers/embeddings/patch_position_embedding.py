"""Position embeddings of a grid of image patches (survey §6.4)."""

import numbers

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.positions import sinusoid_table_2d

KINDS = ("learned", "sinusoidal_2d")


def grid_shape(grid_size, name="grid_size"):
    """`(rows, cols)` from an int or a pair of positive ints; ValueError otherwise."""
    values = (grid_size, grid_size) if isinstance(grid_size, numbers.Integral) else grid_size
    try:
        values = tuple(values)
    except TypeError:
        values = ()
    if len(values) != 2 or any(
        isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0 for v in values
    ):
        raise ValueError(
            f"{name} must be a positive int or a pair (rows, cols) of positive ints. "
            f"Received: {name}={grid_size!r}"
        )
    return int(values[0]), int(values[1])


@keras.saving.register_keras_serializable(package="keras_xf")
class PatchPositionEmbedding(keras.layers.Layer):
    """Position embeddings `p_n` for the `N = rows · cols` patches of an image, `e_n + p_n`.

    Survey §6.4: each patch embedding is summed with a position embedding. Patches are
    numbered row-major (`n = r · cols + c`, as `PatchEmbedding` emits them).

    - `kind="learned"`: a trainable table `P ∈ R^{N×d}`, `p_n = P[n]` (the original ViT).
    - `kind="sinusoidal_2d"`: the fixed table `p_n = [PE_{d/2}(r), PE_{d/2}(c)]`, half the
      width encoding the row and half the column with the sinusoids of §2.2
      (`keras_xf.ops.sinusoid_table_2d`); no weights, `d` must be even.

    Args:
        grid_size: int or `(rows, cols)`, the patch grid `(H/P, W/P)`.
        kind: `"learned"` (default) or `"sinusoidal_2d"`.
        base: float, the sinusoid base `b` (`"sinusoidal_2d"`).
        initializer: initializer of the learned table.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, N, d]` patch embeddings (only the shape is used), `N = rows · cols`.

    Returns:
        `[B, N, d]` position embeddings in the compute dtype, to be added to `inputs`.

    Example:
    >>> patches = PatchEmbedding(patch_size=2, hidden_dim=16)(keras.random.uniform((2, 8, 8, 1)))
    >>> patches = patches + PatchPositionEmbedding(grid_size=4, kind="sinusoidal_2d")(patches)
    """

    def __init__(self, grid_size, kind="learned", base=10000.0, initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = grid_shape(grid_size)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}. Received: kind={kind!r}")
        check_positive_number("base", base)
        if base <= 1:
            raise ValueError(f"base must be a number greater than 1. Received: base={base!r}")
        self.kind = kind
        self.base = float(base)
        if initializer is None:
            initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        self.initializer = get_initializer("initializer", initializer)
        self.dim = None

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                "PatchPositionEmbedding expects inputs of rank 3 [batch, patches, dim] with a "
                f"static dim. Received: inputs_shape={tuple(inputs_shape)}"
            )
        self._check_length(inputs_shape[1])
        dim = int(inputs_shape[-1])
        self.dim = dim
        if self.kind == "sinusoidal_2d" and dim % 2:
            raise ValueError(
                "kind='sinusoidal_2d' needs an even embedding width (half for rows, half for "
                f"columns). Received: dim={dim}"
            )
        if self.kind == "learned":
            self.position_embeddings = self.add_weight(
                name="embeddings", shape=(self.num_patches, dim), initializer=self.initializer
            )

    def _check_length(self, length):
        if length is not None and length != self.num_patches:
            raise ValueError(
                "The number of patches must equal rows · cols of grid_size. Received: "
                f"{length} patches with grid_size={self.grid_size}"
            )

    def call(self, inputs):
        check_sequence_width(inputs, self.dim)
        self._check_length(inputs.shape[1])
        if self.kind == "learned":
            table = self.position_embeddings
        else:
            table = sinusoid_table_2d(*self.grid_size, inputs.shape[-1], self.base)
        table = ops.cast(table, self.compute_dtype)
        return ops.broadcast_to(table[None], ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "grid_size": list(self.grid_size),
                "kind": self.kind,
                "base": self.base,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
