"""The deep-model residual forms in blocks, stacks and models (survey §4.2.1): any mixer and
feedforward, cached decoding equal to the full pass, `.keras` round trips, `mixed_bfloat16`."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LinearAttention
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from keras_xf.layers import deep_norm
from tests.layer_checks import check_cached_decoding
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.models.tiny import causal_lm
from tests.models.tiny import token_batch

WIDTH, HEADS, HIDDEN, LAYERS = 8, 2, 16, 2
FORMS = {
    "learned_weighted": {"norm_placement": "weighted", "inner_weight": 0.5,
                         "outer_weight": 0.5, "learned_weights": True},
    "deep_norm": deep_norm(decoder_layers=LAYERS)["decoder"].residual_arguments(),
    "pre_and_post": {"norm_placement": "pre_and_post"},
    "rezero": {"norm_placement": "rezero"},
}
MIXERS = {
    "attention": lambda dtype: MultiHeadAttention(HEADS, dtype=dtype),
    "linear_attention": lambda dtype: LinearAttention(HEADS, dtype=dtype),
    "lstm": lambda dtype: RecurrentMixer("lstm", dtype=dtype),
}


def make_stack(form, mixer="attention", feedforward="ffn", dtype=None, **kwargs):
    ffn = (FeedForward(HIDDEN, dtype=dtype) if feedforward == "ffn"
           else MixtureOfExperts(4, HIDDEN, top_k=2, capacity_factor=None, dtype=dtype))
    block = TransformerBlock(MIXERS[mixer](dtype), ffn, dtype=dtype, **FORMS[form])
    return TransformerStack(block, LAYERS, dtype=dtype, **kwargs)


def inputs(rng, length=6):
    return [rng.normal(size=(2, length, WIDTH)).astype("float32")]


@pytest.mark.parametrize("mixer", sorted(MIXERS))
@pytest.mark.parametrize("form", sorted(FORMS))
def test_cached_decoding_equals_full_pass(rng, form, mixer):
    stack = make_stack(form, mixer)
    (x,) = inputs(rng)
    stack.build(x.shape)
    randomize_weights(stack, rng)  # ReZero's α off zero, so every sub-layer contributes
    check_cached_decoding(stack, x, prefill=2, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_mixture_of_experts_feedforward_trains(rng, form):
    x = inputs(rng)
    model = wrap_in_model(make_stack(form, feedforward="moe"), x)
    check_fit_step(model, x)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_stack_saving(rng, tmp_path, form):
    x = inputs(rng)
    stack = make_stack(form, depth_initialization={"method": "sub_layer_depth", "b": 0.5})
    model = wrap_in_model(stack, x)
    randomize_weights(stack, rng)
    loaded = check_saving(model, x, tmp_path, atol=1e-5)
    block = loaded.layers[-1].blocks[0]
    assert block.norm_placement == FORMS[form]["norm_placement"]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_stack_mixed_bfloat16(rng, form):
    outputs = check_mixed_precision(lambda dtype: make_stack(form, dtype=dtype), inputs(rng),
                                    policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(outputs.dtype) in ("bfloat16", "float32")


def test_final_norm_follows_the_placement():
    """A stack ends with a norm where the identity path bypasses every norm (pre-norm and
    the sandwich norm); post-norm, weighted (DeepNorm) and ReZero stacks do not."""
    assert make_stack("pre_and_post").output_norm is not None
    for form in ("learned_weighted", "deep_norm", "rezero"):
        assert make_stack(form).output_norm is None


def test_deep_norm_causal_lm_generates_with_cache_and_saves(rng, tmp_path):
    """A DeepNorm CausalLM (residual and initialisation): cached generation equals
    recomputing the prefix, and a `.keras` round trip keeps its outputs."""
    constants = deep_norm(decoder_layers=LAYERS)["decoder"]
    block = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(32),
                             **constants.residual_arguments())
    lm = causal_lm(block=block, depth_initialization=constants.depth_initialization())
    assert lm.backbone.transformer_stack.depth_initialization["beta"] == constants.beta
    prompts = np.array([[3, 4, 5], [6, 7, 8]], "int32")
    cached = lm.generate(prompts, max_length=8)
    np.testing.assert_array_equal(to_numpy(cached),
                                  to_numpy(lm.generate(prompts, max_length=8, use_cache=False)))
    check_saving(lm, token_batch(rng), tmp_path, atol=1e-5)
