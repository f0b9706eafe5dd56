"""A callback that ends training after a wall-clock budget."""

import time

import keras


class TimeLimit(keras.callbacks.Callback):
    """Stops `fit` once `seconds` have passed since training began (checked after each batch).

    Args:
        seconds: float > 0.

    Example:
    >>> model.fit(data, epochs=100, callbacks=[TimeLimit(180)])
    """

    def __init__(self, seconds):
        super().__init__()
        if seconds <= 0:
            raise ValueError(f"seconds must be positive. Received: seconds={seconds}")
        self.seconds = seconds
        self.start = None
        self.stopped = False

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if time.perf_counter() - self.start >= self.seconds:
            self.model.stop_training = True
            self.stopped = True
