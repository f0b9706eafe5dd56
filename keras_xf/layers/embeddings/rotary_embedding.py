"""Rotary position embeddings (RoPE): positions as rotations of queries and keys (survey §6)."""

import keras
from keras import ops

from keras_xf.layers.attention.position_hook import PositionHook
from keras_xf.ops.checks import check_positions
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rank
from keras_xf.ops.positions import FREQUENCY_SCALING_KEYS
from keras_xf.ops.positions import apply_rotary


def _check_frequency_scaling(scaling):
    if scaling is None:
        return None
    if not isinstance(scaling, dict) or set(scaling) != set(FREQUENCY_SCALING_KEYS):
        raise ValueError(
            f"frequency_scaling must be None or a dict with the keys {FREQUENCY_SCALING_KEYS}. "
            f"Received: frequency_scaling={scaling!r}"
        )
    for key in FREQUENCY_SCALING_KEYS:
        check_positive_number(f"frequency_scaling['{key}']", scaling[key])
    if scaling["factor"] < 1 or scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ValueError(
            "frequency_scaling needs factor >= 1 and high_freq_factor > low_freq_factor. "
            f"Received: frequency_scaling={scaling!r}"
        )
    return {key: float(scaling[key]) for key in FREQUENCY_SCALING_KEYS}


@keras.saving.register_keras_serializable(package="keras_xf")
class RotaryEmbedding(PositionHook):
    """Rotates each pair of head features by the angle `θ_{j,k} = j · base^{-2k/d_h}`.

    Used as the `position=` plug point of `MultiHeadAttention`: `rotate(q, k, …)` rotates the
    queries and keys by their positions so that `q_i · k_j` depends on `i − j` only. The head
    dimension is split in halves (the GPT-NeoX / keras-hub layout). No weights.

    Args:
        max_wavelength: float, the base of the angles (10000 by default).
        scaling_factor: float ≥ 1, positions are divided by it (position interpolation).
        frequency_scaling: optional dict with `factor`, `low_freq_factor`,
            `high_freq_factor` and `original_max_position_embeddings`: Llama 3's rescaling of
            the frequencies (long wavelengths divided by `factor`, short ones kept, those in
            between interpolated; see `ops.positions.scaled_rotary_frequencies`).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, H, Dh]` with an even `Dh`.
        positions: optional int tensor `[T]` or `[B, T]`.
        start_index: position of the first token when `positions` is not given.

    Returns:
        The rotated `[B, T, H, Dh]` tensor.

    Example:
    >>> rope = RotaryEmbedding()
    >>> q = rope(keras.random.normal((2, 8, 4, 16)))
    """

    rotates_pairs = True

    def __init__(self, max_wavelength=10000.0, scaling_factor=1.0, frequency_scaling=None,
                 **kwargs):
        super().__init__(**kwargs)
        check_positive_number("max_wavelength", max_wavelength)
        check_positive_number("scaling_factor", scaling_factor)
        if max_wavelength <= 1:
            raise ValueError(
                f"max_wavelength must be greater than 1. Received: max_wavelength={max_wavelength}"
            )
        if scaling_factor < 1:
            raise ValueError(
                f"scaling_factor must be at least 1. Received: scaling_factor={scaling_factor}"
            )
        self.max_wavelength = float(max_wavelength)
        self.scaling_factor = float(scaling_factor)
        self.frequency_scaling = _check_frequency_scaling(frequency_scaling)

    @staticmethod
    def _check_head_dim(inputs_shape, name="inputs_shape"):
        if inputs_shape is not None and inputs_shape[-1] is not None and inputs_shape[-1] % 2:
            raise ValueError(
                "RotaryEmbedding needs an even head dimension. "
                f"Received: head_dim={inputs_shape[-1]} ({name}={tuple(inputs_shape)})"
            )

    def build(self, inputs_shape=None):
        self._check_head_dim(inputs_shape)

    def call(self, inputs, positions=None, start_index=0):
        check_rank("inputs", inputs, 4, "[batch, length, num_heads, head_dim]")
        self._check_head_dim(tuple(inputs.shape))
        check_positions(positions, inputs)
        if positions is None:
            positions = ops.arange(ops.shape(inputs)[1], dtype="int32") + ops.cast(
                start_index, "int32"
            )
        return apply_rotary(inputs, positions, *self._settings())

    def _settings(self):
        return self.max_wavelength, self.scaling_factor, self.frequency_scaling

    def rotate(self, query, key, query_positions, key_positions):
        """The `position=` hook: returns `(rotated query, rotated key)`."""
        self._check_head_dim(tuple(query.shape), "query_shape")
        self._check_head_dim(tuple(key.shape), "key_shape")
        check_positions(query_positions, query, "query_positions", "query")
        check_positions(key_positions, key, "key_positions", "key")
        return (
            apply_rotary(query, query_positions, *self._settings()),
            apply_rotary(key, key_positions, *self._settings()),
        )

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"max_wavelength": self.max_wavelength, "scaling_factor": self.scaling_factor,
             "frequency_scaling": self.frequency_scaling}
        )
        return config
