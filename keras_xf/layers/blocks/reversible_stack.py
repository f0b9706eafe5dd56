"""A stack of reversible layers whose backward pass recomputes activations (survey §5.4)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import first_positions
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.blocks.reversible_block import ReversibleBlock
from keras_xf.layers.blocks.reversible_block import couple
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.cloning import serialize_template
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_output_length
from keras_xf.ops.checks import check_rank
from keras_xf.ops.gradients import vjp


def _reversible_template(block):
    """A `ReversibleBlock` from `block`: itself, or the sub-layers of a `TransformerBlock`."""
    block = as_layer(block, "block", kind=(ReversibleBlock, TransformerBlock))
    if isinstance(block, ReversibleBlock):
        return block
    if block.cross_attention is not None or block.feedforward is None or block.dropout:
        raise ValueError(
            "A TransformerBlock template of a ReversibleStack needs a mixer and a feedforward, "
            "no cross_attention and dropout=0 (the inverse must recompute the same values). "
            f"Received: cross_attention={type(block.cross_attention).__name__}, feedforward="
            f"{type(block.feedforward).__name__}, dropout={block.dropout}")
    return ReversibleBlock(serialize_template(block.mixer), serialize_template(block.feedforward),
                           normalization=block.normalization, epsilon=block.epsilon)


@keras.saving.register_keras_serializable(package="keras_xf")
class ReversibleStack(PassesMixerArguments, keras.layers.Layer):
    """`L` reversible layers on two streams, whose activations are recomputed in the
    backward pass (survey §5.4: "we only keep the output of the latest layer in the forward
    pass … in the backward pass of training, we reconstruct the output of each layer from
    its successor"; Gomez et al. 2017, Reformer):

        [x1, x2] = [H, H],   [x1, x2] ← ReversibleBlock_l([x1, x2])  for l = 1 … L,
        H' = LNorm((x1 + x2) / 2).

    With `recompute=True` the stack is one `keras.ops.custom_gradient` function of its
    input and of every layer's weights: the forward pass keeps the last layer's outputs
    only, and the backward pass walks the layers from the top, each time recomputing
    `G(y1)` and `F(x2)` with their vector-Jacobian products (`x2 = y2 − G(y1)`,
    `x1 = y1 − F(x2)`; `∂/∂y1 += G'ᵀ ∂/∂y2`, `∂/∂x2 = ∂/∂y2 + F'ᵀ ∂/∂y1`), so that the
    activation memory of training does not grow with `L`. The weight gradients equal those
    of autodiff through the same equations (`recompute=False`) up to the rounding of the
    inverse. A cached (decoding) call runs the layers one by one; no gradient is needed.

    Args:
        block: a `ReversibleBlock` template, or a `TransformerBlock` whose mixer,
            feedforward, normalization and epsilon make one (no cross-attention, no
            dropout); its config is cloned per layer (fresh weights).
        num_layers: int `L`.
        final_norm: bool, normalise the merged streams (the streams are never normalised
            otherwise, as in a pre-norm stack).
        recompute: bool, the memory-saving custom gradient; `False` keeps every
            activation (plain autodiff, the same outputs).
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `TransformerStack` without the encoder arguments: `inputs` `[B, T, d]`,
        `padding_mask`, `attention_mask`, `use_causal_mask`, `cache` (one cache per layer),
        `cache_index`, `training`, `output_length`, and mixer-specific `**kwargs`, which
        reach every layer's mixer (tensors among them receive no gradient under
        `recompute`).

    Returns:
        `[B, T, d]` (`[B, n, d]` with `output_length`), or `(outputs, new_caches)` with a
        cache.

    Example:
    >>> block = ReversibleBlock(MultiHeadAttention(4), FeedForward(64))
    >>> stack = ReversibleStack(block, num_layers=6)
    >>> y = stack(keras.random.normal((2, 5, 16)), use_causal_mask=True)
    """

    def __init__(self, block, num_layers, final_norm=True, recompute=True, **kwargs):
        super().__init__(**kwargs)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int. Received: num_layers={num_layers}")
        check_bool("final_norm", final_norm)
        check_bool("recompute", recompute)
        template = _reversible_template(block)
        self._block_config = serialize_template(template)
        self.num_layers = num_layers
        self.final_norm = final_norm
        self.recompute = recompute
        dtype = keras.dtype_policies.serialize(self.dtype_policy)
        self.blocks = [clone_layer(self._block_config, name=f"block_{index}", dtype=dtype)
                       for index in range(num_layers)]
        self.output_norm = None
        if final_norm:
            self.output_norm = make_normalization(template.normalization, template.epsilon,
                                                  self.dtype_policy, "output_norm")

    def build(self, inputs_shape):
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError("ReversibleStack expects inputs of rank 3 [batch, length, dim]. "
                             f"Received: inputs_shape={tuple(inputs_shape)}")
        streams = tuple(inputs_shape[:-1]) + (2 * inputs_shape[-1],)
        for block in self.blocks:
            block.build(streams)
        if self.output_norm is not None:
            self.output_norm.build(inputs_shape)

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """A tuple with one cache per layer (the layer's mixer's cache)."""
        if encoder_length is not None:
            raise ValueError("A ReversibleStack has no cross-attention: init_cache takes no "
                             f"encoder_length. Received: encoder_length={encoder_length}")
        return tuple(block.init_cache(batch_size, max_length, dtype) for block in self.blocks)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
        mixer_options=None,
        output_length=None,
        **kwargs,
    ):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        check_output_length(output_length, inputs)
        if cache is not None and len(cache) != self.num_layers:
            raise ValueError(f"cache must hold one entry per layer ({self.num_layers}). "
                             f"Received: {len(cache)} entries")
        named = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
        }
        named = {key: value for key, value in named.items() if value is not None}
        named.update(mixer_arguments(kwargs, mixer_options))
        streams = ops.concatenate([inputs, inputs], axis=-1)
        new_caches = []
        if cache is not None or not self.recompute:
            for index, block in enumerate(self.blocks):
                layer_cache = {} if cache is None else {"cache": cache[index],
                                                        "cache_index": cache_index}
                results = block(streams, training=training, **named, **layer_cache)
                streams, new_cache, _ = split_results(results, cache is not None)
                new_caches.append(new_cache)
        else:
            streams = self._recomputing_pass(streams, padding_mask, training, named)
        y1, y2 = ops.split(streams, 2, axis=-1)
        outputs = (y1 + y2) * ops.cast(0.5, y1.dtype)
        if self.output_norm is not None:
            outputs = self.output_norm(outputs)
        if output_length is not None:
            outputs = outputs[:, :output_length]
        return outputs if cache is None else (outputs, tuple(new_caches))

    def _recomputing_pass(self, streams, padding_mask, training, named):
        """All layers as one custom-gradient function of the streams and the weights."""
        blocks = self.blocks
        variables = [(block.branch_variables(0), block.branch_variables(1)) for block in blocks]
        # Tensors read from the variables (a TensorFlow variable given to the function would
        # be read inside it, where tf.custom_gradient wants variables declared).
        flat = [ops.copy(v.value) for pair in variables for part in pair for v in part]
        counts = [(len(f), len(g)) for f, g in variables]

        def branches(block, values):
            f_values, g_values = values
            ff_kwargs = block.feedforward_kwargs(padding_mask)
            return (lambda x, *w: block.apply_branch(0, w, x, training=training, **named),
                    lambda x, *w: block.apply_branch(1, w, x, training=training, **ff_kwargs),
                    f_values, g_values)

        def per_block(values):
            values, start = list(values), 0
            for f_count, g_count in counts:
                yield (values[start:start + f_count],
                       values[start + f_count:start + f_count + g_count])
                start += f_count + g_count

        @ops.custom_gradient
        def forward(x, *values):
            for block, block_values in zip(blocks, per_block(values)):
                f, g, f_values, g_values = branches(block, block_values)
                x = couple(x, lambda h: f(h, *f_values), lambda h: g(h, *g_values))
            outputs = x

            def gradient(*args, upstream=None):
                # PyTorch passes the inputs and `upstream=`; TensorFlow and JAX the upstream alone.
                if upstream is None:
                    (upstream,) = args
                y, dy = outputs, ops.cast(upstream, outputs.dtype)
                grads = []
                for block, block_values in reversed(list(zip(blocks, per_block(values)))):
                    f, g, f_values, g_values = branches(block, block_values)
                    y1, y2 = ops.split(y, 2, axis=-1)
                    dy1, dy2 = ops.split(dy, 2, axis=-1)
                    g_out, g_pullback = vjp(g, [y1, *g_values])
                    x2 = y2 - g_out
                    dy1_from_g, *g_grads = g_pullback(dy2)
                    dy1 = dy1 + dy1_from_g
                    f_out, f_pullback = vjp(f, [x2, *f_values])
                    x1 = y1 - f_out
                    dx2_from_f, *f_grads = f_pullback(dy1)
                    y = ops.concatenate([x1, x2], axis=-1)
                    dy = ops.concatenate([dy1, dy2 + dx2_from_f], axis=-1)
                    grads = list(f_grads) + list(g_grads) + grads
                return (dy, *grads)

            return outputs, gradient

        return forward(streams, *flat)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, output_length=None, **kwargs):
        outputs = keras.KerasTensor(first_positions(inputs.shape, output_length),
                                    dtype=self.compute_dtype)
        if cache is None:
            return outputs
        return outputs, new_specs(tuple(cache))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "block": self._block_config,
                "num_layers": self.num_layers,
                "final_norm": self.final_norm,
                "recompute": self.recompute,
            }
        )
        return config
