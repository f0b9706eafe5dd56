"""Importance scores of attention heads, feedforward units and layers, for structured
pruning (survey §5.7)."""

import keras
import numpy as np
from keras import ops

from keras_xf.surgery.layer_pruning import prune_layers
from keras_xf.surgery.prunable_parts import prunable_attention
from keras_xf.surgery.prunable_parts import prunable_feedforward
from keras_xf.surgery.prunable_parts import pruning_stack
from keras_xf.ops.gradients import vjp

METHODS = ("gradient", "magnitude")


def _loss_function(model, loss):
    if loss is None:
        loss = getattr(model, "loss", None)
    if loss is None:
        raise ValueError("importance scores need a loss: compile the model or pass loss=. "
                         "Received: loss=None on an uncompiled model")
    return keras.losses.get(loss)


def _batches(x, y, sample_weight, batch_size):
    count = len(keras.tree.flatten(x)[0])
    for start in range(0, count, batch_size):
        part = slice(start, start + batch_size)
        weight = None if sample_weight is None else sample_weight[part]
        yield keras.tree.map_structure(lambda a: a[part], x), y[part], weight


def _tensor(variable):
    # A plain tensor of the variable's value (TensorFlow's tape watches tensors, not Keras
    # variables).
    return ops.convert_to_tensor(ops.convert_to_numpy(variable))


def _mask_gradients(model, kernels, x, y, loss, sample_weight, batch_size):
    """`|∂L/∂ξ|` per row of each output kernel in `kernels`, averaged over batches.

    A mask `ξ_r` on the r-th input of a linear output projection (`Σ_r ξ_r c_r W[r]`) scales
    the rows `W[r]` of its kernel, so `∂L/∂ξ_r = Σ W[r] ⊙ ∂L/∂W[r]` at `ξ = 1`: the gradient
    of the mask, computed from the kernel's gradient without a mask in the model."""
    loss = _loss_function(model, loss)
    trainable = list(model.trainable_variables)
    position = {id(v): i for i, v in enumerate(trainable)}
    selected = [position[id(kernel)] for kernel in kernels]
    non_trainable = [_tensor(v) for v in model.non_trainable_variables]
    totals = [np.zeros(kernel.shape[0]) for kernel in kernels]
    count = 0
    for x_batch, y_batch, weight in _batches(x, y, sample_weight, batch_size):
        values = [_tensor(v) for v in trainable]

        def batch_loss(*kernel_values, values=values, x_batch=x_batch, y_batch=y_batch,
                       weight=weight):
            current = list(values)
            for index, value in zip(selected, kernel_values):
                current[index] = value
            outputs, _ = model.stateless_call(current, non_trainable, x_batch, training=False)
            return ops.cast(loss(y_batch, outputs, sample_weight=weight), "float32")

        loss_value, pullback = vjp(batch_loss, [values[i] for i in selected])
        gradients = pullback(ops.ones_like(loss_value))
        for total, kernel, gradient in zip(totals, kernels, gradients):
            product = ops.cast(kernel, "float32") * ops.cast(gradient, "float32")
            rows = ops.sum(ops.reshape(product, (kernel.shape[0], -1)), axis=-1)
            total += np.abs(ops.convert_to_numpy(rows))
        count += 1
    return [total / count for total in totals]


def _squared_norm(tensor, axes):
    return ops.sum(ops.square(ops.cast(tensor, "float32")), axis=axes)


def _head_magnitude(mixer):
    """`‖W_q[:, h]‖² + ‖W_o[h]‖² + (‖W_k[:, g]‖² + ‖W_v[:, g]‖²) / group`, square-rooted: the
    kernels of head `h`, its key/value group `g` shared among the group's query heads."""
    group = mixer.num_heads // mixer.num_key_value_heads
    shared = (_squared_norm(mixer.key_dense.kernel, (0, 2))
              + _squared_norm(mixer.value_dense.kernel, (0, 2))) / group
    squares = (_squared_norm(mixer.query_dense.kernel, (0, 2))
               + _squared_norm(mixer.output_dense.kernel, (1, 2))
               + ops.repeat(shared, group, axis=0))
    return ops.convert_to_numpy(ops.sqrt(squares)).astype("float64")


def _unit_magnitude(feedforward):
    """`‖W_h[:, i]‖² + ‖W_g[:, i]‖² + ‖W_f[i]‖²`, square-rooted: the kernels of unit `i`."""
    squares = (_squared_norm(feedforward.hidden_dense.kernel, 0)
               + _squared_norm(feedforward.output_dense.kernel, 1))
    if feedforward.gate_dense is not None:
        squares = squares + _squared_norm(feedforward.gate_dense.kernel, 0)
    return ops.convert_to_numpy(ops.sqrt(squares)).astype("float64")


def importance_scores(model, x=None, y=None, method="gradient", loss=None, sample_weight=None,
                      batch_size=32):
    """Importance of every attention head and feedforward unit of each layer (survey §5.7).

    - `"gradient"` (data-driven, Michel et al.'s head importance): a mask `ξ` multiplies
      each head's context `C_h` (and each unit's activation) where it enters the output
      projection, `MHA = Σ_h ξ_h C_h W_o[h]`, and the score is `I = mean_batches |∂L/∂ξ|`
      at `ξ = 1`, the first-order change of the loss when the head or unit is removed.
    - `"magnitude"`: the Frobenius norm of the kernels the head or unit owns (see
      `_head_magnitude`, `_unit_magnitude`); needs no data.

    Args:
        model: a `TransformerBackbone` or a task with one as `model.backbone`, whose layers
            have `MultiHeadAttention` mixers and `FeedForward` feedforwards.
        x, y: inputs and targets (any size; scored in batches of `batch_size`), for
            `"gradient"`.
        method: `"gradient"` or `"magnitude"`.
        loss: a Keras loss; defaults to the compiled `model.loss`.
        sample_weight: optional per-example (or per-token) weights of the loss.
        batch_size: int.

    Returns:
        `{"heads": [array [H_l] per layer], "units": [array [F_l] per layer]}`, float64.

    Example:
    >>> scores = importance_scores(lm, x, y)                 # lm compiled
    >>> keep = top_indices(scores["heads"], keep=0.5)
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}. Received: method={method!r}")
    stack = pruning_stack(model)
    mixers = [prunable_attention(block, index) for index, block in enumerate(stack.blocks)]
    feedforwards = [prunable_feedforward(block, index) for index, block in enumerate(stack.blocks)]
    if method == "magnitude":
        return {"heads": [_head_magnitude(m) for m in mixers],
                "units": [_unit_magnitude(f) for f in feedforwards]}
    if x is None or y is None:
        raise ValueError('method="gradient" needs data. Received: x or y is None')
    kernels = [m.output_dense.kernel for m in mixers] + [f.output_dense.kernel
                                                          for f in feedforwards]
    rows = _mask_gradients(model, kernels, x, y, loss, sample_weight, batch_size)
    return {"heads": rows[:len(mixers)], "units": rows[len(mixers):]}


def layer_importance(model, x, y, loss=None, sample_weight=None):
    """`I_l = L(model without layer l) − L(model)` for each layer `l`, the model without it
    built by `prune_layers`: the loss increase when the whole layer is removed."""
    loss = _loss_function(model, loss)
    stack = pruning_stack(model)

    def evaluate(candidate):
        return float(ops.convert_to_numpy(loss(y, candidate(x, training=False),
                                               sample_weight=sample_weight)))

    base = evaluate(model)
    layers = range(stack.num_layers)
    return np.array([evaluate(prune_layers(model, [k for k in layers if k != index])) - base
                     for index in layers])


def top_indices(scores, keep, scope="layer", num_key_value_heads=None):
    """The indices to keep in each layer: the highest-scoring fraction `keep` of them.

    Args:
        scores: a list of per-layer score arrays (e.g. `importance_scores(...)["heads"]`).
        keep: float in (0, 1], the fraction kept (at least one per layer).
        scope: `"layer"` (the same fraction of every layer) or `"global"` (the highest
            scores of all layers together, as Michel et al. prune heads).
        num_key_value_heads: for heads of grouped-query attention, a list of per-layer key/
            value head counts: with more than one group, whole groups are ranked by their
            summed scores and kept or removed (a group is removed only with all its heads).

    Returns:
        a list of sorted index lists, one per layer (input to `prune_structure`).
    """
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1]. Received: keep={keep}")
    if scope not in ("layer", "global"):
        raise ValueError(f"scope must be 'layer' or 'global'. Received: scope={scope!r}")
    scores = [np.asarray(s, "float64") for s in scores]
    groups = [1] * len(scores) if num_key_value_heads is None else list(num_key_value_heads)
    units = []  # per layer: the score of each prunable unit and the indices it holds
    for layer_scores, kv in zip(scores, groups, strict=True):
        size = len(layer_scores) // kv if kv > 1 else 1
        members = [list(range(start, start + size)) for start in range(0, len(layer_scores),
                                                                           size)]
        units.append([(layer_scores[m].sum(), m) for m in members])
    if scope == "layer":
        chosen = [sorted(range(len(u)), key=lambda i, u=u: -u[i][0])[:max(1, round(keep * len(u)))]
                  for u in units]
    else:
        flat = sorted(((s, layer, i) for layer, u in enumerate(units)
                       for i, (s, _) in enumerate(u)), key=lambda item: -item[0])
        total = max(len(units), round(keep * len(flat)))
        chosen = [[max(range(len(u)), key=lambda i, u=u: u[i][0])] for u in units]
        for _, layer, i in flat:
            if sum(len(c) for c in chosen) >= total:
                break
            if i not in chosen[layer]:
                chosen[layer].append(i)
    return [sorted(j for i in c for j in u[i][1]) for c, u in zip(chosen, units)]
