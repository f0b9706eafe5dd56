"""Builds the default Transformer block of a model from its hyperparameters, and a model's
stack of layers from a block template."""

import keras

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.reversible_stack import ReversibleStack
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.cloning import serialize_layer
from keras_xf.layers.cloning import serialize_template
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.embeddings.rotary_embedding import RotaryEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward

# The sides of an encoder-decoder, as keys of a per-side `depth_initialization`.
SIDES = ("encoder", "decoder")


def default_block(
    num_heads,
    intermediate_dim,
    num_key_value_heads=None,
    activation="relu",
    norm_placement="post",
    normalization="layer_norm",
    dropout=0.0,
    cross_attention=False,
    use_bias=True,
):
    """A `TransformerBlock` with multi-head attention and a feedforward."""
    if num_heads is None or intermediate_dim is None:
        raise ValueError(
            "Without a block template, num_heads and intermediate_dim are required. Received: "
            f"num_heads={num_heads}, intermediate_dim={intermediate_dim}"
        )
    attention = dict(num_heads=num_heads, num_key_value_heads=num_key_value_heads,
                     use_bias=use_bias, dropout=dropout)
    return TransformerBlock(
        mixer=MultiHeadAttention(**attention),
        feedforward=FeedForward(intermediate_dim, activation=activation, dropout=dropout),
        cross_attention=MultiHeadAttention(**attention) if cross_attention else None,
        normalization=normalization,
        norm_placement=norm_placement,
        dropout=dropout,
    )


def serialize_block(block):
    """The config value of a `block=` argument: a template, or a list of them (hybrid
    stacks), serialised; `None` and already serialised configs are kept."""
    if isinstance(block, (list, tuple)):
        return [serialize_block(b) for b in block]
    if isinstance(block, keras.layers.Layer):
        return serialize_template(block)
    return block


def prepare_block(block, position, cross_attention=False):
    """Serialised block config, with RoPE plugged into attention when `position="rotary"`,
    and a cross-attention copy of the mixer added when a decoder needs one. A list of
    templates (a hybrid stack) gives the list of prepared templates."""
    if isinstance(block, (list, tuple)):
        if not block:
            raise ValueError(
                "block must be a block or a non-empty list of blocks. Received: block=[]"
            )
        return [prepare_block(b, position, cross_attention) for b in block]
    block = clone_layer(serialize_template(block))  # a fresh, unbuilt copy
    config = serialize_layer(block)["config"]
    attention = isinstance(block.mixer, MultiHeadAttention)
    if position == "rotary" and attention:
        own = block.mixer.position
        # A template's own RotaryEmbedding (its base, its scaling) is kept as given.
        if own is None:
            mixer = dict(config["mixer"])
            mixer["config"] = dict(mixer["config"], position=keras.saving.serialize_keras_object(
                RotaryEmbedding()))
            config["mixer"] = mixer
        elif not isinstance(own, RotaryEmbedding):
            raise ValueError(
                'position="rotary" puts RoPE into the attention of the block template, whose '
                f"attention already has position={type(own).__name__}. Pass "
                'position="none" to keep the template\'s own position hook.'
            )
    if cross_attention and block.cross_attention is None:
        if not attention:
            raise ValueError(
                "A decoder block needs cross_attention; the template's mixer is "
                f"{type(block.mixer).__name__}. Pass a block with cross_attention set."
            )
        cross = dict(config["mixer"])
        # The self-attention hooks (positions, relative biases, priors, fields) relate query
        # and key positions of one sequence; the copy for cross-attention drops them. A
        # cross-attention with its own hooks is passed as the block's `cross_attention`.
        cross["config"] = dict(cross["config"], position=None, biases=[], multiplier=None,
                               pattern=None, causal=False, name="cross_attention")
        config["cross_attention"] = cross
    if not cross_attention and block.cross_attention is not None:
        raise ValueError("An encoder or decoder-only block cannot have cross_attention.")
    return block.__class__.from_config(config)


def side_depth_initialization(depth_initialization, side):
    """The `depth_initialization` of one side (`"encoder"` or `"decoder"`) of an
    encoder-decoder model: the dict itself, applied to both stacks, or its entry `side` when
    it is given per side (`{"encoder": {...}, "decoder": {...}}`, e.g. DeepNorm's constants
    of each side); `None` when that side has none."""
    if isinstance(depth_initialization, dict) and depth_initialization and set(
            depth_initialization) <= set(SIDES):
        return depth_initialization.get(side)
    return depth_initialization


def build_stack(template, num_layers, policy, name, depth_initialization=None,
                stack_options=None, reversible=False, **arguments):
    """The stack of a model: a `TransformerStack` of `num_layers` copies of `template` with
    the model's `depth_initialization`, its `stack_options` (checked by
    `arguments.check_stack_options`) and its own stack `arguments` (e.g.
    `share_attention_maps`, `share_score_biases`), or a `ReversibleStack` when
    `reversible` (which takes none of them)."""
    if reversible:
        return ReversibleStack(template, num_layers, dtype=policy, name=name)
    return TransformerStack(template, num_layers, depth_initialization=depth_initialization,
                            dtype=policy, name=name, **arguments, **(stack_options or {}))
