"""Models built without variable values, each variable taking a checkpoint tensor as its first
value: loading never holds a randomly initialised copy of the weights beside the checkpoint's.

Keras defers the initialisation of variables created inside a `keras.StatelessScope`: such a
variable keeps its initializer and no value until `_deferred_initialize()` runs it. The
loader builds its model that way (`built_without_values`), gives every checkpoint variable an
initializer that returns the tensor just read (`fill`), and initialises the variables that no
tensor fills (random seeds, anything a family leaves at its default) as Keras would on leaving
the scope (`initialize_unfilled`). Keras has no public call for the last two steps; they use
the same private hooks as `keras.StatelessScope.__exit__`.
"""

import contextlib

import keras
from keras.src.backend.common import global_state


@contextlib.contextmanager
def built_without_values():
    """Variables created inside hold no value until `fill` or `initialize_unfilled`."""
    with keras.StatelessScope(initialize_variables=False):
        yield


def is_unfilled(variable):
    return getattr(variable, "_value", None) is None


def fill(variable, value):
    """Gives `variable` the array `value` (of the variable's dtype): its first value when it
    was built without one, else an assignment."""
    if not is_unfilled(variable):
        variable.assign(value)
        return
    variable._initializer = lambda shape, dtype=None: value
    variable._deferred_initialize()


def initialize_unfilled():
    """Initialises every deferred variable that `fill` did not reach, with its own
    initializer, and empties Keras' list of deferred variables."""
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [])
    for variable in pending:
        if is_unfilled(variable):
            variable._deferred_initialize()
