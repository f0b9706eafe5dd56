"""Depth-aware initialisation of the blocks of a stack (survey §4.2.2): the value of
`TransformerStack(depth_initialization=...)`, checked, and its application to built blocks."""

import keras

from keras_xf.initializers.model_depth_xavier import ModelDepthXavier
from keras_xf.initializers.sub_layer_depth_xavier import SubLayerDepthXavier
from keras_xf.initializers.xavier import DISTRIBUTIONS
from keras_xf.initializers.xavier import Xavier
from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.ops.checks import check_finite_number
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.keras_internals import sublayers

# "model_depth": gain = a·L^b (L the stack's layers); "sub_layer_depth": gain = a / l^b
# (l the sub-layer's depth, counted over the stack from 1); "deep_norm": gain β for the
# value, output and feedforward projections and 1 for the queries and keys (DeepNet).
METHODS = ("model_depth", "sub_layer_depth", "deep_norm")
NAME = "depth_initialization"


def check_depth_initialization(value):
    """`None`, or the dict with its defaults filled in: `{"method", "a", "b",
    "distribution"}` (`"uniform"` by default), or `{"method": "deep_norm", "beta",
    "distribution"}` (`"normal"` by default; `beta=None` means `(8L)^{-1/4}`)."""
    if value is None:
        return None
    method = value.get("method") if isinstance(value, dict) else None
    if method not in METHODS:
        raise ValueError(
            f"{NAME} must be None or a dict whose 'method' is one of {METHODS}. Received: "
            f"{NAME}={value!r}"
        )
    keys = {"method", "distribution"} | ({"beta"} if method == "deep_norm" else {"a", "b"})
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ValueError(
            f"{NAME} with method={method!r} takes the keys {sorted(keys)}. Received: "
            f"unknown keys {unknown} in {NAME}={value!r}"
        )
    default = "normal" if method == "deep_norm" else "uniform"
    config = {"method": method, "distribution": value.get("distribution", default)}
    if config["distribution"] not in DISTRIBUTIONS:
        raise ValueError(
            f"{NAME}['distribution'] must be one of {DISTRIBUTIONS}. Received: "
            f"{NAME}['distribution']={config['distribution']!r}"
        )
    if method == "deep_norm":
        beta = value.get("beta")
        config["beta"] = None if beta is None else check_positive_number(f"{NAME}['beta']", beta)
    else:
        config["a"] = check_positive_number(f"{NAME}['a']", value.get("a", 1.0))
        config["b"] = check_finite_number(f"{NAME}['b']", value.get("b", 0.0))
    return config


def check_blocks(blocks):
    """Depth initialisation finds the sub-layers of `TransformerBlock`s."""
    for block in blocks:
        if not isinstance(block, TransformerBlock):
            raise ValueError(
                f"{NAME} needs TransformerBlock templates. Received: a template of type "
                f"{type(block).__name__}"
            )


def _fan_axes(dense):
    """The kernel's input and output axes of an `EinsumDense` (its letters that the input
    carries, and the others); `None` for a `Dense` matrix."""
    if not isinstance(dense, keras.layers.EinsumDense):
        return None, None
    inputs, kernel = dense.equation.split("->")[0].split(",")
    input_axes = [axis for axis, letter in enumerate(kernel) if letter in inputs]
    output_axes = [axis for axis, letter in enumerate(kernel) if letter not in inputs]
    return input_axes, output_axes


def _projections(layer):
    """The `Dense` and `EinsumDense` layers inside a sub-layer, with the ids of those kept
    at gain 1 by DeepNorm (an attention's query and key projections)."""
    denses = [sub for sub in sublayers(layer, include_self=True)
              if isinstance(sub, (keras.layers.Dense, keras.layers.EinsumDense))]
    unscaled = set()
    if isinstance(layer, MultiHeadAttention):
        unscaled = {id(layer.query_dense), id(layer.key_dense)}
    return denses, unscaled


def _initializer(config, num_layers, depth, unscaled, input_axes, output_axes):
    axes = {"distribution": config["distribution"], "input_axes": input_axes,
            "output_axes": output_axes}
    method = config["method"]
    if method == "model_depth":
        return ModelDepthXavier(num_layers, config["a"], config["b"], **axes)
    if method == "sub_layer_depth":
        return SubLayerDepthXavier(depth, config["a"], config["b"], **axes)
    beta = config["beta"] if config["beta"] is not None else (8 * num_layers) ** -0.25
    return Xavier(1.0 if unscaled else beta, **axes)


def initialize_by_depth(blocks, config):
    """Re-draws every projection kernel of the built `blocks` (layer `i` of `L`) by
    `config`: sub-layers (the block's `Residual`s: self-attention, cross-attention,
    feedforward) are numbered `l = 1, 2, …` over the whole stack."""
    num_layers = len(blocks)
    depth = 0
    for block in blocks:
        residuals = (block.mixer_residual, block.cross_attention_residual,
                     block.feedforward_residual)
        for residual in residuals:
            if residual is None:
                continue
            depth += 1
            denses, unscaled = _projections(residual.layer)
            for dense in denses:
                initializer = _initializer(config, num_layers, depth, id(dense) in unscaled,
                                           *_fan_axes(dense))
                kernel = dense.kernel
                kernel.assign(initializer(kernel.shape, dtype=kernel.dtype))
