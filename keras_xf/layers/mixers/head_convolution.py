"""The base of the lightweight and dynamic convolutions (Wu et al. 2019; survey §5.5.1)."""

import keras
from keras import ops

from keras_xf.layers.mixers.sequence_convolution import SequenceConvolution
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.convolution import glu


@keras.saving.register_keras_serializable(package="keras_xf")
class HeadConvolution(SequenceConvolution):
    """Base of the lightweight and dynamic convolutions (Wu et al. 2019): `H` kernels of
    size `K`, softmax-normalised over `K` in float32, with DropConnect on the normalised
    weights, channel `c` using the kernel of head `⌊c·H/d⌋`; optionally the input projection
    `d → 2d` with a GLU before, and the output projection `d → d` after the convolution."""

    def __init__(
        self,
        kernel_size,
        num_heads,
        causal=False,
        weight_softmax=True,
        weight_dropout=0.0,
        use_glu=False,
        use_bias=True,
        seed=None,
        **kwargs,
    ):
        super().__init__(kernel_size, causal=causal, use_bias=use_bias, **kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.weight_softmax = bool(weight_softmax)
        self.weight_dropout = float(check_rate("weight_dropout", weight_dropout))
        self.use_glu = bool(use_glu)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.weight_dropout else None
        self.hidden_dim = None

    def _build_projections(self, inputs_shape):
        hidden_dim = self.check_inputs_shape(inputs_shape)
        if hidden_dim % self.num_heads:
            raise ValueError(
                "num_heads must divide the input width. Received: "
                f"num_heads={self.num_heads}, hidden_dim={hidden_dim}"
            )
        self.hidden_dim = hidden_dim
        self.input_projection = self.output_projection = None
        if self.use_glu:
            self.input_projection = self._dense(2 * hidden_dim, "input_projection")
            self.input_projection.build(tuple(inputs_shape))
            self.output_projection = self._dense(hidden_dim, "output_projection")
            self.output_projection.build(tuple(inputs_shape))
        return hidden_dim

    def _channels(self):
        return self.hidden_dim

    def _project_in(self, inputs, training):
        if self.input_projection is None:
            return inputs
        return glu(self.input_projection(inputs))

    def _project_out(self, outputs, padding_mask, training):
        if self.output_projection is None:
            return outputs
        return self.output_projection(outputs)

    def _normalize(self, logits, training):
        """Softmax over the last (`K`) axis in float32, then DropConnect when training."""
        weights = ops.cast(logits, "float32")
        if self.weight_softmax:
            weights = ops.softmax(weights, axis=-1)
        if training and self.weight_dropout > 0:
            weights = keras.random.dropout(weights, self.weight_dropout, seed=self.seed_generator)
        return weights

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "weight_softmax": self.weight_softmax,
                "weight_dropout": self.weight_dropout,
                "use_glu": self.use_glu,
                "seed": self.seed,
            }
        )
        return config
