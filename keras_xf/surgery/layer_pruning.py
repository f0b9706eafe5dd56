"""A model built again with a subset of its Transformer layers (survey §4.2.4)."""

from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone


def _backbone_config(config, stack, num_layers):
    options = dict(config.get("stack_options") or {})
    if options.get("share_layers") is not None:
        options["share_layers"] = stack.share_layers
    return dict(config, num_layers=num_layers, stack_options=options or None)


def transformer_backbone_of(model):
    """`model` itself if it is a `TransformerBackbone`, else the one it holds as
    `model.backbone`; a `ValueError` otherwise."""
    backbone = model
    if isinstance(model, FunctionalModel) and model.backbone is not None:
        backbone = model.backbone
    if not isinstance(backbone, TransformerBackbone):
        raise ValueError(
            "model must be a TransformerBackbone or a task with one as `backbone`. Received: "
            f"model={type(model).__name__}"
        )
    return backbone


def prune_layers(model, layers):
    """A new model like `model` with only the Transformer layers `layers` (distinct,
    increasing 0-based indices, e.g. `range(0, L, 2)` for every other layer), which keep
    their weights, as do the embeddings, the final norm and the head.

    The pruning of layers dropped at inference after layer-drop training (survey §4.2.4):
    the kept stack keeps the `layer_drop` rate, so its increments are rescaled by
    `ρ = 1 − rate` at inference as in the full model (`TransformerStack.prune`).

    Args:
        model: a `TransformerBackbone`, or a task holding one as `model.backbone` (e.g.
            `CausalLM`, `TextClassifier`).
        layers: the kept layer indices.

    Returns:
        a new model of the same class.

    Example:
    >>> half = prune_layers(lm, list(range(0, lm.backbone.num_layers, 2)))
    """
    backbone = transformer_backbone_of(model)
    layers = list(layers)
    old_stack = backbone.transformer_stack
    stack = old_stack.prune(layers)
    config = model.get_config()
    if model is backbone:
        config = _backbone_config(config, stack, len(layers))
    else:
        serialized = dict(config["backbone"])
        serialized["config"] = _backbone_config(serialized["config"], stack, len(layers))
        config = dict(config, backbone=serialized)
    pruned = type(model).from_config(config)
    new_backbone = pruned if model is backbone else pruned.backbone
    new_stack = new_backbone.transformer_stack
    old_ids = {id(v) for v in old_stack.weights}
    new_ids = {id(v) for v in new_stack.weights}
    rest = [v for v in model.weights if id(v) not in old_ids]
    new_rest = [v for v in pruned.weights if id(v) not in new_ids]
    for target, source in zip(new_rest, rest, strict=True):
        target.assign(source)
    new_stack.set_weights(stack.get_weights())
    return pruned
