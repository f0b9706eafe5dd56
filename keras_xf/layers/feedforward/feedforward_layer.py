"""The base of the position-wise layers a `TransformerBlock` takes as its `feedforward`
(survey §2.5, §5.2)."""

import keras


@keras.saving.register_keras_serializable(package="keras_xf")
class FeedForwardLayer(keras.layers.Layer):
    """A width-preserving layer applied to each position: `FFN(H)`, a mixture of experts, a
    product-key memory.

    Subclasses implement `call(inputs, training=None)` and declare:
    - `uses_padding_mask`: `call` also takes `padding_mask` (boolean `[B, T]`), which a
      `TransformerBlock` passes on when it has one and no cache (e.g. `MixtureOfExperts`, where
      padding tokens must not take expert capacity).
    """

    uses_padding_mask = False
