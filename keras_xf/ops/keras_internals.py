"""Everything keras_xf needs of Keras and keras-hub that they offer no public API for.

The rest of the library reads no private attribute of an object it does not own and imports
nothing from `keras.src` or `keras_hub.src` (checked by `tests/once/test_private_access.py`); where
Keras has no public route, the reach lives here, one function each, with the reason in its
docstring, so that a Keras upgrade has one file to check (`tests/ops/test_keras_internals.py`
tests each function against the installed Keras).
"""

from keras.src.backend.common import global_state
from keras.src.backend.common.stateless_scope import in_stateless_scope
from keras.src.losses.loss import scale_loss_for_distribution as _scale_loss_for_distribution

# Keras' global-state key for the variables created in a `keras.StatelessScope` that still
# wait for their first value (`keras.src.backend.common.variables`).
_DEFERRED_VARIABLES = "uninitialized_variables"


def sublayers(layer, include_self=False):
    """Every layer inside `layer` (its sub-layers, theirs, …), each once, in Keras' own order.

    Why here: `keras.Layer` has no public list of its sub-layers (`Model.layers` is a
    functional model's top level only); this is Keras' own walk, `Layer._flatten_layers`.
    """
    return layer._flatten_layers(include_self=include_self, recursive=True)


def track_torch_variables(layer):
    """Registers a layer's variables as its PyTorch parameters again (PyTorch backend), so
    that `parameters()` (torch.onnx, torch.export) sees them; nothing for variables created
    without values in a `keras.StatelessScope`, which Keras tracks when first asked.

    Why here: Keras tracks them once, at build, through its private `_track_variables`; a
    functional model whose attributes were kept out of torch's `__setattr__` needs it again.
    """
    if not in_stateless_scope():
        layer._track_variables()


def holds_value(variable):
    """Whether `variable` holds a value now.

    Why here: Keras has no public test, and two variables hold none: one created in a
    `keras.StatelessScope(initialize_variables=False)` until its first value, and every
    model variable while the JAX trainer holds the state of a traced step (there
    `variable.value` would run the initializer, or fail).
    """
    return variable._value is not None


def initialize_deferred(variable, value=None):
    """Gives a variable created in a `keras.StatelessScope` without a value its first value:
    `value` (an array of the variable's shape and dtype), else its own initializer's.

    Why here: Keras initialises such variables only on leaving the scope, all of them and
    each by its own initializer (`StatelessScope.__exit__`); the loader gives each its
    checkpoint tensor instead, without drawing a random value first.
    """
    if value is not None:
        variable._initializer = lambda shape, dtype=None: value
    variable._deferred_initialize()


def take_deferred_variables():
    """The variables Keras keeps for initialisation on leaving a `keras.StatelessScope`;
    the list is emptied (the caller initialises them).

    Why here: Keras keeps the list in its global state, with no public accessor, and its own
    `initialize_all_variables` raises for a variable that has been given a value already.
    """
    pending = global_state.get_global_attribute(_DEFERRED_VARIABLES) or []
    global_state.set_global_attribute(_DEFERRED_VARIABLES, [])
    return list(pending)


def scale_loss_for_distribution(value):
    """`value` divided by the number of replicas in sync under a TensorFlow distribution
    strategy (unchanged elsewhere), as Keras scales its own losses.

    Why here: Keras does not export its `keras.src.losses.loss.scale_loss_for_distribution`,
    and a loss that reduces by itself must scale as Keras' losses do.
    """
    return _scale_loss_for_distribution(value)


def keras_hub_exported_backbones():
    """The keras-hub backbone classes that keras-hub's Hugging Face exporter writes.

    Why here: keras-hub keeps its exporter's table, keyed by class name, in
    `keras_hub.src.utils.transformers.export.hf_exporter`, with no public accessor; the
    names are resolved to the public classes of `keras_hub.models` once, here.
    """
    import keras_hub
    from keras_hub.src.utils.transformers.export.hf_exporter import MODEL_CONFIGS

    return frozenset(getattr(keras_hub.models, name) for name in MODEL_CONFIGS
                     if isinstance(getattr(keras_hub.models, name, None), type))


def export_keras_hub_backbone(backbone, directory):
    """Writes a keras-hub backbone as a Hugging Face folder (`config.json` and safetensors)
    into `directory`, with its `lm_head` when its embeddings are untied.

    Why here: keras-hub's public `Backbone.export_to_transformers` leaves an untied `lm_head`
    out; its exporter, `keras_hub.src.utils.transformers.export.hf_exporter.export_backbone`,
    writes it when asked.
    """
    from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone

    export_backbone(backbone, directory, include_lm_head=True)
