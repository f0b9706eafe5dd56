"""A callback that starts each pass over a stream with empty memories (survey §5.2.1)."""

import keras

from keras_xf.layers.memory import reset_memories


class StreamMemory(keras.callbacks.Callback):
    """Empties the model's carried memories (`reset_memories`) where a stream starts again:
    at the start of every epoch of `fit`, and before each evaluation (the validation stream
    of `fit` and `evaluate`), so that no chunk reads the memory of another stream's end.
    Batches must come in stream order (`stream_examples`, `shuffle=False`).

    Example:
    >>> model.fit(x, y, batch_size=8, shuffle=False, callbacks=[StreamMemory()])
    """

    def on_epoch_begin(self, epoch, logs=None):
        reset_memories(self.model)

    def on_test_begin(self, logs=None):
        reset_memories(self.model)
