"""Parameter sharing across the layers of a stack (survey §4.2.4, §5.4), and the stack
that keeps a subset of its layers (pruning after layer drop, §4.2.4)."""

import numbers

import keras


def layer_owners(share_layers, num_layers):
    """The layer whose weights each layer uses: `owners[l] ≤ l`, `owners[l] == l` for a
    layer with weights of its own.

    `share_layers`: `None` (no sharing), `"all"` (`θ^1 = … = θ^L`, one set of weights),
    an int `k ≥ 1` (every `k`-th layer shares: layer `l` uses the weights of layer
    `l mod k`, so there are `k` sets), or a list of `L` group names (ints or strings):
    layers with equal names share, `θ^{l_1} = … = θ^{l_n}`."""
    if share_layers is None:
        return list(range(num_layers))
    if share_layers == "all":
        return [0] * num_layers
    if isinstance(share_layers, numbers.Integral) and not isinstance(share_layers, bool):
        if share_layers < 1:
            raise ValueError(f"share_layers as an int must be >= 1. Received: "
                             f"share_layers={share_layers}")
        return [index % share_layers for index in range(num_layers)]
    if isinstance(share_layers, (list, tuple)):
        ok = len(share_layers) == num_layers and all(
            isinstance(g, (str, numbers.Integral)) and not isinstance(g, bool)
            for g in share_layers)
        if ok:
            first = {}
            return [first.setdefault(group, index) for index, group in enumerate(share_layers)]
    raise ValueError(
        'share_layers must be None, "all", an int k >= 1, or a list of num_layers group names '
        f"(ints or strings). Received: share_layers={share_layers!r} with num_layers={num_layers}"
    )


def kept_groups(share_layers, num_layers, layers):
    """`share_layers` of a stack that keeps only `layers` (indices into `num_layers`), as a
    list of group names (or `None`), so that kept layers share as before."""
    if share_layers is None:
        return None
    owners = layer_owners(share_layers, num_layers)
    return [owners[index] for index in layers]


# Fusions whose parameters read all earlier outputs together (an FFN over their
# concatenation, `n·d` features), so that they are tied to the number of layers.
_UNPRUNABLE_FUSIONS = ("feedforward", "attention")


def prune_stack(stack, layers):
    """A new stack like `stack` with the layers `layers` only (sorted, distinct 0-based
    indices), each keeping its weights: the pruning of dropped layers at inference (§4.2.4).
    A stack trained with layer drop keeps its `layer_drop` rate, so the survey's
    inference rescaling applies to the kept layers. Layers that shared weights still
    share them. The stack must be built.

    Fusion and multi-step residuals act on the outputs of the kept layers, the `j`-th kept
    layer (layer `k_j` before) keeping the weights of layer `k_j`: `"average"` fusion
    averages `z^0` and the kept outputs (its norm kept); `"weighted_sum"` keeps the learned
    weights of those outputs (the weights of removed layers are dropped, not renormalised);
    a multi-step scheme applies to the kept sequence, learned coefficients being those of
    layer `k_j` on the newest earlier outputs and increments of that sequence (as many as
    it has, as the first layers of any stack). `"feedforward"` and `"attention"` fusions,
    whose feedforward reads the concatenation of all earlier outputs, cannot be pruned."""
    ok = isinstance(layers, (list, tuple)) and layers and all(
        isinstance(i, int) and not isinstance(i, bool) for i in layers)
    if not ok or list(layers) != sorted(set(layers)) or not (
            0 <= layers[0] and layers[-1] < stack.num_layers):
        raise ValueError(
            "layers must be a non-empty list of distinct, increasing layer indices in "
            f"[0, {stack.num_layers}). Received: layers={layers!r}")
    if stack.fusion in _UNPRUNABLE_FUSIONS:
        raise ValueError(
            f"prune cannot remove layers of a stack with fusion={stack.fusion!r}: its "
            "feedforward reads the concatenation of all earlier layer outputs, a width tied "
            "to the number of layers. Stacks with fusion None, 'average' or 'weighted_sum' "
            f"can be pruned. Received: fusion={stack.fusion!r}")
    if not stack.built:
        raise ValueError("prune needs a built stack (its weights are kept). Call the "
                         "stack or build it first.")
    layers = list(layers)
    config = dict(stack.get_config(), num_layers=len(layers),
                  share_layers=kept_groups(stack.share_layers, stack.num_layers, layers))
    pruned = stack.__class__.from_config(config)
    pruned.build_from_config(stack.get_build_config())
    for new, index in zip(pruned.blocks, layers):
        new.set_weights(stack.blocks[index].get_weights())
    if stack.output_norm is not None:
        pruned.output_norm.set_weights(stack.output_norm.get_weights())
    for j, (new, index) in enumerate(zip(pruned.fusions, layers)):
        _restrict_fusion(new, stack.fusions[index], [0] + [k + 1 for k in layers[:j + 1]])
    if stack.learn_multistep:
        for new, index in zip(pruned.multisteps, layers):
            _restrict_multistep(new, stack.multisteps[index])
    return pruned


def _restrict_fusion(new, old, kept):
    """`new` fuses the outputs `kept` (indices into the inputs of `old`)."""
    if old.mode == "weighted_sum":
        new.fusion_weights.assign(keras.ops.convert_to_numpy(old.fusion_weights)[kept])
    if old.norm is not None:
        new.norm.set_weights(old.norm.get_weights())


def _restrict_multistep(new, old):
    """`new` takes the learned coefficients of `old` for as many of the newest earlier
    outputs and increments as it has."""
    new.a_weights.assign(keras.ops.convert_to_numpy(old.a_weights)[: len(new.a)])
    new.b_weights.assign(keras.ops.convert_to_numpy(old.b_weights)[: len(new.b)])
