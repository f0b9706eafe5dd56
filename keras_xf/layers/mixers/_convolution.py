"""The bases of the convolutional sequence mixers (survey §5.5.1): `SequenceConvolution`, the
cache protocol around a size-`K` convolution, and `HeadConvolution`, the head-shared kernels of
the lightweight and dynamic convolutions (Wu et al. 2019). Only subclassed."""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.convolution import glu
from keras_xf.ops.convolution import pad_sequence
from keras_xf.ops.convolution import rolling_cache


@keras.saving.register_keras_serializable(package="keras_xf")
class SequenceConvolution(SequenceMixer):
    """Base of the convolutional mixers: the cache protocol around a size-`K` convolution.

    It does what every convolutional mixer does the same way: the causal form (`causal`, or
    `use_causal_mask`; a cache needs it), the padding mask (padded positions are zeroed before
    mixing and in the output), the causal or centred padding, and the rolling cache of the
    last `K − 1` convolution inputs. A subclass defines `_channels()` (the width of the
    convolved signal), `_convolve(padded, signal, training)` (`[B, T + K − 1, C]` →
    `[B, T, C]`), and optionally `_project_in` / `_project_out` around it.
    """

    # The cache is the rolling window of the last K − 1 inputs: each token enters it once.
    cache_is_recurrent = True
    no_attention_mask = (
        "a convolution mixes a fixed window of positions; use padding_mask and use_causal_mask"
    )

    def __init__(
        self,
        kernel_size,
        causal=False,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.kernel_size = check_positive_int("kernel_size", kernel_size)
        self.causal = check_bool("causal", causal)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)

    # Helpers for subclasses ---------------------------------------------------------------
    def _dense(self, units, name, use_bias=None):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    # Cache -------------------------------------------------------------------------------
    def check_cache_ready(self):
        super().check_cache_ready()
        if not self.causal:
            raise ValueError(
                f"Only a causal {type(self).__name__} decodes with a cache. Received: "
                "causal=False"
            )

    def cache_shapes(self, batch_size):
        """The rolling cache: `[B, K − 1, C]` in float32 (whatever `dtype`), the last `K − 1`
        inputs of the convolution; its size does not depend on `max_length`."""
        return (batch_size, self.kernel_size - 1, self._channels())

    # Forward -----------------------------------------------------------------------------
    def _project_in(self, inputs, training):
        return inputs

    def _project_out(self, outputs, padding_mask, training):
        return outputs

    def causal_form(self, use_causal_mask, cache):
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        if cache is not None and not causal:
            raise ValueError(
                f"A non-causal {type(self).__name__} has no cache: its outputs read future "
                f"positions. Received: a cache with causal={self.causal}, "
                f"use_causal_mask={use_causal_mask}"
            )
        return causal

    def mix(self, inputs, padding_mask, causal, cache, training):
        signal = self._project_in(ops.cast(inputs, self.compute_dtype), training)
        mask = None
        if padding_mask is not None:
            mask = ops.cast(padding_mask, signal.dtype)[:, :, None]
            signal = signal * mask  # padded positions never reach valid ones
        padded = pad_sequence(signal, self.kernel_size, causal, history=cache)
        outputs = self._convolve(padded, signal, training)
        outputs = self._project_out(outputs, padding_mask, training)
        if mask is not None:
            outputs = outputs * ops.cast(mask, outputs.dtype)
        if cache is None:
            return outputs, None
        return outputs, rolling_cache(padded, self.kernel_size, padding_mask)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "kernel_size": self.kernel_size,
                "causal": self.causal,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


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
