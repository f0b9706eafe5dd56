"""Shared helpers of model growth: config rewriting and pairing of trained weights."""

import importlib
import re

import keras

from keras_xf.models.backbones.seq2seq_backbone import Seq2SeqBackbone
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone

BACKBONES = (TransformerBackbone, Seq2SeqBackbone)

_NUMBERED = re.compile(r"_\d+$")
_BLOCK = re.compile(r"^block_(\d+)$")


def serialized(model):
    """The model as a `{"class_name", "config"}` tree of plain configs (a copy)."""
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a keras_xf model. Received: model={model!r}")
    config = keras.saving.serialize_keras_object(model)
    return {"class_name": config["class_name"], "config": config["config"]}


def serialized_class(entry):
    """The class of one serialised object (`{"class_name", "config", "module",
    "registered_name"}`): the registered keras_xf class, else the class its module names;
    `None` for an entry that names neither."""
    registered = entry.get("registered_name")
    cls = keras.saving.get_registered_object(registered) if registered else None
    if cls is None and entry.get("module"):
        cls = getattr(importlib.import_module(entry["module"]), entry["class_name"], None)
    return cls


def rewrite(tree, edit):
    """Calls `edit(cls, config)` on every serialised object of `tree` (`cls` its class, see
    `serialized_class`), depth first; returns how many objects `edit` reported as changed."""
    changed = 0
    if isinstance(tree, dict):
        if "class_name" in tree and isinstance(tree.get("config"), dict):
            changed += bool(edit(serialized_class(tree), tree["config"]))
        for value in tree.values():
            changed += rewrite(value, edit)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            changed += rewrite(value, edit)
    return changed


def rebuild(model, tree):
    """A new, untrained model of `model`'s class from the rewritten config tree."""
    return model.__class__.from_config(tree["config"])


def _normalized(path, block_index=None):
    parts = []
    for part in path.split("/"):
        match = _BLOCK.match(part)
        if match:
            index = int(match.group(1))
            parts.append(f"block_{index if block_index is None else block_index(index)}")
        else:
            parts.append(_NUMBERED.sub("", part))
    return "/".join(parts)


def _weights(model):
    # Random-generator states are not trained weights: the grown model keeps its own.
    return [w for w in model.weights if not w.path.endswith("seed_generator_state")]


def paired_weights(source, target, block_index=None):
    """`[(source_weight, target_weight)]` matching every weight of `target` with the
    trained weight in the same role (auto-numbered layer names ignored; `block_index` maps
    a target layer index to the source layer it copies)."""
    by_role = {}
    for weight in _weights(source):
        by_role.setdefault(_normalized(weight.path), []).append(weight)
    seen = {}
    pairs = []
    for weight in _weights(target):
        own = _normalized(weight.path)
        count = seen.get(own, 0)
        seen[own] = count + 1
        candidates = by_role.get(_normalized(weight.path, block_index), [])
        if count >= len(candidates):
            raise ValueError(
                f"No trained weight corresponds to '{weight.path}' of the grown model."
            )
        pairs.append((candidates[count], weight))
    return pairs
