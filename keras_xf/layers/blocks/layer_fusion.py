"""Fusion of earlier layer outputs into one representation (survey §4.2.3, layer fusion)."""

import keras
from keras import ops

from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.residual.residual import NORMALIZATIONS
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.attention import masked_softmax
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import static_dim

FUSIONS = ("average", "weighted_sum", "feedforward", "attention")


def check_fusion(fusion, normalization, names=("fusion", "fusion_normalization")):
    """`fusion` is `None` or one of `FUSIONS`; `normalization` `None` or a norm's name;
    errors name the arguments `names`."""
    if fusion is not None and fusion not in FUSIONS:
        raise ValueError(f"{names[0]} must be None or one of {FUSIONS}. Received: "
                         f"{names[0]}={fusion!r}")
    if normalization is not None and normalization not in NORMALIZATIONS:
        raise ValueError(
            f"{names[1]} must be None or one of {NORMALIZATIONS}. Received: "
            f"{names[1]}={normalization!r}"
        )


@keras.saving.register_keras_serializable(package="keras_xf")
class LayerFusion(keras.layers.Layer):
    """`Z = φ(z^1, …, z^n)`, one of the fusion functions of the survey's table (§4.2.3):

    - `"average"`: `φ = (1/n) Σ_k z^k`;
    - `"weighted_sum"`: `φ = Σ_k w_k z^k`, learned `w` (initialised to `1/n`);
    - `"feedforward"`: `φ = FFN([z^1, …, z^n])`, an FFN over the concatenated features;
    - `"attention"`: `φ = FFN([Att_self(z^1, …, z^n)])`: at every position, single-head
      self-attention across the `n` layer outputs (`α = Softmax(Q Kᵀ/√d)` over layers, in
      float32), the `n` attended vectors concatenated and fed to the FFN.

    With `normalization`, `Z = LNorm(φ(…))` (the table's caption). Every φ acts on each
    position alone, so cached decoding works as without fusion.

    Args:
        mode: one of `"average"`, `"weighted_sum"`, `"feedforward"`, `"attention"`.
        num_inputs: int `n ≥ 1`, the number of fused outputs.
        normalization: `None`, `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"`.
        intermediate_dim: the FFN's hidden width (`"feedforward"`, `"attention"`);
            `None` means `d`.
        epsilon: the norm's epsilon.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, n, d]`, the `n` outputs `z^1 … z^n` stacked on axis −2, oldest
            first.

    Returns:
        `[B, T, d]`.

    Example:
    >>> fusion = LayerFusion("attention", num_inputs=3, normalization="layer_norm")
    >>> z = fusion(keras.random.normal((2, 5, 3, 16)))  # (2, 5, 16)
    """

    def __init__(self, mode, num_inputs, normalization=None, intermediate_dim=None,
                 epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        if mode not in FUSIONS:
            raise ValueError(f"mode must be one of {FUSIONS}. Received: mode={mode!r}")
        check_fusion(mode, normalization, ("mode", "normalization"))
        self.mode = mode
        self.num_inputs = check_positive_int("num_inputs", num_inputs)
        self.normalization = normalization
        self.intermediate_dim = (None if intermediate_dim is None
                                 else check_positive_int("intermediate_dim", intermediate_dim))
        self.epsilon = check_positive_number("epsilon", epsilon)
        self.norm = None
        if normalization is not None:
            self.norm = make_normalization(normalization, epsilon, self.dtype_policy, "norm")

    def build(self, inputs_shape):
        shape = tuple(inputs_shape[:-2]) + (inputs_shape[-1],)
        width = shape[-1]
        self._build_width = width
        if self.mode == "weighted_sum":
            self.fusion_weights = self.add_weight(
                shape=(self.num_inputs,),
                initializer=keras.initializers.Constant(1.0 / self.num_inputs),
                name="fusion_weights",
            )
        if self.mode == "attention":
            self.query_dense, self.key_dense, self.value_dense = (
                keras.layers.Dense(width, use_bias=False, dtype=self.dtype_policy, name=name)
                for name in ("query", "key", "value")
            )
            for dense in (self.query_dense, self.key_dense, self.value_dense):
                dense.build(tuple(inputs_shape))
        if self.mode in ("feedforward", "attention"):
            self.feedforward = FeedForward(self.intermediate_dim or width, output_dim=width,
                                           dtype=self.dtype_policy, name="feedforward")
            self.feedforward.build(shape[:-1] + (width * self.num_inputs,))
        if self.norm is not None:
            self.norm.build(shape)

    def call(self, inputs, training=None):
        check_rank("inputs", inputs, 4, "[batch, length, num_inputs, dim]")
        received = (static_dim(inputs.shape[-2]), static_dim(inputs.shape[-1]))
        if any(r is not None and r != e for r, e in zip(received, (self.num_inputs,
                                                                   self._width))):
            raise ValueError(
                f"inputs must have shape [batch, length, {self.num_inputs}, {self._width}] "
                f"(num_inputs={self.num_inputs}). Received: inputs.shape={tuple(inputs.shape)}"
            )
        if self.mode == "average":
            fused = ops.mean(inputs, axis=-2)
        elif self.mode == "weighted_sum":
            weights = ops.cast(self.fusion_weights, inputs.dtype)
            fused = ops.einsum("btnd,n->btd", inputs, weights)
        elif self.mode == "feedforward":
            fused = self.feedforward(self._concatenate(inputs), training=training)
        else:
            fused = self._attention(inputs, training)
        if self.norm is not None:
            fused = self.norm(fused)
        return fused

    def _concatenate(self, layers):
        """`[z^1, …, z^n]` along the features: `[B, T, n·d]`."""
        shape = ops.shape(layers)
        return ops.reshape(layers, (shape[0], shape[1], self.num_inputs * self._width))

    def _attention(self, layers, training):
        query, key = self.query_dense(layers), self.key_dense(layers)
        value = self.value_dense(layers)
        scale = 1.0 / float(self._width) ** 0.5
        scores = ops.einsum("btnd,btmd->btnm", ops.cast(query, "float32"),
                            ops.cast(key, "float32")) * scale
        weights = ops.cast(masked_softmax(scores), value.dtype)
        attended = ops.einsum("btnm,btmd->btnd", weights, value)
        return self.feedforward(self._concatenate(attended), training=training)

    @property
    def _width(self):
        return self._build_width

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-2]) + (inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode, "num_inputs": self.num_inputs,
                       "normalization": self.normalization,
                       "intermediate_dim": self.intermediate_dim, "epsilon": self.epsilon})
        return config
