"""A stack of Transformer layers cloned from one template block (survey §2.1)."""

import keras

from keras_xf.layers.blocks.transformer_block import _new_specs
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.cloning import serialize_layer
from keras_xf.layers.residual.residual import make_normalization


@keras.saving.register_keras_serializable(package="keras_xf")
class TransformerStack(keras.layers.Layer):
    """`H^l = Block_l(H^{l-1})` for `l = 1 … L`, each block a fresh copy of a template.

    The template's config is cloned `num_layers` times, so every layer has its own weights.
    Pre-norm stacks end with a final normalisation (the residual path of a pre-norm layer is
    never normalised, survey §2.4); post-norm stacks do not need one.

    Args:
        block: a `TransformerBlock` (or any block with the same call) used as the template;
            the template itself is not used and holds no weights of the stack.
        num_layers: int, `L`.
        final_norm: bool; `None` means "yes for a pre-norm template, no otherwise".
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `TransformerBlock`; `cache` is a tuple with one block cache per layer.

    Returns:
        `[B, T, d]`, or `(outputs, new_caches)` when a cache is given.

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(4), FeedForward(64), norm_placement="pre")
    >>> stack = TransformerStack(block, num_layers=3)
    >>> y = stack(keras.random.normal((2, 5, 16)))
    """

    def __init__(self, block, num_layers, final_norm=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int. Received: num_layers={num_layers}")
        self._block_config = serialize_layer(block)
        template = clone_layer(self._block_config)
        self.num_layers = num_layers
        norm_placement = getattr(template, "norm_placement", "post")
        self.final_norm = norm_placement == "pre" if final_norm is None else bool(final_norm)
        self.blocks = []
        dtype = keras.dtype_policies.serialize(self.dtype_policy)
        for index in range(num_layers):
            self.blocks.append(clone_layer(self._block_config, name=f"block_{index}", dtype=dtype))
        self.output_norm = None
        if self.final_norm:
            self.output_norm = make_normalization(
                getattr(template, "normalization", "layer_norm"),
                getattr(template, "epsilon", 1e-5),
                self.dtype_policy,
                "output_norm",
            )

    def build(self, inputs_shape, encoder_outputs_shape=None):
        for block in self.blocks:
            block.build(inputs_shape, encoder_outputs_shape)
        if self.output_norm is not None:
            self.output_norm.build(inputs_shape)

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """A tuple with one cache per block."""
        kwargs = {} if encoder_length is None else {"encoder_length": encoder_length}
        return tuple(b.init_cache(batch_size, max_length, dtype, **kwargs) for b in self.blocks)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        encoder_outputs=None,
        encoder_padding_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
    ):
        if cache is not None and len(cache) != self.num_layers:
            raise ValueError(
                f"cache must hold one entry per layer ({self.num_layers}). Received: "
                f"{len(cache)} entries"
            )
        outputs = inputs
        new_caches = []
        for index, block in enumerate(self.blocks):
            outputs = block(
                outputs,
                padding_mask=padding_mask,
                attention_mask=attention_mask,
                encoder_outputs=encoder_outputs,
                encoder_padding_mask=encoder_padding_mask,
                use_causal_mask=use_causal_mask,
                cache=None if cache is None else cache[index],
                cache_index=cache_index,
                training=training,
            )
            if cache is not None:
                outputs, layer_cache = outputs
                new_caches.append(layer_cache)
        if self.output_norm is not None:
            outputs = self.output_norm(outputs)
        if cache is None:
            return outputs
        return outputs, tuple(new_caches)

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, **kwargs):
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if cache is None:
            return outputs
        return outputs, _new_specs(tuple(cache))

    def get_config(self):
        config = super().get_config()
        config.update(
            {"block": self._block_config, "num_layers": self.num_layers, "final_norm": self.final_norm}
        )
        return config
