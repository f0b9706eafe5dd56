"""The template blocks of a `TransformerStack` and the checks of what its layers share
(attention maps, score biases; survey §4.1.3, §5.4, §5.5.2)."""

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.gated_cross_attention_block import GatedCrossAttentionBlock
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import serialize_template
from keras_xf.ops.checks import check_bool

# The layers a stack is made of; each has `mixer`, `normalization`, `norm_placement`, `epsilon`.
BLOCKS = (TransformerBlock, GatedCrossAttentionBlock)


def serialize_templates(block):
    """One serialised template, or a list of them for a hybrid stack."""
    if not isinstance(block, (list, tuple)):
        return serialize_template(as_layer(block, "block", kind=BLOCKS))
    if not block:
        raise ValueError("block must be a block or a non-empty list of blocks. Received: block=[]")
    return [serialize_template(as_layer(b, f"block[{i}]", kind=BLOCKS))
            for i, b in enumerate(block)]


def check_map_sharing(share_attention_maps, template):
    """`share_attention_maps` as an int `k ≥ 1`; `k > 1` needs a `MultiHeadAttention` mixer
    in the (built-from-config) `template`."""
    k = share_attention_maps
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(
            "share_attention_maps must be an int >= 1 (1 = no sharing). Received: "
            f"share_attention_maps={share_attention_maps}"
        )
    mixer = template.mixer
    if k > 1 and not isinstance(mixer, MultiHeadAttention):
        raise ValueError(
            "share_attention_maps > 1 needs blocks whose mixer is a MultiHeadAttention (it "
            "returns and accepts attention weights). Received: share_attention_maps="
            f"{share_attention_maps} with mixer={type(mixer).__name__}"
        )
    return k


def check_bias_sharing(share_score_biases, templates):
    """`share_score_biases` as a bool; `True` needs every template (built from its config)
    to be a `TransformerBlock` whose mixer is a `MultiHeadAttention` with score biases,
    equally many in each."""
    if not check_bool("share_score_biases", share_score_biases):
        return False
    counts = set()
    for template in templates:
        mixer = template.mixer
        count = 0
        if isinstance(template, TransformerBlock) and isinstance(mixer, MultiHeadAttention):
            count = len(mixer.biases)
        if not count:
            raise ValueError(
                "share_score_biases=True needs TransformerBlocks whose mixer is a "
                "MultiHeadAttention with score biases (e.g. a RelativePositionBias). "
                f"Received: {type(template).__name__} with mixer={type(mixer).__name__} "
                f"and {count} biases"
            )
        counts.add(count)
    if len(counts) != 1:
        raise ValueError("share_score_biases=True needs templates with equally many score "
                         f"biases. Received: {sorted(counts)}")
    return True


def without_biases(config):
    """A serialised block config whose self-attention has no score biases (the layer takes
    the first layer's instead)."""
    mixer = config["config"]["mixer"]
    mixer = dict(mixer, config=dict(mixer["config"], biases=[]))
    return dict(config, config=dict(config["config"], mixer=mixer))


def attends_over_own_positions(mixer):
    """Whether a `MultiHeadAttention` mixer keeps a rolling cache (its pattern's
    `cache_slots`), whose keys sit at positions of their own: the layers of a stack then
    cannot share one evaluation of a positions-only score bias."""
    return mixer.pattern is not None and mixer.pattern.cache_slots is not None
