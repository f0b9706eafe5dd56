"""Fresh copies of layers from their configs (used by stacks, blocks and model builders)."""

import keras


def _strip_shared_ids(config, keys=("shared_object_id",)):
    """A plain copy of a serialised config (dicts, lists and tuples rebuilt, leaves kept)
    without Keras's `shared_object_id` markers (or whichever `keys`), so that deserialising
    makes new objects instead of reusing ones seen before in the same saving or loading scope.

    Not `copy.deepcopy`: a config kept as a layer attribute is a Keras tracked container
    whose tracker refers to the layer's sub-layers, and deep-copying it would pickle them."""
    if isinstance(config, dict):
        return {k: _strip_shared_ids(v, keys) for k, v in config.items() if k not in keys}
    if isinstance(config, list):
        return [_strip_shared_ids(v, keys) for v in config]
    if isinstance(config, tuple):
        return tuple(_strip_shared_ids(v, keys) for v in config)
    return config


def serialize_layer(layer):
    """A serialised config of `layer` (a layer or an already serialised dict), as a copy."""
    if isinstance(layer, keras.layers.Layer):
        layer = keras.saving.serialize_keras_object(layer)
    return _strip_shared_ids(layer)


def serialize_template(layer):
    """A serialised config of a template layer (a layer or a serialised dict) without the
    build configs of the layer and of its sub-layers: the copies a stack makes of a template
    that was already built or called are unbuilt, and the stack builds them.

    Only for templates: `clone_layer` keeps build configs, which loading a saved layer needs
    (a sub-layer that its parent's `build` does not build is built from its own)."""
    if isinstance(layer, keras.layers.Layer):
        layer = keras.saving.serialize_keras_object(layer)
    return _strip_shared_ids(layer, ("shared_object_id", "build_config"))


def clone_layer(layer, **config_overrides):
    """A new, unbuilt layer with the config of `layer` (a layer or a serialised dict), with
    `config_overrides` applied to its top-level config."""
    serialized = serialize_layer(layer)
    serialized["config"] = dict(serialized["config"], **config_overrides)
    return keras.saving.deserialize_keras_object(serialized)


def as_layer(layer, name, optional=False, kind=None):
    """`layer` itself when it is a Keras layer, a new layer when it is a serialised layer
    config (from `keras.saving.serialize_keras_object`), `None` when it is `None` and
    `optional`; otherwise a `ValueError` naming the argument `name`. With `kind` (a class or
    a tuple of classes), the layer must also be an instance of it (e.g. `pattern` an
    `AttentionPattern`)."""
    if layer is None and optional:
        return None
    if isinstance(layer, dict) and "class_name" in layer and "config" in layer:
        layer = clone_layer(layer)
    if not isinstance(layer, keras.layers.Layer):
        raise ValueError(
            f"{name} must be a Keras layer or a serialised layer config. Received: "
            f"{name}={layer!r} of type {type(layer).__name__}"
        )
    if kind is not None and not isinstance(layer, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(k.__name__ for k in kinds)
        raise ValueError(
            f"{name} must be an instance of {expected} (or of a subclass). Received: "
            f"{name}={type(layer).__name__}"
        )
    return layer


def with_dtype_policy(layer, policy):
    """`layer` itself when it already uses `policy` (or is built); else an unbuilt copy that
    uses it. Lets a block's `dtype` reach the sub-layers it was given."""
    if layer is None or policy is None or layer.built:
        return layer
    if layer.dtype_policy.name == policy.name:
        return layer
    return clone_layer(layer, dtype=keras.dtype_policies.serialize(policy))


def clone_initializer(initializer):
    """A fresh copy of a Keras initializer. An unseeded initializer instance draws its seed
    once, so sharing one between weights of equal shape would give them identical values."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
