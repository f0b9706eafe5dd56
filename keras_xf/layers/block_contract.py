"""The block contract shared by `Residual`, `TransformerBlock`, `TransformerStack` and
`GatedCrossAttentionBlock`: what a mixer returns, and how mixer arguments pass through.

A sequence mixer returns `outputs`, or `(outputs, new_cache)` with a cache; when the caller
asks for more (e.g. `return_attention_scores=True`) it returns one dict `{"outputs": …,
"attention_scores": …}` plus `"cache"` when a cache was given. The generic layers handle the
arguments in `GENERIC_ARGUMENTS` and pass every other keyword argument to the mixer unchanged.
"""

import keras

# Call arguments that the generic layers handle themselves; every other keyword argument
# belongs to the mixer and is passed through.
GENERIC_ARGUMENTS = (
    "context",
    "padding_mask",
    "attention_mask",
    "encoder_outputs",
    "encoder_padding_mask",
    "use_causal_mask",
    "cache",
    "cache_index",
    "training",
    "mixer_options",
    "output_length",
)


def _is_tensor(value):
    """A tensor, a symbolic tensor, or an array that Keras's `Layer.__call__` converts to one."""
    return (
        keras.ops.is_tensor(value)
        or isinstance(value, keras.KerasTensor)
        or hasattr(value, "__array__")
    )


def _holds_tensors(value):
    return any(_is_tensor(leaf) for leaf in keras.tree.flatten(value))


def mixer_arguments(kwargs, mixer_options=None):
    """The mixer-specific call arguments (not generic, not `None`) in `kwargs` and in
    `mixer_options`, as one dict to pass to the mixer."""
    merged = dict(kwargs, **(mixer_options or {}))
    return {k: v for k, v in merged.items() if k not in GENERIC_ARGUMENTS and v is not None}


class PassesMixerArguments:
    """Mixed into the generic layers (before `keras.layers.Layer`): their `call` takes
    `mixer_options=None, **kwargs` and passes both to the mixer.

    Keras's `Layer.__call__` refuses a catch-all `**kwargs` that mixes tensors with Python
    values (e.g. `attention_bias=<tensor>, return_attention_scores=True`), so the Python values
    travel in the named argument `mixer_options` and the tensors in `**kwargs`, which keeps
    both in the functional graph's record of the call.
    """

    def __call__(self, *args, **kwargs):
        options = dict(kwargs.pop("mixer_options", None) or {})
        for key in [k for k in kwargs if k not in GENERIC_ARGUMENTS]:
            if not _holds_tensors(kwargs[key]):
                value = kwargs.pop(key)
                if value is not None:
                    options[key] = value
        if options:
            kwargs["mixer_options"] = options
        return super().__call__(*args, **kwargs)


def first_positions(shape, output_length):
    """The outputs' shape: `shape` `[B, T, d]`, with `T` replaced by `output_length` (the
    generic layers' call argument: only the first positions are computed) when given."""
    shape = tuple(shape)
    return shape if output_length is None else (shape[0], output_length) + shape[2:]


def new_specs(structure):
    """Fresh `KerasTensor`s with the shapes and dtypes of a nested structure (a new cache)."""
    if structure is None:
        return None
    return keras.tree.map_structure(lambda t: keras.KerasTensor(t.shape, dtype=t.dtype), structure)


def split_results(results, has_cache):
    """`(outputs, new_cache, extras)` from what a mixer or block returned under the block
    contract: `outputs`, `(outputs, new_cache)`, or a dict with `outputs`, optionally `cache`,
    and extras (e.g. `attention_scores`). `extras` is `None` when the result is not a dict."""
    if isinstance(results, dict):
        extras = dict(results)
        return extras.pop("outputs"), extras.pop("cache", None), extras
    if has_cache:
        outputs, new_cache = results
        return outputs, new_cache, None
    return results, None, None


def join_results(outputs, new_cache, extras, has_cache):
    """The inverse of `split_results`: the block contract's return value."""
    if extras is None:
        return (outputs, new_cache) if has_cache else outputs
    results = dict(extras, outputs=outputs)
    if has_cache:
        results["cache"] = new_cache
    return results
