"""The base of the sequence mixers a `TransformerBlock` takes as its `mixer` (survey §2.1, §5)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import new_specs
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

    The base owns what every mixer of one sequence `inputs [B, T, d]` does alike, as template
    methods: `call` checks the inputs, the padding mask, the cache and a refused
    `attention_mask` (`check_call_inputs`), asks `causal_form` for the form of the call, lets
    `mix` compute, and returns `outputs` or `(outputs, new_cache)`; `init_cache` makes zeros of
    `cache_shapes` once `check_cache_ready` allows it; `compute_output_spec` gives the outputs'
    and the new cache's specs. A subclass of that kind builds its weights (recording the width
    with `check_inputs_shape`) and defines `cache_shapes`, where it differs `causal_form`,
    `check_cache_ready` and `compute_output_shape`, and its own maths:

        mix(inputs, padding_mask, causal, cache, training) -> (outputs, new_cache)

    for checked `inputs` `[B, T, d]`, `padding_mask` `[B, T]` or `None`, the form `causal_form`
    chose and the `cache` (`None`: no cache, and `new_cache` is `None`). A mixer with other call
    arguments (attention's `query`, `value`, `key`) defines `call` and `init_cache` itself.

    Subclasses declare:
    - `cache_is_recurrent`: the cache is a fixed-size state that each call advances (SSMs,
      linear attention, recurrent and convolution mixers), not a buffer indexed by position,
      so a prompt must be fed through it once, in order, before decoding.
    - `cache_is_rolling`: the cache holds only the latest positions (slot `p mod slots`), so
      writes must come in order: a write ahead of the position decoded next would overwrite
      keys still to be read. `False` by default; attention with a banded pattern says `True`.
    - `carries_memory`: the mixer keeps a memory in variables that each call without a cache
      advances (a stateful `MemoryAttention`), so generation must use the cache, which reads
      it and leaves it. `False` by default.
    - `no_attention_mask`: for a mixer without a pairwise `[T, S]` mask, why it has none and
      what to pass instead (`check_call_inputs` then refuses an `attention_mask`); `None`
      for a mixer that takes one.
    - `causal`: the mixer is causal by default (its `use_causal_mask=None` means causal;
      e.g. `MultiHeadAttention(causal=True)`), which a layer built around it may follow
      (`CompressedStack` shifts its windows); `False` by default.
    """

    causal = False

    # The width `d` of the inputs, recorded by `check_inputs_shape` when the mixer is built.
    input_dim = None
    # The dtype of every tensor of the cache a call returns: float32 for the running states
    # accumulated in float32; `None` for a cache kept in the dtype it was made with.
    cache_dtype = "float32"

    cache_is_recurrent = False
    cache_is_rolling = False
    carries_memory = False
    no_attention_mask = None

    def check_inputs_shape(self, inputs_shape):
        """The width `d` of `inputs_shape` `[batch, length, d]` given to `build`, which needs
        it known, recorded as `input_dim`; else a `ValueError` naming `inputs_shape`."""
        if len(inputs_shape) != 3 or inputs_shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} expects inputs of rank 3 [batch, length, dim] with a "
                f"known dim. Received: inputs_shape={tuple(inputs_shape)}"
            )
        self.input_dim = int(inputs_shape[-1])
        return self.input_dim

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

    # Template methods ------------------------------------------------------------------------
    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
    ):
        """The contract's call: checks, `causal_form`, `mix`, then `outputs` or
        `(outputs, new_cache)` (a subclass documents its call arguments)."""
        self.check_call_inputs(inputs, self.input_dim, padding_mask, attention_mask, cache,
                               self.cache_shapes(inputs.shape[0]))
        causal = self.causal_form(use_causal_mask, cache)
        outputs, new_cache = self.mix(inputs, padding_mask, causal, cache, training)
        return join_results(outputs, new_cache, None, cache is not None)

    def causal_form(self, use_causal_mask, cache):
        """Whether this call takes the causal form, given `use_causal_mask` (`None`: the
        layer's default) and whether a cache is given; raises a `ValueError` for a pair the
        mixer refuses. By default a mixer is causal whatever it is told (an SSM, Mamba)."""
        return True

    def cache_shapes(self, batch_size):
        """The shape of the cache, or a list of the shapes of its tensors (a tuple cache);
        `None` for a mixer without one. `check_call_inputs` checks a given cache against it
        and `init_cache` makes zeros of it."""
        return None

    def check_cache_ready(self):
        """Raises a `ValueError` while `init_cache` cannot make a cache (not built yet)."""
        if not self.built:
            raise ValueError(
                f"init_cache needs a built {type(self).__name__}: call it once or build it."
            )

    def init_cache(self, batch_size, max_length=None, dtype=None):
        """The empty cache: zeros of `cache_shapes(batch_size)` in `cache_dtype` (float32)
        whatever `dtype`; its size does not depend on `max_length` (a running state)."""
        self.check_cache_ready()
        shapes = self.cache_shapes(batch_size)
        if shapes and isinstance(shapes[0], (tuple, list)):
            return tuple(ops.zeros(shape, self.cache_dtype) for shape in shapes)
        return ops.zeros(shapes, self.cache_dtype)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, **kwargs):
        outputs, new_cache = self.output_specs(inputs, cache)
        return join_results(outputs, new_cache, None, cache is not None)

    def output_specs(self, inputs, cache=None):
        """`(outputs, new_cache)` as `KerasTensor`s: the outputs of `compute_output_shape` in
        the compute dtype, and a cache shaped like `cache` (`None` without one) in
        `cache_dtype`."""
        outputs = keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype=self.compute_dtype
        )
        if cache is None:
            return outputs, None
        if self.cache_dtype is None:
            return outputs, new_specs(cache)
        return outputs, keras.tree.map_structure(
            lambda part: keras.KerasTensor(part.shape, dtype=self.cache_dtype), cache
        )
