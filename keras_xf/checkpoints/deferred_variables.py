"""Models built without variable values, each variable taking a checkpoint tensor as its first
value: loading never holds a randomly initialised copy of the weights beside the checkpoint's.

Keras defers the initialisation of variables created inside a `keras.StatelessScope`: such a
variable keeps its initializer and no value until Keras initialises it. The loader builds its
model that way (`built_without_values`), gives every checkpoint variable the tensor just read
as its first value (`fill`), and initialises the variables that no tensor fills (random seeds,
anything a family leaves at its default) as Keras would on leaving the scope
(`initialize_unfilled`). Keras has no public call for the last two steps: they go through
`keras_xf.ops.keras_internals`.
"""

import contextlib

import keras

from keras_xf.ops.keras_internals import holds_value
from keras_xf.ops.keras_internals import initialize_deferred
from keras_xf.ops.keras_internals import take_deferred_variables


@contextlib.contextmanager
def built_without_values():
    """Variables created inside hold no value until `fill` or `initialize_unfilled`."""
    with keras.StatelessScope(initialize_variables=False):
        yield


def is_unfilled(variable):
    return not holds_value(variable)


def fill(variable, value):
    """Gives `variable` the array `value` (of the variable's dtype): its first value when it
    was built without one, else an assignment."""
    if not is_unfilled(variable):
        variable.assign(value)
        return
    initialize_deferred(variable, value)


def initialize_unfilled():
    """Initialises every deferred variable that `fill` did not reach, with its own
    initializer, and empties Keras' list of deferred variables."""
    for variable in take_deferred_variables():
        if is_unfilled(variable):
            initialize_deferred(variable)
