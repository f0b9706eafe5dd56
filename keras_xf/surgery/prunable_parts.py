"""The parts of a model that structured pruning scores and removes: its stack, and each
layer's attention and feedforward (survey §5.7)."""

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.surgery.layer_pruning import transformer_backbone_of


def pruning_stack(model):
    """The `TransformerStack` of `model` (a `TransformerBackbone` or a task holding one as
    `model.backbone`), whose heads, units and layers structured pruning scores and removes."""
    backbone = transformer_backbone_of(model)
    stack = backbone.transformer_stack
    if not isinstance(stack, TransformerStack):
        raise ValueError(
            "structured pruning needs a TransformerStack (not a reversible stack). Received: "
            f"{type(stack).__name__}"
        )
    return stack


def _sublayer(block, index, attribute, kind, purpose, note=""):
    """`block.<attribute>` (of layer `index`), which `purpose` needs to be exactly a `kind`."""
    layer = getattr(block, attribute)
    if type(layer) is not kind:
        raise ValueError(
            f"{purpose} need {kind.__name__} {attribute}s{note}. Received: layer {index} with "
            f"{attribute}={type(layer).__name__}"
        )
    return layer


def prunable_attention(block, index):
    """The `MultiHeadAttention` mixer of layer `index`, whose heads are scored and pruned."""
    return _sublayer(block, index, "mixer", MultiHeadAttention, "head scores and head pruning")


def prunable_feedforward(block, index):
    """The `FeedForward` of layer `index`, whose hidden units are scored and pruned."""
    return _sublayer(block, index, "feedforward", FeedForward, "unit scores and unit pruning",
                     " (not mixtures of experts)")
