"""Patch embedding of the Vision Transformer (survey §6.4)."""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image into `P × P` patches, flattens each and maps it linearly to `d`.

    Survey §6.4 (Vision Transformer): an `H × W × C` image is partitioned into
    `N = HW / P²` square patches of shape `P × P × C`, ordered row-major (left to right, top
    to bottom); patch `n` with pixels `x_n ∈ R^{P·P·C}` (flattened in `(row, column,
    channel)` order) becomes the token

        `e_n = x_n W + b`,   `W ∈ R^{(P·P·C) × d}`.

    This is the same map as a convolution with a `P × P` kernel and stride `P`: the kernel
    `[P, P, C, d]` reshaped to `[P·P·C, d]` is `W`. `W` and `b` are the kernel and bias of a
    `Dense` sub-layer `projection` applied to the flattened patches `[B, N, P·P·C]`, so
    `model.quantize(mode)` quantises it like every other projection. Position embeddings are
    added separately (`PatchPositionEmbedding`).

    Args:
        patch_size: int, the side `P` of the square patches.
        hidden_dim: int, the embedding width `d`.
        use_bias: bool, whether to add the bias `b`.
        kernel_initializer: initializer for `W`.
        bias_initializer: initializer for `b`.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, H, W, C]` images (channels last) with static `H`, `W` divisible by `P`
            and `C` equal to the channel count the layer was built with. Integer images are
            cast to the compute dtype.

    Returns:
        `[B, (H/P)·(W/P), hidden_dim]` patch embeddings.

    Example:
    >>> images = keras.random.uniform((2, 8, 8, 1))
    >>> PatchEmbedding(patch_size=2, hidden_dim=16)(images).shape  # (2, 16, 16)
    """

    def __init__(
        self,
        patch_size,
        hidden_dim,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        if not isinstance(use_bias, bool):
            raise ValueError(f"use_bias must be a bool. Received: use_bias={use_bias!r}")
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.channels = None

    def _grid(self, inputs_shape):
        """Validates an image shape and returns the patch grid `(H/P, W/P)`."""
        if len(inputs_shape) != 4:
            raise ValueError(
                "inputs must be images of rank 4 [batch, height, width, channels]. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        _, height, width, channels = inputs_shape
        for name, size in (("height", height), ("width", width)):
            if size is None:
                raise ValueError(
                    f"PatchEmbedding needs a static image {name}. "
                    f"Received: inputs_shape={tuple(inputs_shape)}"
                )
            if size % self.patch_size:
                raise ValueError(
                    f"The image {name} must be divisible by patch_size. Received: "
                    f"{name}={size}, patch_size={self.patch_size} "
                    f"(inputs_shape={tuple(inputs_shape)})"
                )
        if channels is None:
            raise ValueError(
                "PatchEmbedding needs a static channel count. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        if self.channels is not None and channels != self.channels:
            raise ValueError(
                "The image channel count differs from the one the layer was built with. "
                f"Received: channels={channels}, expected channels={self.channels}"
            )
        return height // self.patch_size, width // self.patch_size

    def build(self, inputs_shape):
        self._grid(inputs_shape)
        self.channels = int(inputs_shape[-1])
        patch_dim = self.patch_size * self.patch_size * self.channels
        # A `Dense`, so that `model.quantize` reaches the patch projection.
        self.projection = keras.layers.Dense(
            self.hidden_dim, use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy, name="projection",
        )
        self.projection.build((None, None, patch_dim))

    def call(self, inputs):
        rows, cols = self._grid(tuple(inputs.shape))
        p, c = self.patch_size, self.channels
        x = ops.cast(inputs, self.compute_dtype)
        x = ops.reshape(x, (-1, rows, p, cols, p, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))  # [B, rows, cols, P, P, C]
        x = ops.reshape(x, (-1, rows * cols, p * p * c))
        return self.projection(x)

    def compute_output_shape(self, inputs_shape):
        rows, cols = self._grid(tuple(inputs_shape))
        return (inputs_shape[0], rows * cols, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "hidden_dim": self.hidden_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
