"""What every model shares about its arguments: checks by argument name, the default block,
the backbone of a task, the named inputs, the config recorded from `__init__`, and the
checks of call inputs against the model's `keras.Input`s.

One argument name means one thing in every model (`hidden_dim` is a positive int
everywhere), so each is checked here once, with the same message in every model.
"""

import inspect
import sys

import keras
import numpy as np

from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.heads.pooling import MODES
from keras_xf.layers.residual.residual import NORMALIZATIONS
from keras_xf.models.backbones.block_factory import default_block
from keras_xf.models.backbones.block_factory import serialize_block
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import static_dim

SIZES = ("vocabulary_size", "num_layers", "hidden_dim", "max_sequence_length", "patch_size",
         "share_attention_maps")
OPTIONAL_SIZES = ("num_heads", "intermediate_dim", "num_key_value_heads",
                  "source_vocabulary_size", "num_decoder_layers", "num_classes",
                  "projection_dim", "head_intermediate_dim", "num_segments")
# Ints that may be zero.
COUNTS = ("position_offset",)
POSITIVE_NUMBERS = ("embedding_epsilon",)
RATES = ("dropout", "head_dropout")
CHOICES = {"pooling": MODES}
OPTIONAL_CHOICES = {"embedding_normalization": NORMALIZATIONS}
FLAGS = ("causal", "tie_embeddings", "embedding_scale", "share_embeddings", "class_token",
         "class_token_position", "normalize", "gated_cross_attention", "share_score_biases",
         "reversible")
# The arguments of `default_block` that a model takes under the same names.
BLOCK_ARGUMENTS = ("num_heads", "intermediate_dim", "num_key_value_heads", "activation",
                   "norm_placement", "normalization", "dropout")
# Base-model arguments: `FunctionalModel.get_config` records them itself.
BASE_ARGUMENTS = ("name", "dtype", "trainable", "preprocessor")
LAYOUTS = {"images": "[batch, height, width, channels]"}
TOKEN_LAYOUT = "[batch, length]"


def check_model_arguments(arguments):
    """Checks the hyperparameters in `arguments` (an `__init__`'s `locals()`) by name:
    sizes are positive ints (optional ones may be `None`), rates lie in `[0, 1)`, flags are
    bools, choices are among their values. Names a model does not take are skipped."""
    for name in SIZES:
        if name in arguments:
            check_positive_int(name, arguments[name])
    for name in OPTIONAL_SIZES:
        if arguments.get(name) is not None:
            check_positive_int(name, arguments[name])
    for name in COUNTS:
        if name in arguments:
            check_positive_int(name, arguments[name], minimum=0)
    for name in POSITIVE_NUMBERS:
        if name in arguments:
            check_positive_number(name, arguments[name])
    for name in RATES:
        if name in arguments:
            check_rate(name, arguments[name])
    for name in FLAGS:
        if name in arguments:
            check_bool(name, arguments[name])
    for name, choices in CHOICES.items():
        if name in arguments and arguments[name] not in choices:
            raise ValueError(
                f"{name} must be one of {choices}. Received: {name}={arguments[name]!r}"
            )
    for name, choices in OPTIONAL_CHOICES.items():
        if arguments.get(name) is not None and arguments[name] not in choices:
            raise ValueError(
                f"{name} must be None or one of {choices}. Received: {name}={arguments[name]!r}"
            )


# `TransformerStack` arguments that a model sets itself, never through `stack_options`.
MODEL_STACK_ARGUMENTS = ("self", "block", "num_layers", "share_attention_maps",
                         "depth_initialization", "kwargs")


def check_stack_options(stack_options, model_arguments=()):
    """`None`, or a dict of `TransformerStack` arguments other than those the model sets
    itself (`block`, `num_layers`, `share_attention_maps`, `depth_initialization`, and the
    names in `model_arguments`, e.g. `share_score_biases` of an encoder-decoder); returned
    as a plain dict."""
    if stack_options is None:
        return None
    allowed = sorted(set(inspect.signature(TransformerStack.__init__).parameters)
                     - set(MODEL_STACK_ARGUMENTS) - set(model_arguments))
    if not isinstance(stack_options, dict) or set(stack_options) - set(allowed):
        raise ValueError(
            f"stack_options must be None or a dict with keys among {allowed}. Received: "
            f"stack_options={stack_options!r}"
        )
    return dict(stack_options)


def check_image_shape(image_shape, patch_size):
    """`(height, width, channels)` of positive ints, height and width divisible by
    `patch_size`; returned as a tuple of ints."""
    try:
        shape = tuple(image_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                              for v in shape):
        raise ValueError(
            "image_shape must be (height, width, channels) of positive ints. "
            f"Received: image_shape={image_shape!r}"
        )
    if shape[0] % patch_size or shape[1] % patch_size:
        raise ValueError(
            "The image height and width must be divisible by patch_size. Received: "
            f"image_shape={shape}, patch_size={patch_size}"
        )
    return shape


def block_template(block, arguments):
    """`block` when given; otherwise the default `TransformerBlock`, built from the model's
    own arguments of the same names (`num_heads`, `intermediate_dim`, ..., `dropout`)."""
    if block is not None:
        return block
    return default_block(**{name: arguments[name] for name in BLOCK_ARGUMENTS})


def task_backbone(backbone, backbone_class, dtype, backbone_kwargs, **defaults):
    """The backbone of a task: `backbone` itself (or deserialised from its config), or a new
    `backbone_class(**defaults, **backbone_kwargs)`; never both."""
    if backbone is not None and backbone_kwargs:
        raise ValueError(
            "Pass either a backbone or backbone arguments. Received both: "
            f"{sorted(backbone_kwargs)}"
        )
    if backbone is None:
        return backbone_class(dtype=dtype, **defaults, **backbone_kwargs)
    if not isinstance(backbone, keras.Model):
        backbone = keras.saving.deserialize_keras_object(backbone)
    if not isinstance(backbone, backbone_class):
        raise ValueError(
            f"backbone must be a {backbone_class.__name__}. Received: "
            f"backbone={type(backbone).__name__}"
        )
    return backbone


def token_inputs(prefix="", segments=False):
    """The named `keras.Input`s `{prefix}token_ids` and `{prefix}padding_mask`, `[B, T]`,
    and `{prefix}segment_ids` with `segments=True`."""
    names = ("token_ids", "padding_mask") + (("segment_ids",) if segments else ())
    return {
        f"{prefix}{name}": keras.Input(shape=(None,), dtype="int32", name=f"{prefix}{name}")
        for name in names
    }


def takes_segment_ids(num_segments):
    """Whether a text model with `num_segments` takes a `segment_ids` input: only with two
    or more segments (with one, every token is segment 0)."""
    return num_segments is not None and num_segments > 1


def classifier_compile_defaults(optimizer, loss, metrics, from_logits=True,
                                weight_decay=0.01):
    """`compile`'s `"auto"` values of a classifier: AdamW, sparse cross-entropy, accuracy."""
    if optimizer == "auto":
        optimizer = keras.optimizers.AdamW(1e-3, weight_decay=weight_decay)
    if loss == "auto":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
    if metrics == "auto":
        metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    return optimizer, loss, metrics


def record_config(model, arguments, attributes=None):
    """Keeps the arguments of the calling `__init__` as the model's config and attributes.

    `arguments` is that `__init__`'s `locals()` at its end: every parameter's final value
    (checked, defaults filled in). Layers are serialised; `name`, `dtype`, `trainable` and
    `**kwargs` are left to the base model. Each value also becomes the attribute of the
    same name, or of `attributes[name]` where that name holds a sub-layer (`None`: no
    attribute). `FunctionalModel.get_config` returns the recorded values.
    """
    code = sys._getframe(1).f_code  # the caller's parameters, in order, lead its variables
    names = code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount]
    attributes = attributes or {}
    config = {}
    for name in names:
        if name in BASE_ARGUMENTS:
            continue
        value = arguments[name]
        if _holds_layer(value):
            value = serialize_block(value)
        config[name] = list(value) if isinstance(value, tuple) else value
        attribute = attributes.get(name, name)
        if attribute is not None:
            setattr(model, attribute, value)
    model._hyperparameters = config


def _holds_layer(value):
    if isinstance(value, (list, tuple)):
        return any(_holds_layer(v) for v in value)
    return isinstance(value, keras.layers.Layer)


def _shape(value):
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def check_model_inputs(model, inputs):
    """Checks call inputs against the model's named `keras.Input`s, before any backend op
    runs (so the error is the same on every backend): the dict keys, each input's rank and
    known dimensions, and each `*padding_mask` against its `*token_ids` (equal shapes)."""
    expected = model.input
    if not isinstance(expected, dict):
        return
    names = sorted(expected)
    if not isinstance(inputs, dict):
        if len(names) != 1:
            raise ValueError(
                f"{type(model).__name__} expects a dict of inputs with keys {names}. "
                f"Received: inputs of type {type(inputs).__name__}"
            )
        inputs = {names[0]: inputs}
    missing = [name for name in names if inputs.get(name) is None]
    unexpected = sorted(set(inputs) - set(names))
    if missing or unexpected:
        raise ValueError(
            f"{type(model).__name__} expects inputs with keys {names}. Missing: {missing}; "
            f"unexpected: {unexpected}. Received: keys={sorted(inputs)}"
        )
    for name in names:
        value, want = _Shaped(inputs[name]), tuple(expected[name].shape)
        layout = LAYOUTS.get(name, TOKEN_LAYOUT)
        check_rank(name, value, len(want), layout)
        if any(static_dim(r) is not None and e is not None and r != e
               for r, e in zip(value.shape[1:], want[1:])):
            dims = ", ".join(["batch"] + [str(e) for e in want[1:]])
            raise ValueError(
                f"{name} must have shape [{dims}] ({layout}). Received: "
                f"{name}.shape={value.shape}"
            )
    for name in names:
        for suffix in ("padding_mask", "segment_ids"):
            ids = name[: -len(suffix)] + "token_ids"
            if name.endswith(suffix) and ids in inputs:
                check_padding_mask(_Shaped(inputs[name]), _Shaped(inputs[ids]), name, ids)


def check_token_ids(name, token_ids, vocabulary_size):
    """Token ids (a numpy array or nested lists of ints) must lie in
    `[0, vocabulary_size)`: an id outside gives NaN or another row's embedding on some
    backends rather than an error."""
    ids = np.asarray(token_ids)
    if ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        return
    bad = (ids < 0) | (ids >= vocabulary_size)
    if np.any(bad):
        values = np.unique(ids[bad])
        shown = values[:10].tolist() + (["..."] if values.size > 10 else [])
        raise ValueError(
            f"{name} must hold ids in [0, {vocabulary_size}) (the vocabulary). Received: "
            f"{name} with ids {shown} outside it"
        )


def check_input_token_ids(model, inputs):
    """The ids of host inputs (numpy arrays and lists) against `model.token_vocabulary_sizes()`;
    tensors are left alone (symbolic or traced ones cannot be read, and reading a device
    tensor would wait for it)."""
    sizes = model.token_vocabulary_sizes()
    if not sizes:
        return
    if not isinstance(inputs, dict):
        # A single input given bare: the model's one named input.
        if not (isinstance(model.input, dict) and sorted(model.input) == sorted(sizes)):
            return
        inputs = {next(iter(sizes)): inputs}
    for name, size in sizes.items():
        value = inputs.get(name)
        if isinstance(value, np.ndarray) or (isinstance(value, (list, tuple)) and value):
            try:
                value = np.asarray(value)
            except ValueError:  # ragged lists: Keras' own checks refuse them
                continue
            check_token_ids(name, value, size)


class _Shaped:
    """The shape of a tensor, array or nested list, for the shape checks."""

    def __init__(self, value):
        self.shape = _shape(value)


def check_reversible_arguments(share_attention_maps, depth_initialization, stack_options):
    """A reversible backbone takes none of `TransformerStack`'s own options."""
    given = {"share_attention_maps": share_attention_maps,
             "depth_initialization": depth_initialization, "stack_options": stack_options}
    defaults = {"share_attention_maps": 1, "depth_initialization": None, "stack_options": None}
    for name, value in given.items():
        if value != defaults[name]:
            raise ValueError(
                f"reversible=True builds a ReversibleStack, which has no {name}: it must be "
                f"{defaults[name]!r}. Received: {name}={value!r}"
            )


# Early exit (survey §5.6) -------------------------------------------------------------------

EXIT_HEADS = ("per_layer", "shared")


def check_adaptive_backbone(backbone, causal=False):
    """A task that runs the backbone's layers under per-layer control (early exit, layer
    skipping; survey §5.6, `TransformerStack.run_layers`) takes a backbone whose stack is a
    `TransformerStack` (any of its options; a `ReversibleStack` has no per-layer control)
    and whose `causal` flag is the task's (`causal`: a language model)."""
    stack = backbone.transformer_stack
    if backbone.causal != causal or not isinstance(stack, TransformerStack):
        kind = "causal" if causal else "non-causal"
        raise ValueError(
            f"backbone must be a {kind} TransformerBackbone whose stack is a TransformerStack "
            f"(not reversible). Received: causal={backbone.causal}, "
            f"stack={type(stack).__name__}"
        )


def check_exit_layers(exit_layers, num_layers):
    """`exit_layers` as a list of increasing layer numbers in `[1, num_layers]` ending with
    `num_layers` (`None`: every layer)."""
    if exit_layers is None:
        return list(range(1, num_layers + 1))
    layers = list(exit_layers)
    valid = (layers and all(isinstance(l, int) and not isinstance(l, bool) for l in layers)
             and layers == sorted(set(layers)) and layers[0] >= 1 and layers[-1] == num_layers)
    if not valid:
        raise ValueError(
            f"exit_layers must be increasing layer numbers in [1, {num_layers}] ending with the "
            f"last layer {num_layers}. Received: exit_layers={exit_layers!r}"
        )
    return layers


def check_exit_heads(exit_heads):
    if exit_heads not in EXIT_HEADS:
        raise ValueError(
            f"exit_heads must be one of {EXIT_HEADS}. Received: exit_heads={exit_heads!r}"
        )
    return exit_heads


def check_exit_loss_weights(exit_loss_weights, num_exits):
    """`None`, or a list of `num_exits` non-negative floats."""
    if exit_loss_weights is None:
        return None
    weights = [float(w) for w in exit_loss_weights]
    if len(weights) != num_exits or min(weights) < 0:
        raise ValueError(
            f"exit_loss_weights must hold {num_exits} non-negative floats, one per exit. "
            f"Received: exit_loss_weights={exit_loss_weights!r}"
        )
    return weights
