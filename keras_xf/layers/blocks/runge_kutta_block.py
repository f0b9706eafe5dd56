"""A Transformer layer whose sub-layers take Runge–Kutta steps (survey §4.3)."""

import keras

from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.residual.runge_kutta_residual import RungeKuttaResidual


@keras.saving.register_keras_serializable(package="keras_xf")
class RungeKuttaBlock(TransformerBlock):
    """A `TransformerBlock` whose every sub-layer (mixer, cross-attention, feedforward) is a
    `RungeKuttaResidual`: `z ← z + Σ_i γ_i g_i`, `g_i = h f(z + Σ_{j<i} β_{i,j} g_j)` with
    `f = F∘LNorm` (or `LNorm∘F`), e.g. the RK4 Transformer sub-layer of survey §4.3.

    It is a template like any block: `TransformerStack(RungeKuttaBlock(...), num_layers)`
    clones it per layer, and the models take it as `block=`. The residual path is never
    normalised (`norm_placement` is `"pre"`), so the stack ends with a normalisation.

    Args:
        mixer, feedforward, cross_attention, normalization, dropout, epsilon: as
            `TransformerBlock`.
        norm_placement: `"pre"` only (accepted so that configs of the base class apply).
        method, share_weights, learned_coefficients, stage_norm, step_size: as
            `RungeKuttaResidual`, for every sub-layer.
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `TransformerBlock`. With a cache, the mixer's cache is a tuple of one cache per
        stage (`init_cache` builds it; see `RungeKuttaResidual`), and so is the
        cross-attention's. `output_length` slices the full outputs (the later stages need
        every position of the earlier ones).

    Returns:
        As `TransformerBlock`.

    Example:
    >>> block = RungeKuttaBlock(MultiHeadAttention(4), FeedForward(64), method="rk4")
    >>> y = block(keras.random.normal((2, 5, 16)), use_causal_mask=True)
    """

    def __init__(
        self,
        mixer,
        feedforward,
        cross_attention=None,
        normalization="layer_norm",
        norm_placement="pre",
        dropout=0.0,
        epsilon=1e-5,
        method="rk2",
        share_weights=True,
        learned_coefficients=False,
        stage_norm="input",
        step_size=1.0,
        **kwargs,
    ):
        if norm_placement != "pre":
            raise ValueError(
                "RungeKuttaBlock keeps the residual path unnormalised: norm_placement must be "
                f"'pre'. Received: norm_placement={norm_placement!r}")
        # Read by `make_residual`, which the base class calls while it builds the sub-layers.
        self.method = method
        self.share_weights = share_weights
        self.learned_coefficients = learned_coefficients
        self.stage_norm = stage_norm
        self.step_size = step_size
        super().__init__(mixer, feedforward, cross_attention=cross_attention,
                         normalization=normalization, norm_placement=norm_placement,
                         dropout=dropout, epsilon=epsilon, **kwargs)
        self.step_size = self.mixer_residual.step_size

    def make_residual(self, layer, name):
        return RungeKuttaResidual(
            layer,
            method=self.method,
            share_weights=self.share_weights,
            learned_coefficients=self.learned_coefficients,
            stage_norm=self.stage_norm,
            step_size=self.step_size,
            normalization=self.normalization,
            dropout=self.dropout,
            epsilon=self.epsilon,
            dtype=self.dtype_policy,
            name=name,
        )

    @property
    def computes_first_positions(self):
        """Never: the later stages take every position of the earlier stages' outputs."""
        return False

    def build(self, inputs_shape, encoder_outputs_shape=None):
        if len(inputs_shape) != 3:
            raise ValueError(
                "RungeKuttaBlock expects inputs of rank 3 [batch, length, dim]. "
                f"Received: inputs_shape={tuple(inputs_shape)}"
            )
        self.mixer_residual.build(inputs_shape)
        if self.cross_attention_residual is not None:
            self.cross_attention_residual.build(inputs_shape,
                                                encoder_outputs_shape or inputs_shape)
        if self.feedforward_residual is not None:
            self.feedforward_residual.build(inputs_shape)

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """One cache per stage of the mixer, paired with one per stage of the
        cross-attention when there is one."""
        cache = self.mixer_residual.init_cache(batch_size, max_length, dtype)
        if self.cross_attention_residual is None:
            return cache
        if encoder_length is None:
            raise ValueError("init_cache of a block with cross-attention needs encoder_length.")
        return (cache, self.cross_attention_residual.init_cache(batch_size, encoder_length, dtype))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "method": self.method,
                "share_weights": self.share_weights,
                "learned_coefficients": self.learned_coefficients,
                "stage_norm": self.stage_norm,
                "step_size": self.step_size,
            }
        )
        return config
