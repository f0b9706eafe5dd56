"""LoRA on a functional model's projections (Hu et al. 2021): which layers, their adapters,
and adapter files. `FunctionalModel.enable_lora`, `save_lora_weights` and `load_lora_weights`
call these functions; the model records its own settings."""

import json
import os

import keras

from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.feedforward.mixture_of_experts import MixtureOfExperts
from keras_xf.layers.lora.adapters import has_lora
from keras_xf.layers.lora.lora_einsum_dense import LoRAEinsumDense
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.keras_internals import sublayers

# The projections of every attention layer (their `head_projection` names).
ATTENTION_TARGETS = ("query", "key", "value", "attention_output")
# Each `FeedForward`'s projections, and each `MixtureOfExperts`' stacked experts.
FEEDFORWARD_TARGETS = {
    "ffn_hidden": lambda ffn: ffn.hidden_dense,
    "ffn_gate": lambda ffn: ffn.gate_dense,
    "ffn_output": lambda ffn: ffn.output_dense,
}
EXPERT_TARGETS = {
    "expert_in": lambda moe: moe.experts_in,
    "expert_gate": lambda moe: moe.experts_gate,
    "expert_out": lambda moe: moe.experts_out,
}
# The untied output projection of a `TokenEmbedding` (a tied one is the token table).
HEAD_TARGET = "output_head"
TARGETS = (ATTENTION_TARGETS + tuple(FEEDFORWARD_TARGETS) + tuple(EXPERT_TARGETS)
           + (HEAD_TARGET,))
# keras-hub's default: the query and value projections (Hu et al. 2021, §7.1).
DEFAULT_TARGETS = ("query", "value")
# The suffix of adapter files (keras-hub's).
SUFFIX = ".lora.h5"


def check_settings(rank, alpha, targets):
    """`(rank, alpha, targets)` validated: a positive int, a positive number or `None`
    (meaning `rank`, a scale of 1), and names among `TARGETS` (`None`: `DEFAULT_TARGETS`)."""
    rank = check_positive_int("rank", rank)
    alpha = rank if alpha is None else check_positive_number("alpha", alpha)
    if targets is None:
        targets = DEFAULT_TARGETS
    if isinstance(targets, str):
        targets = (targets,)
    targets = tuple(targets)
    unknown = [t for t in targets if t not in TARGETS]
    if not targets or unknown:
        raise ValueError(f"targets must be a non-empty list of {list(TARGETS)}. Received: "
                         f"targets={list(targets)}")
    return rank, alpha, targets


def target_layers(model, targets):
    """`[(target name, layer)]`: the layers of `model` that `targets` name, in Keras' order
    of the model's layers. A target that names no layer of `model` raises a `ValueError`."""
    found = []
    for layer in sublayers(model):
        if isinstance(layer, LoRAEinsumDense) and layer.name in targets:
            found.append((layer.name, layer))
        elif isinstance(layer, FeedForward):
            found += [(t, get(layer)) for t, get in FEEDFORWARD_TARGETS.items()
                      if t in targets and get(layer) is not None]
        elif isinstance(layer, MixtureOfExperts):
            found += [(t, get(layer)) for t, get in EXPERT_TARGETS.items()
                      if t in targets and get(layer) is not None]
        elif isinstance(layer, TokenEmbedding) and HEAD_TARGET in targets \
                and not layer.tie_weights:
            found.append((HEAD_TARGET, layer))
    missing = sorted(set(targets) - {name for name, _ in found})
    if missing:
        hint = (" (an output projection tied to the token table takes no adapters)"
                if HEAD_TARGET in missing else "")
        raise ValueError(f"targets names layers that {model.name} does not have: {missing}"
                         f"{hint}. Received: targets={list(targets)}")
    return found


def enable(model, rank, alpha, targets):
    """Enables LoRA on the `targets` of `model` and freezes every other variable: only the
    adapters stay trainable. Raises a `ValueError` when LoRA is already on, or when a target
    lies in a frozen layer (its adapters could not train)."""
    if adapter_layers(model):
        raise ValueError(f"LoRA is already enabled on {model.name}. Received: rank={rank}, "
                         f"alpha={alpha}, targets={list(targets)}")
    layers = target_layers(model, targets)
    frozen = [layer.path for _, layer in layers if not layer.trainable]
    if frozen or not model.trainable:
        raise ValueError(
            "enable_lora freezes everything but the adapters itself; the target layers must be "
            f"trainable. Received: trainable=False for {frozen or [model.name]}")
    for _, layer in layers:
        layer.enable_lora(rank, lora_alpha=alpha)
    adapters = {id(v) for v in adapter_variables(model)}
    for variable in model.variables:
        if id(variable) not in adapters and variable.trainable:
            variable.trainable = False


def adapter_layers(model):
    """The projections of `model` with LoRA adapters (keras_xf's `LoRAEinsumDense`,
    `ExpertWeights` and `TokenEmbedding`, Keras' `Dense` and `EinsumDense`)."""
    return [layer for layer in sublayers(model) if has_lora(layer)]


def adapter_variables(model):
    """`A` then `B` of each LoRA-enabled projection of `model`."""
    return [v for layer in adapter_layers(model) for v in (layer.lora_kernel_a,
                                                           layer.lora_kernel_b)]


def adapter_entries(model):
    """`{key: adapter variable}` of `model`: `"<i>/<layer name>/lora_kernel_a"` (and `_b`)
    for its `i`-th LoRA-enabled projection in Keras' order of layers. Keys follow the
    architecture, not the automatic names of one process (`multi_head_attention_1`), as
    keras-hub's adapter files do."""
    entries = {}
    for index, layer in enumerate(adapter_layers(model)):
        entries[f"{index}/{layer.name}/lora_kernel_a"] = layer.lora_kernel_a
        entries[f"{index}/{layer.name}/lora_kernel_b"] = layer.lora_kernel_b
    return entries


def _check_path(filepath):
    if not os.fspath(filepath).endswith(SUFFIX):
        raise ValueError(f"filepath must end in '{SUFFIX}'. Received: filepath={filepath!r}")


def save(model, settings, filepath):
    """Writes the adapters of `model` (`A`, `B` of each projection, by path) and `settings`
    (`{"rank", "alpha", "targets"}`) to an HDF5 file `filepath` ending in `.lora.h5`."""
    import h5py

    _check_path(filepath)
    if settings is None:
        raise ValueError(f"{model.name} has no LoRA adapters to save: call enable_lora first.")
    with h5py.File(filepath, "w") as file:
        file.attrs["lora"] = json.dumps(settings)
        for key, variable in adapter_entries(model).items():
            file[key] = keras.ops.convert_to_numpy(variable)


def read_settings(filepath):
    """The `{"rank", "alpha", "targets"}` an adapter file was written with."""
    import h5py

    _check_path(filepath)
    with h5py.File(filepath, "r") as file:
        return json.loads(file.attrs["lora"])


def load(model, filepath):
    """Assigns the adapters of `model` from `filepath` (see `save`); raises a `ValueError`
    naming an adapter that is missing, of another shape, or left unused."""
    import h5py

    with h5py.File(filepath, "r") as file:
        stored = {}
        file.visititems(lambda name, item: stored.update(
            {name: item[()]} if isinstance(item, h5py.Dataset) else {}))
    entries = adapter_entries(model)
    for key, variable in entries.items():
        if key not in stored:
            raise ValueError(f"The adapter file {filepath} lacks {key!r}.")
        if tuple(stored[key].shape) != tuple(variable.shape):
            raise ValueError(f"The adapter {key!r} in {filepath} has shape "
                             f"{tuple(stored[key].shape)}; the model's is {tuple(variable.shape)}.")
    unused = sorted(set(stored) - set(entries))
    if unused:
        raise ValueError(f"The adapter file {filepath} holds adapters that {model.name} "
                         f"does not have: {unused[:10]}")
    for key, variable in entries.items():
        variable.assign(stored[key])
