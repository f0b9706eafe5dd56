"""RungeKuttaBlock: a TransformerBlock whose sub-layers take RK steps (survey §4.3), as a
stack template, with any mixer and feedforward, caches and generation."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LinearAttention
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RungeKuttaBlock
from keras_xf.layers import RungeKuttaResidual
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from keras_xf.models import CausalLM
from tests.layer_checks import check_cached_decoding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only

WIDTH, HIDDEN = 8, 16


def make_block(mixer=None, feedforward=None, dtype=None, **kwargs):
    return RungeKuttaBlock(mixer or MultiHeadAttention(2), feedforward or FeedForward(HIDDEN),
                           dtype=dtype, **kwargs)


def make_inputs(rng, length=5):
    return [rng.normal(size=(2, length, WIDTH)).astype("float32")]


def test_sub_layers_are_runge_kutta_steps(rng):
    (x,) = make_inputs(rng)
    block = make_block(method="rk4", share_weights=False)
    block(x)
    assert isinstance(block.mixer_residual, RungeKuttaResidual)
    assert isinstance(block.feedforward_residual, RungeKuttaResidual)
    assert block.mixer_residual.num_stages == 4
    # The block applies the mixer step, then the feedforward step.
    mixed = block.mixer_residual(x, use_causal_mask=True)
    expected = block.feedforward_residual(mixed)
    np.testing.assert_allclose(to_numpy(block(x, use_causal_mask=True)), to_numpy(expected),
                               atol=1e-6)


def test_shared_weights_cost_no_parameters(rng):
    (x,) = make_inputs(rng)
    plain = TransformerBlock(MultiHeadAttention(2), FeedForward(HIDDEN), norm_placement="pre")
    rk4 = make_block(method="rk4")
    unshared = make_block(method="rk2", share_weights=False)
    for block in (plain, rk4, unshared):
        block(x)
    assert count_params(rk4) == count_params(plain)
    assert count_params(unshared) == 2 * count_params(plain)


def test_stack_template_adds_final_norm(rng):
    (x,) = make_inputs(rng)
    stack = TransformerStack(make_block(method="rk2"), num_layers=2)
    assert stack.final_norm
    assert all(isinstance(block, RungeKuttaBlock) for block in stack.blocks)
    assert stack(x).shape == x.shape


@pytest.mark.parametrize("mixer", ["attention", "linear_attention"])
@pytest.mark.parametrize("share_weights", [True, False])
def test_stack_decodes_with_the_cache(rng, mixer, share_weights):
    """Each stage keeps its own cache: the cached steps equal the full causal pass."""
    x = rng.normal(size=(2, 6, WIDTH)).astype("float32")
    layer = MultiHeadAttention(2) if mixer == "attention" else LinearAttention(2)
    stack = TransformerStack(make_block(layer, method="rk4", share_weights=share_weights), 2)
    stack(x, use_causal_mask=True)
    randomize_weights(stack, rng)
    caches = stack.init_cache(2, 6)
    assert len(caches) == 2 and len(caches[0]) == 4
    check_cached_decoding(stack, x, prefill=2, atol=1e-4, rtol=1e-4)


def test_mixture_of_experts_feedforward(rng):
    (x,) = make_inputs(rng)
    block = make_block(feedforward=MixtureOfExperts(4, HIDDEN, top_k=2), method="rk2")
    mask = np.array([[True] * 5, [True] * 3 + [False] * 2])
    assert block(x, padding_mask=mask).shape == x.shape


def test_cross_attention_stages(rng):
    (x,) = make_inputs(rng)
    encoder = rng.normal(size=(2, 3, WIDTH)).astype("float32")
    block = make_block(cross_attention=MultiHeadAttention(2), method="rk2")
    full = to_numpy(block(x, encoder_outputs=encoder, use_causal_mask=True))
    self_cache, cross_cache = block.init_cache(2, 5, encoder_length=3)
    assert len(self_cache) == len(cross_cache) == 2
    cache = (self_cache, cross_cache)
    outputs = []
    for start, stop in [(0, 2), (2, 3), (3, 4), (4, 5)]:
        out, cache = block(x[:, start:stop], encoder_outputs=encoder if start == 0 else None,
                           use_causal_mask=True, cache=cache, cache_index=start)
        outputs.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5, rtol=1e-5)


def test_output_length_slices_the_full_outputs(rng):
    (x,) = make_inputs(rng)
    block = make_block(method="rk2")
    assert not block.computes_first_positions
    np.testing.assert_allclose(to_numpy(block(x, output_length=2)), to_numpy(block(x))[:, :2],
                               atol=1e-6)


def test_generate_equals_the_full_pass():
    keras.utils.set_random_seed(3)
    model = CausalLM(vocabulary_size=20, num_layers=1, hidden_dim=WIDTH, max_sequence_length=8,
                     block=make_block(method="rk2"))
    prompts = [[3, 4, 5], [6, 7, 8]]
    cached = np.array(model.generate(prompts, max_length=7, sampler="greedy"))
    uncached = np.array(model.generate(prompts, max_length=7, sampler="greedy",
                                       use_cache=False))
    np.testing.assert_array_equal(cached, uncached)


def test_post_norm_refused():
    with pytest.raises(ValueError, match="norm_placement"):
        make_block(norm_placement="post")


def test_bad_method_refused():
    with pytest.raises(ValueError, match="method"):
        make_block(method="rk5")


def test_config_round_trip():
    check_config_round_trip(make_block(method="rk4", share_weights=False,
                                       learned_coefficients=True, stage_norm="output",
                                       step_size=0.5))


def test_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    stack = TransformerStack(make_block(method="rk4", learned_coefficients=True), 2)
    check_saving(wrap_in_model(stack, inputs, {"use_causal_mask": True}), inputs, tmp_path)


def test_mixed_bfloat16(rng):
    check_mixed_precision(lambda dtype: TransformerStack(make_block(method="rk4"), 2,
                                                         dtype=dtype),
                          make_inputs(rng), {"use_causal_mask": True}, policy="mixed_bfloat16")


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    stack = TransformerStack(make_block(method="rk4", share_weights=False), 2)
    check_jit_compile(wrap_in_model(stack, inputs, {"use_causal_mask": True}), inputs)
