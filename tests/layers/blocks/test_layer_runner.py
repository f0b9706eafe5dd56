"""The stack's per-layer runner: `TransformerStack.run_layers` under a `LayerControl` (run
or skip a layer per row, stop rows, read each layer's state, fill a skipped layer's cache),
with the stack's options applied to every layer it runs (survey §4.2.3, §4.2.4, §4.3, §5.4,
§5.6)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import GatedCrossAttentionBlock
from keras_xf.layers import LayerControl
from keras_xf.layers import LayerStateReader
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import RelativePositionBias
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests.layer_checks import padding_mask
from tests.layer_checks import randomize_weights
from tests.layer_checks import split_scores
from tests.layer_checks import to_numpy

WIDTH, HEADS, HIDDEN, LAYERS = 8, 2, 16, 3
BATCH, LENGTH = 2, 5
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def block(mixer=None):
    return TransformerBlock(mixer or MultiHeadAttention(HEADS), FeedForward(HIDDEN),
                            norm_placement="pre")


# Stacks with each option the runner applies; every one can be pruned to a prefix.
OPTIONS = {
    "plain": lambda: TransformerStack(block(), LAYERS),
    "shared_layers": lambda: TransformerStack(block(), LAYERS, share_layers=2),
    "hybrid": lambda: TransformerStack([block(RecurrentMixer("gru")), block(),
                                        block(AverageAttention())], LAYERS),
    "average_fusion": lambda: TransformerStack(block(), LAYERS, fusion="average"),
    "weighted_fusion": lambda: TransformerStack(block(), LAYERS, fusion="weighted_sum",
                                                fusion_normalization="layer_norm"),
    "layer_drop": lambda: TransformerStack(block(), LAYERS, layer_drop=0.4),
    "multistep": lambda: TransformerStack(block(), LAYERS, multistep="adams_bashforth_2",
                                          learn_multistep=True),
    "shared_maps": lambda: TransformerStack(block(), LAYERS, share_attention_maps=2),
    "shared_biases": lambda: TransformerStack(
        block(MultiHeadAttention(HEADS, biases=[RelativePositionBias(8)])), LAYERS,
        share_score_biases=True),
}


def built_stack(rng, option):
    stack = OPTIONS[option]()
    stack(np.zeros((BATCH, LENGTH, WIDTH), "float32"))
    randomize_weights(stack, rng, scale=0.5)
    return stack


@pytest.fixture
def x(rng):
    return rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")


@pytest.fixture
def mask():
    return padding_mask([5, 3], LENGTH)


class SkipRows(LayerControl):
    """Runs layer `index` for the rows `run` only; records the states after each layer."""

    def __init__(self, index, run):
        self.index, self.run = index, run

    def start(self, state):
        return {"states": ()}

    def rows(self, index, state, carry):
        return ops.convert_to_tensor(self.run) if index == self.index else None

    def after(self, index, state, carry, rows):
        return {"states": carry["states"] + (state,)}

    skipped = after


class StopAfter(LayerControl):
    """Stops the rows `stop` after layer `index`."""

    def __init__(self, index, stop):
        self.index, self.stop = index, stop

    def start(self, state):
        return {"done": ops.zeros((ops.shape(state)[0],), "bool")}

    def stopped(self, carry):
        return carry["done"]

    def after(self, index, state, carry, rows):
        if index != self.index:
            return carry
        return {"done": ops.logical_or(carry["done"], ops.convert_to_tensor(self.stop))}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_run_without_control_equals_the_call(rng, x, mask, option):
    stack = built_stack(rng, option)
    expected = to_numpy(stack(x, padding_mask=mask, use_causal_mask=True))
    result = stack.run_layers(x, padding_mask=mask, use_causal_mask=True)
    np.testing.assert_allclose(to_numpy(result["outputs"]), expected, **TOLERANCE)
    assert result["control"] == {} and "cache" not in result


@pytest.mark.parametrize("option", sorted(set(OPTIONS) - {"shared_maps", "shared_biases"}))
def test_state_after_each_layer_is_the_pruned_stack(rng, x, mask, option):
    """The state read after layer `l` is the output of the stack cut after layer `l`
    (`prune`): fusion, layer drop, multi-step residuals, shared and hybrid layers apply."""
    stack = built_stack(rng, option)
    reader = LayerStateReader(range(1, LAYERS + 1), lambda i, state: stack.output_state(state))
    states = stack.run_layers(x, reader, padding_mask=mask, use_causal_mask=True)
    states = states["control"]["values"]
    for layer in range(1, LAYERS + 1):
        cut = stack.prune(list(range(layer)))
        np.testing.assert_allclose(to_numpy(states[layer - 1]),
                                   to_numpy(cut(x, padding_mask=mask, use_causal_mask=True)),
                                   **TOLERANCE)


def test_reads_before_the_final_norm(rng, x):
    stack = built_stack(rng, "plain")
    reader = LayerStateReader([LAYERS], lambda i, state: state)
    state = stack.run_layers(x, reader)["control"]["values"][0]
    np.testing.assert_allclose(to_numpy(stack.output_norm(state)), to_numpy(stack(x)),
                               **TOLERANCE)


class IdentityRows(LayerControl):
    """Runs every layer, but replaces the output of layer `index` by its input for the
    rows not in `run` (the skipping rule, computed without skipping anything)."""

    def __init__(self, index, run):
        self.index, self.run = index, run

    def update(self, index, inputs, outputs, carry):
        if index != self.index:
            return outputs
        return ops.where(ops.convert_to_tensor(self.run)[:, None, None], outputs, inputs)


@pytest.mark.parametrize("run", [[False, True], [False, False]])
@pytest.mark.parametrize("option", ["plain", "layer_drop", "average_fusion", "multistep"])
def test_a_skipped_row_passes_the_layer_as_the_identity(rng, x, mask, option, run):
    """Row 0 (and row 1 in the second case) skips layer 2: its block output is its input
    (`f^2 = 0`), combined by the stack's options; a running row runs it as in the plain run.
    When no row runs the layer, the runner's skipping branch computes the same."""
    stack = built_stack(rng, option)
    skipped = to_numpy(stack.run_layers(x, SkipRows(1, run), padding_mask=mask)["outputs"])
    expected = to_numpy(stack.run_layers(x, IdentityRows(1, run), padding_mask=mask)["outputs"])
    np.testing.assert_allclose(skipped, expected, **TOLERANCE)
    full = to_numpy(stack(x, padding_mask=mask))
    np.testing.assert_allclose(skipped[1], (full if run[1] else expected)[1], **TOLERANCE)
    assert not np.allclose(skipped[0], full[0], atol=1e-3)
    if option in ("plain", "layer_drop"):  # the identity layer adds nothing: layer 2 pruned
        cut = to_numpy(stack.prune([0, 2])(x, padding_mask=mask))
        np.testing.assert_allclose(skipped[0], cut[0], **TOLERANCE)


def test_skipping_every_row_does_not_call_the_block(rng, x):
    """No row runs layer 2: its branch of `keras.ops.cond` is not taken (eager PyTorch and
    TensorFlow); under JAX every controlled layer is a `cond`."""
    stack = built_stack(rng, "plain")
    control = SkipRows(1, [False, False])
    if keras.config.backend() == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda h: stack.run_layers(h, control)["outputs"])(x)
        assert sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns) == 1
        return
    calls = []
    for index, layer in enumerate(stack.blocks):
        call = layer.call
        layer.call = lambda *a, _call=call, _index=index, **k: calls.append(_index) or _call(
            *a, **k)
    result = stack.run_layers(x, control)
    assert calls == [0, 2]
    states = result["control"]["states"]
    np.testing.assert_allclose(to_numpy(states[1]), to_numpy(states[0]), **TOLERANCE)


def test_a_skipped_group_start_still_shares_its_attention_map(rng, x):
    """With `share_attention_maps=2`, layer 1 skipped by every row still computes its
    attention weights on its input for layer 2 (its mixer sub-layer runs alone)."""
    stack = built_stack(rng, "shared_maps")
    result = stack.run_layers(x, SkipRows(0, [False, False]), use_causal_mask=True)
    _, weights = split_scores(stack.blocks[0](x, return_attention_scores=True,
                                              use_causal_mask=True))
    hidden = stack.blocks[1](x, attention_weights=weights, use_causal_mask=True)
    hidden = stack.blocks[2](hidden, use_causal_mask=True)
    np.testing.assert_allclose(to_numpy(result["outputs"]), to_numpy(stack.output_norm(hidden)),
                               **TOLERANCE)


@pytest.mark.parametrize("option", ["plain", "hybrid", "shared_layers", "average_fusion"])
def test_stopped_rows_freeze_and_copy_their_state_into_the_later_caches(rng, x, option):
    """Row 0 stops after layer 1: its state stays the exit state, and layers 2 and 3 cache
    that state (what their mixer sub-layers write for it); row 1 runs every layer. One
    cached step after a prefill, at position 3."""
    stack = built_stack(rng, option)
    cache = stack.init_cache(BATCH, LENGTH)
    _, cache = stack(x[:, :3], use_causal_mask=True, cache=cache, cache_index=0)
    token = x[:, 3:4]
    stopped = stack.run_layers(token, StopAfter(0, [True, False]), use_causal_mask=True,
                               cache=cache, cache_index=3)
    full = stack.run_layers(token, use_causal_mask=True, cache=cache, cache_index=3)
    np.testing.assert_allclose(to_numpy(stopped["outputs"])[1], to_numpy(full["outputs"])[1],
                               **TOLERANCE)
    reader = LayerStateReader([1], lambda i, state: state)
    exit_state = stack.run_layers(token, reader, use_causal_mask=True, cache=cache,
                                  cache_index=3)["control"]["values"][0]
    np.testing.assert_allclose(to_numpy(stopped["outputs"])[0],
                               to_numpy(stack.output_state(exit_state))[0], **TOLERANCE)
    for index in (1, 2):
        expected, _ = stack.blocks[index].fill_cache(exit_state, use_causal_mask=True,
                                                     cache=cache[index], cache_index=3)
        for got, want in zip(keras.tree.flatten(stopped["cache"][index]),
                             keras.tree.flatten(expected)):
            np.testing.assert_allclose(to_numpy(got)[0], to_numpy(want)[0], **TOLERANCE)


def test_every_row_stopped_fills_the_caches_without_calling_the_blocks(rng, x):
    stack = built_stack(rng, "plain")
    cache = stack.init_cache(BATCH, LENGTH)
    token = x[:, :1]
    control = StopAfter(0, [True, True])
    if keras.config.backend() == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda h: stack.run_layers(
            h, control, use_causal_mask=True, cache=cache, cache_index=0)["outputs"])(token)
        assert sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns) == LAYERS
        return
    calls = []
    for index, layer in enumerate(stack.blocks):
        call = layer.call
        layer.call = lambda *a, _call=call, _index=index, **k: calls.append(_index) or _call(
            *a, **k)
    result = stack.run_layers(token, control, use_causal_mask=True, cache=cache,
                              cache_index=0)
    assert calls == [0]
    keys = [to_numpy(layer[0])[:, :, 0] for layer in result["cache"]]
    assert all(np.abs(k).sum() > 0 for k in keys)  # every layer cached the token


def test_fill_cache_equals_the_cache_of_a_call(rng, x):
    layer = block(MultiHeadAttention(HEADS, causal=True))
    layer(x)
    randomize_weights(layer, rng)
    cache = layer.init_cache(BATCH, LENGTH)
    _, expected = layer(x[:, :2], cache=cache, cache_index=0)
    filled, extras = layer.fill_cache(x[:, :2], cache=cache, cache_index=0)
    assert extras is None
    for got, want in zip(filled, expected):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), **TOLERANCE)
    gated = GatedCrossAttentionBlock(block(MultiHeadAttention(HEADS, causal=True)),
                                     MultiHeadAttention(HEADS), FeedForward(HIDDEN))
    images = rng.normal(size=(BATCH, 3, WIDTH)).astype("float32")
    gated(x, encoder_outputs=images)
    randomize_weights(gated, rng)
    cache = gated.init_cache(BATCH, LENGTH, encoder_length=3)
    _, expected = gated(x[:, :2], encoder_outputs=images, cache=cache, cache_index=0)
    filled, _ = gated.fill_cache(x[:, :2], encoder_outputs=images, cache=cache, cache_index=0)
    for got, want in zip(keras.tree.flatten(filled), keras.tree.flatten(expected)):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), **TOLERANCE)


def test_shared_positions_only_biases_are_computed_once_per_call(rng, x):
    """`share_score_biases`: the stack's call evaluates the relative-position table once (the
    first layer's terms reach the others as the `bias_terms` call argument); under a control
    each layer evaluates it, with the same outputs."""
    stack = built_stack(rng, "shared_biases")
    bias = stack.blocks[0].mixer.biases[0]
    calls = []
    call = bias.call
    bias.call = lambda *a, **k: calls.append(1) or call(*a, **k)
    expected = to_numpy(stack(x, use_causal_mask=True))
    assert len(calls) == 1
    result = stack.run_layers(x, use_causal_mask=True)
    assert len(calls) == 1 + LAYERS
    np.testing.assert_allclose(to_numpy(result["outputs"]), expected, **TOLERANCE)


def test_update_mixes_the_block_output_before_the_options(rng, x):
    """`LayerControl.update` (e.g. a skip gate) changes the block's output; layer drop then
    rescales its increment: halving every output equals that rule by hand."""

    class Halve(LayerControl):
        def update(self, index, inputs, outputs, carry):
            return inputs + 0.5 * (outputs - inputs)

    stack = built_stack(rng, "layer_drop")
    result = stack.run_layers(x, Halve())
    hidden = ops.convert_to_tensor(x)
    for layer in stack.blocks:
        hidden = hidden + 0.6 * 0.5 * (layer(hidden) - hidden)  # ρ = 1 − 0.4
    np.testing.assert_allclose(to_numpy(result["outputs"]), to_numpy(stack.output_norm(hidden)),
                               **TOLERANCE)


def test_bad_cache_and_inputs():
    stack = TransformerStack(block(), 2)
    with pytest.raises(ValueError, match="cache"):
        stack.run_layers(np.zeros((1, 2, WIDTH), "float32"), cache=(None,), cache_index=0)
    with pytest.raises(ValueError, match="inputs"):
        stack.run_layers(np.zeros((2, WIDTH), "float32"))
