"""Strings into a task: the checks of a task's `preprocessor=` and the preprocessing of the
text that `fit`, `evaluate` and `predict` receive (host-side, before Keras sees the data)."""

import keras

from keras_xf.preprocessing import is_text


def task_preprocessor(model_class, preprocessor):
    """`None`, or a preprocessor of the kind `model_class.preprocessor_class` names (a
    serialised one is deserialised); anything else raises a `ValueError`."""
    if preprocessor is None:
        return None
    if isinstance(preprocessor, dict):
        preprocessor = keras.saving.deserialize_keras_object(preprocessor)
    expected = model_class.preprocessor_class
    if expected is None or not isinstance(preprocessor, expected):
        wanted = "None" if expected is None else f"None or a {expected.__name__}"
        raise ValueError(
            f"{model_class.__name__} takes preprocessor={wanted}. Received: preprocessor of "
            f"type {type(preprocessor).__name__}"
        )
    return preprocessor


def holds_text(x):
    """Whether `x` is text, or a dict of texts (a seq2seq model's sources and targets)."""
    if isinstance(x, dict):
        return len(x) > 0 and all(is_text(value) for value in x.values())
    return is_text(x)


def preprocessed(preprocessor, x, y=None, sample_weight=None):
    """`(x, y, sample_weight)` with text `x` run through `preprocessor`; other inputs, or
    a model without preprocessor, pass unchanged."""
    if preprocessor is None or not holds_text(x):
        return x, y, sample_weight
    return keras.utils.unpack_x_y_sample_weight(preprocessor(x, y, sample_weight))


def preprocessed_validation(preprocessor, validation_data):
    """`fit`'s `validation_data` with a text tuple `(x, y, sample_weight)` preprocessed."""
    if preprocessor is None or not isinstance(validation_data, tuple):
        return validation_data
    return preprocessed(preprocessor, *validation_data)

