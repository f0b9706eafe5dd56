"""TransformerStack(depth_initialization=...): depth-scaled Xavier for every block (survey
§4.2.2) and DeepNorm's gains."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import GatedCrossAttentionBlock
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from keras_xf.layers import deep_norm
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_saving
from tests.layer_checks import to_float64
from tests.layer_checks import wrap_in_model
from tests.reference import deep_models as ref_deep

WIDTH, HEADS, HIDDEN = 16, 2, 16
# (d_in, d_out) of each projection: into heads `[d, H, Dh]` and out of them, then the FFN.
FANS = {"query": (WIDTH, WIDTH), "key": (WIDTH, WIDTH), "value": (WIDTH, WIDTH),
        "attention_output": (WIDTH, WIDTH), "hidden": (WIDTH, HIDDEN), "output": (HIDDEN, WIDTH)}


def make_stack(num_layers=3, cross=False, **kwargs):
    block = TransformerBlock(
        MultiHeadAttention(HEADS), FeedForward(HIDDEN),
        cross_attention=MultiHeadAttention(HEADS) if cross else None, norm_placement="post")
    stack = TransformerStack(block, num_layers, **kwargs)
    stack.build((2, 4, WIDTH), (2, 3, WIDTH) if cross else None)
    return stack


def kernels(residual):
    """`{projection name: kernel}` of one sub-layer."""
    return {w.path.split("/")[-2]: to_float64(w) for w in residual.layer.weights
            if w.path.endswith("kernel")}


def assert_uniform_bound(kernel, gain, name):
    """`U(−η, η)` with `η = gain·√(6/(d_in + d_out))`: every entry within η and the largest
    beyond 0.9η (any of ≥ 256 entries falls there with probability > 1 − 0.9²⁵⁶)."""
    bound = ref_deep.xavier_bound(gain, *FANS[name])
    largest = np.abs(kernel).max()
    assert 0.9 * bound < largest <= bound * (1 + 1e-6), (name, gain, largest / bound)


def test_model_depth_gain_for_every_block():
    stack = make_stack(num_layers=4, depth_initialization={"method": "model_depth", "a": 0.5,
                                                           "b": 0.5})
    gain = ref_deep.model_depth_gain(0.5, 0.5, 4)
    for block in stack.blocks:
        for residual in (block.mixer_residual, block.feedforward_residual):
            for name, kernel in kernels(residual).items():
                assert_uniform_bound(kernel, gain, name)


def test_sub_layer_depth_gain_numbers_sub_layers_over_the_stack():
    """Sub-layers `l = 1 … 3L` (self-attention, cross-attention, feedforward of each block)
    get `gain = a / l^b`."""
    stack = make_stack(num_layers=2, cross=True,
                       depth_initialization={"method": "sub_layer_depth", "a": 2.0, "b": 1.0})
    depth = 0
    for block in stack.blocks:
        for residual in (block.mixer_residual, block.cross_attention_residual,
                         block.feedforward_residual):
            depth += 1
            gain = ref_deep.sub_layer_depth_gain(2.0, 1.0, depth)
            for name, kernel in kernels(residual).items():
                assert_uniform_bound(kernel, gain, name)
    assert depth == 6


def test_deep_norm_gains():
    """DeepNet: gain β for values, outputs and feedforwards; gain 1 for queries and keys;
    β = (8L)^{-1/4} when not given."""
    stack = make_stack(num_layers=3, depth_initialization={"method": "deep_norm",
                                                           "distribution": "uniform"})
    beta = ref_deep.deep_norm_constants(3, 0)["encoder"][1]
    for block in stack.blocks:
        for residual in (block.mixer_residual, block.feedforward_residual):
            for name, kernel in kernels(residual).items():
                assert_uniform_bound(kernel, 1.0 if name in ("query", "key") else beta, name)


def test_deep_norm_normal_default_and_explicit_beta():
    constants = deep_norm(encoder_layers=6, decoder_layers=3)["decoder"]
    stack = make_stack(num_layers=3, depth_initialization=constants.depth_initialization())
    assert stack.depth_initialization["distribution"] == "normal"
    values = np.concatenate([kernels(b.mixer_residual)["value"].ravel() for b in stack.blocks])
    queries = np.concatenate([kernels(b.mixer_residual)["query"].ravel() for b in stack.blocks])
    # Spread ratio β within sampling error (768 entries each).
    np.testing.assert_allclose(values.std() / queries.std(), constants.beta, rtol=0.15)


def test_without_it_kernels_keep_their_initializer():
    keras.utils.set_random_seed(5)
    plain = make_stack(num_layers=2)
    keras.utils.set_random_seed(5)
    again = make_stack(num_layers=2)
    keras.utils.set_random_seed(5)
    scaled = make_stack(num_layers=2, depth_initialization={"method": "model_depth", "b": 1.0})
    for a, b, c in zip(plain.weights, again.weights, scaled.weights):
        np.testing.assert_array_equal(to_float64(a), to_float64(b))
        if a.path.endswith("kernel"):
            assert not np.allclose(to_float64(a), to_float64(c))
    assert plain.get_config()["depth_initialization"] is None


def test_config_fills_defaults_and_round_trips():
    stack = make_stack(depth_initialization={"method": "sub_layer_depth", "b": 0.5})
    assert stack.get_config()["depth_initialization"] == {
        "method": "sub_layer_depth", "distribution": "uniform", "a": 1.0, "b": 0.5}
    clone = check_config_round_trip(stack)
    assert clone.depth_initialization == stack.depth_initialization


def test_saving_keeps_trained_weights(rng, tmp_path):
    """Loading restores the saved kernels; the depth initialisation runs at build only."""
    stack = make_stack(depth_initialization={"method": "deep_norm"})
    x = rng.normal(size=(2, 4, WIDTH)).astype("float32")
    inputs = [x]
    model = wrap_in_model(TransformerStack.from_config(stack.get_config()), inputs)
    check_saving(model, inputs, tmp_path)


@pytest.mark.parametrize(
    "value, pattern",
    [
        ("deep_norm", r"depth_initialization must be None or a dict whose 'method' is one of"),
        ({"method": "fixup"}, r"Received: depth_initialization=\{'method': 'fixup'\}"),
        ({"method": "deep_norm", "a": 1.0},
         r"depth_initialization with method='deep_norm' takes the keys .* unknown keys \['a'\]"),
        ({"method": "model_depth", "a": 0},
         r"depth_initialization\['a'\] must be a positive number. Received: "),
        ({"method": "sub_layer_depth", "b": None}, r"depth_initialization\['b'\] must be a finite"),
        ({"method": "deep_norm", "beta": -1.0}, r"depth_initialization\['beta'\] must be a positive"),
        ({"method": "model_depth", "distribution": "orthogonal"},
         r"depth_initialization\['distribution'\] must be one of"),
    ],
)
def test_invalid_values_name_the_argument(value, pattern):
    block = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(HIDDEN))
    with pytest.raises(ValueError, match=pattern):
        TransformerStack(block, 2, depth_initialization=value)


def test_needs_transformer_blocks():
    block = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(HIDDEN))
    gated = GatedCrossAttentionBlock(block, MultiHeadAttention(HEADS))
    with pytest.raises(ValueError, match="depth_initialization needs TransformerBlock templates"):
        TransformerStack(gated, 2, depth_initialization={"method": "model_depth"})
