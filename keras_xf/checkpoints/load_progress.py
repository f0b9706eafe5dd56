"""A progress bar over the bytes a checkpoint loader gives to a model's variables."""

import keras

# Checkpoints whose variables take more than this many bytes show a bar unless told not to.
SHOWN_ABOVE_BYTES = 100 * 2**20


class LoadProgress:
    """Keras' `Progbar` counting the megabytes of the variables filled so far.

    Args:
        total_bytes: the bytes of every variable the load fills.
        progress: `True` shows the bar, `False` hides it, `None` shows it when `total_bytes`
            exceeds 100 MB. The bar writes where Keras' `fit` writes its own (hidden from a
            console by `keras.config.disable_interactive_logging()`).
    """

    def __init__(self, total_bytes, progress=None):
        if progress not in (None, True, False):
            raise ValueError(f"progress must be True, False or None. Received: "
                             f"progress={progress!r}")
        shown = total_bytes > SHOWN_ABOVE_BYTES if progress is None else progress
        self._megabytes = 0.0
        self._bar = (keras.utils.Progbar(max(total_bytes / 2**20, 1e-6), unit_name="MB")
                     if shown else None)

    def advance(self, num_bytes):
        """Counts `num_bytes` more as loaded."""
        self._megabytes += num_bytes / 2**20
        if self._bar is not None:
            self._bar.update(round(self._megabytes, 1))

    def finish(self):
        """Completes the bar (the last update Keras prints)."""
        if self._bar is not None:
            self._bar.update(self._bar.target, finalize=True)
