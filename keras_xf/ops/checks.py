"""Checks of call inputs and constructor arguments, shared by every public layer and model.

Each check reads static shapes only (no tensor values, so everything still compiles) and
raises a `ValueError` that names the argument, what was expected and what was received. A
dimension unknown at trace time (`None`) is not compared: it is checked again when the
layer runs with concrete shapes.
"""

import numbers

import math

import keras
import numpy as np


def static_dim(dim):
    """`dim` as an int, or `None` when it is unknown at trace time."""
    return dim if isinstance(dim, int) else None


def _dims_differ(received, expected):
    received, expected = static_dim(received), static_dim(expected)
    return received is not None and expected is not None and received != expected


def _shape(tensor):
    return tuple(tensor.shape)


def is_array(value):
    """Whether `value` is a backend tensor, a symbolic `KerasTensor`, a Keras variable or a
    numpy array: a value with a shape, as a cache or state given to a layer must be."""
    return keras.ops.is_tensor(value) or isinstance(
        value, (keras.KerasTensor, keras.Variable, np.ndarray))


def check_rank(name, tensor, ranks, layout):
    """`tensor` has one of `ranks` (an int or a tuple of ints); `layout` describes it."""
    ranks = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if len(tensor.shape) not in ranks:
        raise ValueError(
            f"{name} must have rank {' or '.join(str(r) for r in ranks)} {layout}. "
            f"Received: {name}.shape={_shape(tensor)}"
        )


def check_padding_mask(padding_mask, inputs, name="padding_mask", inputs_name="inputs"):
    """A padding mask `[batch, length]` matching the first two axes of `inputs`.

    Returns the mask unchanged, or `None` when it is `None`.
    """
    if padding_mask is None:
        return None
    expected = _shape(inputs)[:2]
    shape = _shape(padding_mask)
    if len(shape) != 2 or any(_dims_differ(r, e) for r, e in zip(shape, expected)):
        raise ValueError(
            f"{name} must have shape [batch, length] = {expected}, matching "
            f"{inputs_name}.shape={_shape(inputs)}. Received: {name}.shape={shape}"
        )
    return padding_mask


def check_attention_matrix(matrix, name, batch_size, query_length, key_length, num_heads=None):
    """A matrix over query and key positions: `[batch, T, S]`, or `[batch, H, T, S]` with `H`
    equal to `num_heads` (or 1). Used for `attention_mask`, `attention_bias`,
    `attention_multiplier` and attention weights given from outside.

    Returns the matrix unchanged, or `None` when it is `None`.
    """
    if matrix is None:
        return None
    shape = _shape(matrix)
    heads = "H" if num_heads is None else f"num_heads={num_heads}"
    layout = (
        f"[batch, query_length, key_length] = ({batch_size}, {query_length}, {key_length}) "
        f"or [batch, {heads} or 1, query_length, key_length]"
    )
    problem = len(shape) not in (3, 4)
    if not problem:
        batch, queries, keys = shape[0], shape[-2], shape[-1]
        problem = (
            _dims_differ(batch, batch_size)
            or _dims_differ(queries, query_length)
            or _dims_differ(keys, key_length)
        )
        if len(shape) == 4 and num_heads is not None:
            problem = problem or static_dim(shape[1]) not in (None, 1, num_heads)
    if problem:
        raise ValueError(f"{name} must have shape {layout}. Received: {name}.shape={shape}")
    return matrix


def check_positive_number(name, value, allow_zero=False):
    """A finite real number `> 0` (or `>= 0` with `allow_zero`), not a bool."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "a non-negative number" if allow_zero else "a positive number"
        raise ValueError(f"{name} must be {kind}. Received: {name}={value!r}")
    return value


def check_positive_int(name, value, minimum=1):
    """An int `>= minimum` (a NumPy int too, returned as an `int`), not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{name} must be {kind}. Received: {name}={value!r}")
    return int(value)


def check_bool(name, value):
    """A Python bool (not an int or a string standing for one)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool. Received: {name}={value!r}")
    return value


def known_width(shape, name="inputs"):
    """The last dimension of `shape` (a shape given to `build`), which must be known: the
    layer's weights are sized by it."""
    width = shape[-1]
    if not isinstance(width, int):
        raise ValueError(f"{name} must have a known last dimension. Received: "
                         f"{name}.shape={tuple(shape)}")
    return width


def check_seed(seed, name="seed"):
    """`None` (a fresh draw) or an int `>= 0` (a NumPy int too, returned as an `int`)."""
    if seed is None:
        return None
    return check_positive_int(name, seed, minimum=0)


def check_rate(name, value):
    """A rate in `[0, 1)` (dropout)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1
    if not ok:
        raise ValueError(f"{name} must be a number in [0, 1). Received: {name}={value!r}")
    return value


def check_probability(name, value):
    """A probability in `[0, 1]` (a decision threshold, a target fraction), as a float."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    if not ok:
        raise ValueError(f"{name} must be a number in [0, 1]. Received: {name}={value!r}")
    return float(value)


def get_initializer(name, value):
    """`keras.initializers.get(value)`, raising a `ValueError` that names the argument.

    `None` is refused here (Keras would return it as it is); layers whose initializer is
    optional handle `None` before calling this."""
    if value is None:
        raise ValueError(
            f"{name} must be a Keras initializer, its name or its config. Received: {name}=None"
        )
    try:
        return keras.initializers.get(value)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{name} must be a Keras initializer, its name or its config. Received: "
            f"{name}={value!r} ({error})"
        ) from None


def get_activation(name, value):
    """`keras.activations.get(value)`, raising a `ValueError` that names the argument."""
    try:
        return keras.activations.get(value)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"{name} must be a Keras activation or its name. Received: {name}={value!r} ({error})"
        ) from None


def check_sequence_width(inputs, width=None, name="inputs"):
    """A sequence `[batch, length, dim]` whose `dim` is `width`, the width the layer was built
    for (`None`: any width)."""
    check_rank(name, inputs, 3, "[batch, length, dim]")
    if width is not None and _dims_differ(inputs.shape[-1], width):
        raise ValueError(
            f"{name} must have shape [batch, length, {width}]: the layer was built for width "
            f"{width}. Received: {name}.shape={_shape(inputs)}"
        )
    return inputs


def check_width(inputs, width, name="inputs"):
    """A tensor `[..., width]`, `width` being the one the layer was built for."""
    shape = _shape(inputs)
    if not shape or _dims_differ(shape[-1], width):
        raise ValueError(
            f"{name} must have shape [..., {width}]: the layer was built for width {width}. "
            f"Received: {name}.shape={shape}"
        )
    return inputs


def check_token_mask(mask, inputs, name="padding_mask", inputs_name="inputs"):
    """A mask over the tokens of `inputs` `[..., d]`: shape `inputs.shape[:-1]`."""
    if mask is None:
        return None
    shape, expected = _shape(mask), _shape(inputs)[:-1]
    if len(shape) != len(expected) or any(_dims_differ(r, e) for r, e in zip(shape, expected)):
        raise ValueError(
            f"{name} must have shape {expected} (the axes of {inputs_name} but the last), "
            f"matching {inputs_name}.shape={_shape(inputs)}. Received: {name}.shape={shape}"
        )
    return mask


def _known_shape(tensor):
    """`tensor`'s shape, or `None` where its rank is unknown (a TensorFlow trace)."""
    try:
        return _shape(tensor)
    except ValueError:
        return None


def check_state(state, name, shape):
    """A cache or state tensor of `shape` (`None` entries: any size on that axis; a tensor of
    unknown rank in a TensorFlow trace is not checked)."""
    if is_array(state) and _known_shape(state) is None:
        return state
    received = _shape(state) if is_array(state) else None
    if (
        received is None
        or len(received) != len(shape)
        or any(_dims_differ(r, e) for r, e in zip(received, shape))
    ):
        what = f"{name}.shape={received}" if received is not None else (
            f"{name} of type {type(state).__name__}"
        )
        raise ValueError(f"{name} must have shape {tuple(shape)}. Received: {what}")
    return state


def check_states(states, name, shapes):
    """A tuple (or list) of cache or state tensors, one of each shape in `shapes`."""
    if not isinstance(states, (tuple, list)) or len(states) != len(shapes):
        received = (
            f"{len(states)} tensors" if isinstance(states, (tuple, list))
            else f"a {type(states).__name__}"
        )
        raise ValueError(
            f"{name} must be a tuple of {len(shapes)} tensors of shapes "
            f"{', '.join(str(tuple(s)) for s in shapes)}. Received: {received}"
        )
    for i, (state, shape) in enumerate(zip(states, shapes)):
        check_state(state, f"{name}[{i}]", shape)
    return states


def check_positions(positions, inputs, name="positions", inputs_name="inputs"):
    """Positions `[length]` or `[batch, length]` matching the first two axes of `inputs`."""
    if positions is None:
        return None
    shape, expected = _shape(positions), _shape(inputs)[:2]
    if len(shape) not in (1, 2) or any(
        _dims_differ(r, e) for r, e in zip(shape, expected[2 - len(shape):])
    ):
        raise ValueError(
            f"{name} must have shape [length] = ({expected[1]},) or [batch, length] = "
            f"{expected}, matching {inputs_name}.shape={_shape(inputs)}. "
            f"Received: {name}.shape={shape}"
        )
    return positions


def check_key_padding_mask(padding_mask, batch_size, key_length, keys, name="padding_mask"):
    """A padding mask `[batch, key_length]` over the keys of an attention layer, whose keys
    come from `keys` (a description: `"value.shape=(2, 6, 16)"`, `"the cache of length 8"`).

    Returns the mask unchanged, or `None` when it is `None`.
    """
    if padding_mask is None:
        return None
    shape = _shape(padding_mask)
    if len(shape) != 2 or _dims_differ(shape[0], batch_size) or _dims_differ(shape[1], key_length):
        raise ValueError(
            f"{name} must have shape [batch, key_length] = ({batch_size}, {key_length}), "
            f"matching {keys}. Received: {name}.shape={shape}"
        )
    return padding_mask


def check_attention_mask(mask, batch_size, query_length, key_length, num_heads=None,
                         name="attention_mask"):
    """A boolean attention mask: `[query_length, key_length]` shared by the batch, or one of
    the layouts of `check_attention_matrix`.

    Returns the mask unchanged, or `None` when it is `None`.
    """
    if mask is None or len(mask.shape) != 2:
        return check_attention_matrix(mask, name, batch_size, query_length, key_length, num_heads)
    shape = _shape(mask)
    if _dims_differ(shape[0], query_length) or _dims_differ(shape[1], key_length):
        raise ValueError(
            f"{name} of rank 2 must have shape [query_length, key_length] = ({query_length}, "
            f"{key_length}). Received: {name}.shape={shape}"
        )
    return mask


def check_output_length(output_length, inputs, name="output_length", inputs_name="inputs"):
    """`None`, or an int `n` with `1 <= n <= length` of `inputs` `[batch, length, dim]` (the
    length when it is known at trace time): the first `n` positions a layer computes."""
    if output_length is None:
        return None
    check_positive_int(name, output_length)
    length = static_dim(tuple(inputs.shape)[1])
    if length is not None and output_length > length:
        raise ValueError(
            f"{name} must be at most the length of {inputs_name}, "
            f"{inputs_name}.shape={_shape(inputs)}. Received: {name}={output_length}"
        )
    return int(output_length)


def token_sample_weight(sample_weight, labels_shape):
    """`sample_weight` of a token loss as float32, with trailing axes added to broadcast
    against labels of `labels_shape`: `[batch]` (one weight per sequence) or the labels'
    shape (or a prefix of it); any other shape raises a `ValueError`."""
    sample_weight = keras.ops.convert_to_tensor(sample_weight)
    shape, expected = tuple(sample_weight.shape), tuple(labels_shape)
    if len(shape) > len(expected) or any(
        None not in (static_dim(s), static_dim(e)) and s != e for s, e in zip(shape, expected)
    ):
        raise ValueError(
            "sample_weight must have shape [batch] or the shape of y_true "
            f"{expected} (or a prefix of it). Received: sample_weight.shape={shape}"
        )
    sample_weight = keras.ops.cast(sample_weight, "float32")
    while len(sample_weight.shape) < len(expected):
        sample_weight = sample_weight[..., None]
    return sample_weight


def check_finite_number(name, value):
    """A finite real number of any sign (an exponent, a signed weight), not a bool."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number. Received: {name}={value!r}")
    return value


def check_per_head_fractions(name, value, num_heads):
    """A float in (0, 1) for every head, or a list of `num_heads` of them: the list of one
    value per head."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))
           or not 0 < v < 1]
    if bad or (isinstance(value, (list, tuple)) and len(values) != num_heads):
        raise ValueError(
            f"{name} must be a float in (0, 1), or a list of one such float per head "
            f"({num_heads}). Received: {name}={value!r}"
        )
    return values if isinstance(value, (list, tuple)) else values * num_heads
