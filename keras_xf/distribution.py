"""Layout maps that shard keras_xf models with `keras.distribution` (survey §5.8).

`layout_map(model, device_mesh)` reads a built model's variables and returns a
`keras.distribution.LayoutMap` for `keras.distribution.ModelParallel`: tensor (model)
parallelism over attention heads and feedforward hidden units, expert parallelism over the
leading axis of mixture-of-experts weights, and a vocabulary- or width-sharded embedding.

Backends: `ModelParallel` (and the sharding of variables by a layout map) is implemented by
Keras 3 for JAX only. On TensorFlow, Keras's `keras.distribution` backend is an unfinished
DTensor prototype that variable creation and `fit` do not consult: use
`tf.distribute.MirroredStrategy` (data parallelism) with a `strategy.scope()` instead. On
PyTorch Keras has no `keras.distribution` backend at all (`DataParallel` and `ModelParallel`
cannot be used): wrap the model in `torch.nn.parallel.DistributedDataParallel` in a custom
training loop. The layout map itself is plain path and shape logic and can be built (and
checked) on every backend.
"""

import re

import keras

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.ops.keras_internals import sublayers

EMBEDDING_MODES = ("vocabulary", "width", None)
EXPERT_PREFIX = "expert_"

_SUFFIX = re.compile(r"^(.*?)(_\d+)?$")


def _axis_size(device_mesh, axis):
    return device_mesh.shape[list(device_mesh.axis_names).index(axis)]


def _attention_rules(layer, model_axis, sizes):
    """Query heads (and key/value heads when the axis divides them) and the output
    projection's input heads on the model axis; biases follow their heads."""
    rules = {}
    kv_heads = layer.num_key_value_heads
    kv_sharded = kv_heads % sizes[model_axis] == 0
    for dense, sharded in ((layer.query_dense, True), (layer.key_dense, kv_sharded),
                           (layer.value_dense, kv_sharded)):
        if not sharded:
            continue
        rules[id(dense.kernel)] = (None, model_axis, None)
        if getattr(dense, "bias", None) is not None:
            rules[id(dense.bias)] = (model_axis, None)
    rules[id(layer.output_dense.kernel)] = (model_axis, None, None)
    return rules


def _feedforward_rules(layer, model_axis):
    """Hidden units on the model axis: columns of `W_h` (and of the gate), rows of `W_f`."""
    rules = {}
    for dense in (layer.hidden_dense, layer.gate_dense):
        if dense is None:
            continue
        rules[id(dense.kernel)] = (None, model_axis)
        if getattr(dense, "bias", None) is not None:
            rules[id(dense.bias)] = (model_axis,)
    rules[id(layer.output_dense.kernel)] = (model_axis, None)
    return rules


def _embedding_rules(layer, model_axis, embedding):
    if embedding is None:
        return {}
    rules = {}
    if isinstance(layer, TokenEmbedding):
        vocabulary = embedding == "vocabulary"
        rules[id(layer.embeddings)] = (model_axis, None) if vocabulary else (None, model_axis)
        if not layer.tie_weights:
            rules[id(layer.reverse_embeddings)] = (
                (None, model_axis) if vocabulary else (model_axis, None)
            )
    elif embedding == "width":
        rules[id(layer.position_embeddings)] = (None, model_axis)
    return rules


def _expert_rules(model, expert_axis):
    """Variables named `expert_*` hold one slice per expert on their leading axis."""
    rules = {}
    for variable in model.variables:
        if variable.name.startswith(EXPERT_PREFIX) and len(variable.shape) >= 1:
            rules[id(variable)] = (expert_axis,) + (None,) * (len(variable.shape) - 1)
    return rules


def _general_key(path):
    """A regex matching `path` and the same path in another instance of the model, whose
    auto-numbered layer names (`feed_forward_3`, `block_1`) may differ."""
    parts = []
    for part in path.split("/"):
        base = _SUFFIX.match(part).group(1) or part
        parts.append(re.escape(base) + r"(?:_\d+)?")
    return "/".join(parts)


def _check_divides(variable, axes, device_mesh):
    for dim, axis in enumerate(axes):
        if axis is None:
            continue
        size = _axis_size(device_mesh, axis)
        if variable.shape[dim] % size:
            raise ValueError(
                f"The mesh axis '{axis}' (size {size}) does not divide dimension {dim} (size "
                f"{variable.shape[dim]}) of variable '{variable.path}' with shape "
                f"{tuple(variable.shape)}. Received: device_mesh={device_mesh}"
            )


def _validate(model, device_mesh, model_axis, expert_axis, embedding):
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a keras.Model. Received: model={model!r}")
    if not model.built or not model.variables:
        raise ValueError(f"model must be built (its variables are read). Received: model={model.name}")
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            f"device_mesh must be a keras.distribution.DeviceMesh. Received: device_mesh={device_mesh!r}"
        )
    names = list(device_mesh.axis_names)
    if model_axis not in names:
        raise ValueError(
            f"model_axis must be an axis of the device mesh {names}. Received: model_axis={model_axis!r}"
        )
    if expert_axis is not None and expert_axis not in names:
        raise ValueError(
            f"expert_axis must be an axis of the device mesh {names}. Received: "
            f"expert_axis={expert_axis!r}"
        )
    if embedding not in EMBEDDING_MODES:
        raise ValueError(
            f"embedding must be one of {EMBEDDING_MODES}. Received: embedding={embedding!r}"
        )


def variable_axes(model, device_mesh, model_axis="model", expert_axis=None,
                  embedding="vocabulary"):
    """`{variable.path: axes}` for the sharded variables of `model` (see `layout_map`)."""
    _validate(model, device_mesh, model_axis, expert_axis, embedding)
    if expert_axis is None:
        expert_axis = "expert" if "expert" in device_mesh.axis_names else model_axis
    sizes = {axis: _axis_size(device_mesh, axis) for axis in device_mesh.axis_names}
    rules = {}
    for layer in sublayers(model, include_self=True):
        if isinstance(layer, MultiHeadAttention):
            rules.update(_attention_rules(layer, model_axis, sizes))
        elif isinstance(layer, FeedForward):
            rules.update(_feedforward_rules(layer, model_axis))
        elif isinstance(layer, (TokenEmbedding, LearnedPositionEmbedding)):
            rules.update(_embedding_rules(layer, model_axis, embedding))
    rules.update(_expert_rules(model, expert_axis))
    axes = {}
    for variable in model.variables:
        if id(variable) in rules:
            _check_divides(variable, rules[id(variable)], device_mesh)
            axes[variable.path] = rules[id(variable)]
    return axes


def layout_map(model, device_mesh, model_axis="model", expert_axis=None,
               embedding="vocabulary"):
    """A `keras.distribution.LayoutMap` sharding a keras_xf model over a device mesh.

    Tensor parallelism as in Megatron (survey §5.8): in every `MultiHeadAttention` the
    query, key and value kernels `[d, H, d_h]` are split on the heads axis and the output
    kernel `[H, d_h, d]` on its input heads axis, so each device computes whole heads and
    one all-reduce sums the output; in every `FeedForward` the columns of `W_h` (and the
    gate) and the rows of `W_f` are split, so the hidden units `σ(H W_h)` never cross
    devices. Key/value projections with fewer heads than the model axis has devices (MQA,
    GQA) stay replicated. Variables whose name starts with `expert_` (mixture-of-experts
    weights `[M, …]`) are split on their leading expert axis. The token embedding is split
    by vocabulary rows (`embedding="vocabulary"`) or by width columns (`"width"`, which
    also splits a learned position table); `None` replicates it. Everything else (norms,
    output biases, routers) is replicated.

    Keys are regexes that ignore Keras's automatic name numbering, so the map built from one
    instance applies to a fresh instance created under `ModelParallel(...).scope()` (Keras
    shards a variable when it is created).

    Backends: Keras implements `ModelParallel` for JAX only. On TensorFlow use
    `tf.distribute.MirroredStrategy` (data parallel); on PyTorch, `DistributedDataParallel`
    in a custom loop (Keras has no `keras.distribution` backend for torch). `layout_map`
    itself works on every backend.

    Args:
        model: a built keras_xf model (`CausalLM`, `Seq2SeqLM`, `TextClassifier`,
            `TextEncoder`, a backbone, or any model made of keras_xf layers).
        device_mesh: a `keras.distribution.DeviceMesh`, e.g. shape `(2, 4)` with axes
            `("batch", "model")`.
        model_axis: str, the mesh axis for heads, hidden units and embeddings.
        expert_axis: str, the mesh axis for experts; defaults to an axis named `"expert"`
            when the mesh has one, else `model_axis`.
        embedding: `"vocabulary"`, `"width"` or `None`.

    Returns:
        A `keras.distribution.LayoutMap` on `device_mesh`.

    Raises:
        ValueError: for an axis not in the mesh, an unknown `embedding`, or a mesh axis that
            does not divide a sharded dimension (naming the variable, dimension and axis).

    Example:
    >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"))
    >>> layouts = layout_map(CausalLM(...), mesh)
    >>> with keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch").scope():
    ...     model = CausalLM(...)  # variables created sharded
    ...     model.compile(); model.fit(x, y)
    """
    axes = variable_axes(model, device_mesh, model_axis, expert_axis, embedding)
    layouts = keras.distribution.LayoutMap(device_mesh)
    general = {}
    for path, value in axes.items():
        general.setdefault(_general_key(path), set()).add(value)
    paths = [v.path for v in model.variables]
    if all(len(values) == 1 for values in general.values()) and _unambiguous(general, axes, paths):
        for key, values in general.items():
            layouts[key] = next(iter(values))
    else:  # the general keys would collide: exact paths (this model instance only)
        for path, value in axes.items():
            layouts[re.escape(path)] = value
    return layouts


def _unambiguous(general, axes, paths):
    """Every path matches the key of its own layout and no other one."""
    for path in paths:
        matches = [key for key in general if re.fullmatch(key, path)]
        expected = axes.get(path)
        if expected is None and matches:
            return False
        if expected is not None and (len(matches) != 1 or general[matches[0]] != {expected}):
            return False
    return True
