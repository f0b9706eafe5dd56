"""The base of the sequence mixers a `TransformerBlock` takes as its `mixer` (survey §2.1, §5)."""

import keras


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
    """

    cache_is_recurrent = False
