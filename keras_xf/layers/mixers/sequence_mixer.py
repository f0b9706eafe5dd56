"""The base of the sequence mixers a `TransformerBlock` takes as its `mixer` (survey §2.1, §5)."""

import keras

from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import check_state
from keras_xf.ops.checks import check_states


@keras.saving.register_keras_serializable(package="keras_xf")
class SequenceMixer(keras.layers.Layer):
    """A layer that mixes information across the positions of a sequence: attention, linear
    attention, state-space models, convolutions, recurrent layers.

    The mixer contract: `call(inputs, …, padding_mask=None, use_causal_mask=None, cache=None,
    cache_index=None, training=None)` returns `outputs` without a cache and
    `(outputs, new_cache)` with one; when the caller asks for more (e.g.
    `return_attention_scores=True`) it returns one dict `{"outputs": …, "attention_scores": …}`
    plus `"cache"` when a cache was given. `init_cache(batch_size, max_length, dtype=None)`
    makes the cache, whose layout is the mixer's own. `Residual`, `TransformerBlock` and
    `TransformerStack` pass any other call argument to the mixer unchanged.

    Subclasses implement `call` and `init_cache`, and declare:
    - `cache_is_recurrent`: the cache is a fixed-size state that each call advances (SSMs,
      linear attention, recurrent and convolution mixers), not a buffer indexed by position,
      so a prompt must be fed through it once, in order, before decoding.
    - `no_attention_mask`: for a mixer without a pairwise `[T, S]` mask, why it has none and
      what to pass instead (`check_call_inputs` then refuses an `attention_mask`); `None`
      for a mixer that takes one.
    - `causal`: the mixer is causal by default (its `use_causal_mask=None` means causal;
      e.g. `MultiHeadAttention(causal=True)`), which a layer built around it may follow
      (`CompressedStack` shifts its windows); `False` by default.
    """

    cache_is_recurrent = False
    no_attention_mask = None
    causal = False

    def check_inputs_shape(self, inputs_shape):
        """The width `d` of `inputs_shape` `[batch, length, d]` given to `build`, which needs
        it known; else a `ValueError` naming `inputs_shape`."""
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} expects inputs of rank 3 [batch, length, dim] with a "
                f"known dim. Received: inputs_shape={tuple(inputs_shape)}"
            )
        return int(inputs_shape[-1])

    def check_call_inputs(self, inputs, width, padding_mask=None, attention_mask=None,
                          cache=None, cache_shape=None):
        """The checks every mixer without a pairwise mask makes on its call inputs: `inputs`
        `[batch, length, width]`, `padding_mask` `[batch, length]`, `cache` of `cache_shape`
        (one shape for a single tensor, a list of shapes for a tuple of tensors; `None`: not
        checked), and no `attention_mask` when `no_attention_mask` says why there is none.
        Each raises a `ValueError` naming the argument, what was expected and what was
        received."""
        check_sequence_width(inputs, width)
        check_padding_mask(padding_mask, inputs)
        if cache is not None and cache_shape is not None:
            if cache_shape and isinstance(cache_shape[0], (tuple, list)):
                check_states(cache, "cache", cache_shape)
            else:
                check_state(cache, "cache", cache_shape)
        if attention_mask is not None and self.no_attention_mask is not None:
            raise ValueError(
                f"{type(self).__name__} takes no attention_mask: {self.no_attention_mask}. "
                f"Received: attention_mask.shape={tuple(attention_mask.shape)}"
            )
