"""Input signatures of exported models: free batch and lengths, and which inputs share them.

keras_xf's models take a dict of int32 `[batch, length]` tensors, and the inputs of one
sequence (`token_ids`, `padding_mask`, `segment_ids`; or `encoder_…` / `decoder_…`) must share
their batch and length. Keras' own `model.export` does not know that: on JAX it gives every
`None` dimension its own symbol, so attention cannot broadcast a `[batch, a]` padding mask
against `[batch, b]` queries. The functions here name the shared dimensions; inputs whose
dimensions after the batch are static (`images` `[batch, H, W, C]`) keep only the batch free.
"""

import keras

from keras_xf.export.endpoints import model_endpoints

# Input-name endings that mark the tensors of one sequence; the prefix before the ending names
# the sequence ("" for `token_ids`, "encoder_" for `encoder_token_ids`, ...).
SEQUENCE_INPUT_SUFFIXES = ("token_ids", "padding_mask", "segment_ids")


def input_signature(model):
    """`[{name: keras.InputSpec([None, None], dtype, name=name)}]`: the model's dict inputs,
    with every dimension but fixed feature sizes left free (Keras' export convention: one
    positional argument holding the whole dict). `model`: a keras_xf model or its
    `ExportEndpoints`."""
    return free_signature(model_endpoints(model))


def free_signature(endpoints):
    """`input_signature` of an `ExportEndpoints`."""
    return [
        {
            name: keras.InputSpec(
                shape=(None,) + tuple(spec.shape[1:]), dtype=spec.dtype, name=name
            )
            for name, spec in dict_inputs(endpoints).items()
        }
    ]


def sequence_dimensions(model):
    """`{input name: (batch symbol, length symbol)}`: inputs of one sequence share a symbol.

    `token_ids` / `padding_mask` → `("batch", "length")`; `encoder_token_ids` →
    `("batch", "encoder_length")`; an input with another name gets a length of its own; an
    input of rank above 2 with static trailing dimensions (`images`) → `("batch",)`.
    `model`: a keras_xf model or its `ExportEndpoints`.
    """
    dims = {}
    for name, spec in dict_inputs(model_endpoints(model)).items():
        if len(spec.shape) > 2:
            dims[name] = ("batch",)  # a fixed-shape input (images): only the batch is free
            continue
        for suffix in SEQUENCE_INPUT_SUFFIXES:
            if name.endswith(suffix):
                dims[name] = ("batch", f"{name[: -len(suffix)]}length")
                break
        else:
            dims[name] = ("batch", f"{name}_length")
    return dims


def dict_inputs(endpoints):
    """The `{name: spec}` inputs of `endpoints`, checked: `[batch, length]`, or static after
    the batch (images)."""
    inputs = endpoints.inputs
    if not isinstance(inputs, dict):
        raise ValueError(
            "keras_xf.export handles functional models with dict inputs (keras_xf's models). "
            f"Received inputs: {inputs!r}; use `model.export` directly."
        )
    for name, spec in inputs.items():
        fixed_shape = len(spec.shape) > 2 and None not in spec.shape[1:]
        if len(spec.shape) != 2 and not fixed_shape:
            raise ValueError(
                "keras_xf.export expects [batch, length] inputs, or inputs whose dimensions "
                f"after the batch are static (images). Received: {name} with shape {spec.shape}"
            )
    return inputs


def polymorphic_shapes(endpoints, signature):
    """jax2tf `polymorphic_shapes` for the dict argument, e.g. `"(batch, length)"`: the free
    dimensions of `signature` get keras_xf's shared symbols, the others their size. `None`
    when `signature` is not one dict with the model's input names (Keras' defaults apply)."""
    inputs = dict_inputs(endpoints)
    if not (isinstance(signature, (list, tuple)) and len(signature) == 1
            and isinstance(signature[0], dict) and set(signature[0]) == set(inputs)):
        return None
    shapes = {}
    for name, dims in sequence_dimensions(endpoints).items():
        sizes = tuple(signature[0][name].shape)
        symbols = list(dims) + [None] * (len(sizes) - len(dims))
        shapes[name] = "({})".format(", ".join(
            str(size) if size is not None or symbol is None else symbol
            for size, symbol in zip(sizes, symbols)
        ))
    return shapes


def length_constraints(endpoints, signature):
    """`("length <= 512", ...)` for the lengths left free in `signature`: lengths fit the
    model's `max_sequence_length` (learned positions slice their table, which jax2tf must
    prove in bounds)."""
    max_length = endpoints.max_sequence_length
    if max_length is None:
        return ()
    lengths = sorted({dims[1] for name, dims in sequence_dimensions(endpoints).items()
                      if len(dims) > 1 and tuple(signature[0][name].shape)[1] is None})
    return tuple(f"{length} <= {int(max_length)}" for length in lengths)


def jax2tf_kwargs(endpoints, signature, given=None, extra_shapes=None):
    """`jax2tf_kwargs` with keras_xf's defaults filled in where `given` has none;
    `extra_shapes` adds polymorphic shapes for inputs that are not the model's."""
    kwargs = dict(given or {})
    shapes = polymorphic_shapes(endpoints, signature)
    if shapes is not None:
        kwargs.setdefault("polymorphic_shapes", [{**shapes, **(extra_shapes or {})}])
        kwargs.setdefault("polymorphic_constraints", length_constraints(endpoints, signature))
    # An inference artefact: jax2tf's gradient function drops the constraints above.
    kwargs.setdefault("with_gradient", False)
    return kwargs
