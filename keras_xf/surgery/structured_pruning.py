"""A model rebuilt with a subset of its attention heads and feedforward units (survey §5.7)."""

from keras import ops

from keras_xf.layers.cloning import serialize_layer
from keras_xf.layers.lora.adapters import has_lora
from keras_xf.surgery.prunable_parts import prunable_attention
from keras_xf.surgery.prunable_parts import prunable_feedforward
from keras_xf.surgery.prunable_parts import pruning_stack
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone


def _kept(name, kept, size, index):
    """The kept indices of one layer, checked: `None` keeps all `size`."""
    if kept is None:
        return list(range(size))
    kept = [int(i) for i in kept]
    if not kept or kept != sorted(set(kept)) or kept[0] < 0 or kept[-1] >= size:
        raise ValueError(
            f"{name}[{index}] must be a non-empty list of distinct, increasing indices in "
            f"[0, {size}). Received: {name}[{index}]={kept!r}"
        )
    return kept


def _per_layer(name, value, num_layers):
    if value is None:
        return [None] * num_layers
    if not isinstance(value, (list, tuple)) or len(value) != num_layers:
        raise ValueError(
            f"{name} must be None or a list with one entry (kept indices or None) per layer "
            f"({num_layers}). Received: {name}={value!r}"
        )
    return list(value)


def _kept_groups(kept, mixer, index):
    """The key/value heads that kept query heads use; each must keep equally many."""
    group = mixer.num_heads // mixer.num_key_value_heads
    counts = {}
    for head in kept:
        counts[head // group] = counts.get(head // group, 0) + 1
    if len(set(counts.values())) != 1:
        raise ValueError(
            "grouped-query attention needs the same number of kept query heads in every kept "
            f"key/value group (query head h uses group h // {group}). Received: heads[{index}]="
            f"{kept} with {mixer.num_key_value_heads} groups"
        )
    return sorted(counts)


def _check_plain(layers, index):
    for layer in layers:
        if has_lora(layer) or layer.quantization_mode:
            raise ValueError(
                f"prune_structure needs plain kernels; layer {index} has a LoRA-enabled or "
                f"quantised projection ({layer.name}). Prune before quantising or enabling LoRA."
            )


def _attention_plan(mixer, kept, index, slicers):
    """The pruned mixer config; records how each weight is sliced in `slicers`."""
    if mixer.biases or mixer.multiplier is not None:
        raise ValueError(
            "head pruning cannot slice score biases or multipliers (their parameters depend on "
            f"the head count). Received: layer {index} with biases={len(mixer.biases)}, "
            f"multiplier={type(mixer.multiplier).__name__}"
        )
    denses = (mixer.query_dense, mixer.key_dense, mixer.value_dense, mixer.output_dense)
    _check_plain(denses, index)
    groups = _kept_groups(kept, mixer, index)
    for dense, rows in ((mixer.query_dense, kept), (mixer.key_dense, groups),
                        (mixer.value_dense, groups)):
        slicers[id(dense.kernel)] = lambda w, rows=rows: w[:, rows]
        if dense.bias is not None:
            slicers[id(dense.bias)] = lambda b, rows=rows: b[rows]
    slicers[id(mixer.output_dense.kernel)] = lambda w: w[kept]
    guided = mixer.guided_heads
    if guided is not None:
        guided = [kept.index(h) for h in guided if h in kept]
        if not guided:
            raise ValueError(f"heads[{index}] removes every guided head of the layer. Received: "
                             f"guided_heads={mixer.guided_heads}, heads[{index}]={kept}")
    return dict(num_heads=len(kept), num_key_value_heads=len(groups),
                head_dim=mixer.head_dim, guided_heads=guided)


def _feedforward_plan(feedforward, kept, slicers):
    for dense in (feedforward.hidden_dense, feedforward.gate_dense):
        if dense is not None:
            slicers[id(dense.kernel)] = lambda w: w[:, kept]
            if dense.bias is not None:
                slicers[id(dense.bias)] = lambda b: b[kept]
    slicers[id(feedforward.output_dense.kernel)] = lambda w: w[kept]
    return dict(hidden_dim=len(kept))


def _with_block(config, is_backbone, blocks):
    if is_backbone:
        return dict(config, block=blocks)
    serialized = dict(config["backbone"])
    serialized["config"] = dict(serialized["config"], block=blocks)
    return dict(config, backbone=serialized)


def prune_structure(model, heads=None, units=None):
    """A new, smaller model like `model` with only the attention heads `heads` and the
    feedforward units `units` of each layer (survey §5.7, structured pruning).

    Layer `l` is rebuilt with `len(heads[l])` query heads (their key/value heads only, in
    grouped-query attention) and `len(units[l])` feedforward units, its weights sliced from
    the original: the query, key and value kernels and biases keep the kept heads' slices,
    the output projection the kept heads' rows (its bias stays); the hidden (and gate)
    kernels keep the kept units' columns, the output kernel their rows. The pruned model
    computes exactly what the original computes with the removed heads and units masked,
    `Σ_{h kept} C_h W_o[h]`. Layers may keep different numbers of heads and units: the
    backbone is rebuilt from one block template per layer (a `block=` list). Everything
    else (embeddings, norms, head, stack options) keeps its weights. Whole layers are
    removed with `keras_xf.surgery.prune_layers`.

    Args:
        model: a `TransformerBackbone` or a task holding one as `model.backbone` (`CausalLM`,
            `TextClassifier`, `TextEncoder`), built, with `MultiHeadAttention` mixers
            (no score biases or multiplier) and `FeedForward` feedforwards (gated ones
            included) and no shared layers.
        heads: `None` (keep all) or a list with, per layer, the sorted kept query-head
            indices or `None`. With grouped-query attention every kept key/value group keeps
            the same number of query heads.
        units: `None` or a list with, per layer, the sorted kept feedforward unit indices or
            `None`.

    Returns:
        a new model of the same class.

    Example:
    >>> scores = importance_scores(lm, x, y)
    >>> small = prune_structure(lm, heads=top_indices(scores["heads"], 0.5),
    ...                         units=top_indices(scores["units"], 0.75))
    """
    stack = pruning_stack(model)
    blocks = stack.blocks
    heads = _per_layer("heads", heads, len(blocks))
    units = _per_layer("units", units, len(blocks))
    if stack.share_layers is not None:
        raise ValueError("prune_structure needs layers with their own weights. Received: "
                         f"share_layers={stack.share_layers!r}")
    if stack.share_attention_maps > 1 and any(h is not None for h in heads):
        raise ValueError("head pruning needs layers that compute their own attention maps. "
                         f"Received: share_attention_maps={stack.share_attention_maps}")
    slicers = {}
    templates = []
    for index, block in enumerate(blocks):
        config = serialize_layer(block)
        inner = dict(config["config"])
        if heads[index] is not None:
            mixer = prunable_attention(block, index)
            kept = _kept("heads", heads[index], mixer.num_heads, index)
            serialized = dict(inner["mixer"])
            serialized["config"] = dict(serialized["config"],
                                        **_attention_plan(mixer, kept, index, slicers))
            inner["mixer"] = serialized
        if units[index] is not None:
            feedforward = prunable_feedforward(block, index)
            kept = _kept("units", units[index], feedforward.hidden_dim, index)
            _check_plain([d for d in (feedforward.hidden_dense, feedforward.gate_dense,
                                      feedforward.output_dense) if d is not None], index)
            serialized = dict(inner["feedforward"])
            serialized["config"] = dict(serialized["config"],
                                        **_feedforward_plan(feedforward, kept, slicers))
            inner["feedforward"] = serialized
        templates.append(dict(config, config=inner))
    is_backbone = isinstance(model, TransformerBackbone)
    pruned = type(model).from_config(_with_block(model.get_config(), is_backbone, templates))
    new_weights = pruned.weights
    old_weights = model.weights
    if len(new_weights) != len(old_weights):
        raise ValueError(f"prune_structure could not match the weights of {model.name}: "
                         f"{len(old_weights)} before, {len(new_weights)} after")
    for target, source in zip(new_weights, old_weights):
        value = ops.convert_to_numpy(source)
        if id(source) in slicers:
            value = slicers[id(source)](value)
        target.assign(value)
    return pruned



def prune_heads(model, heads):
    """A new model like `model` with only the attention heads `heads` of each layer (survey
    §5.7, head pruning): `prune_structure(model, heads=heads)`, every feedforward unit kept.

    Args:
        model: as for `prune_structure`.
        heads: a list with, per layer, the sorted kept query-head indices or `None` (keep
            the layer's heads).

    Returns:
        a new model of the same class.

    Example:
    >>> scores = importance_scores(lm, x, y)
    >>> small = prune_heads(lm, heads=top_indices(scores["heads"], 0.5))
    """
    if heads is None:
        raise ValueError("prune_heads needs the kept heads of each layer (a list with one entry "
                         "per layer). Received: heads=None")
    return prune_structure(model, heads=heads)
