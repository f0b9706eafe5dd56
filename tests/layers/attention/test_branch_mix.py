"""BranchMix: `α · Att_self(H) + (1 − α) · AttSyn_self(H)` (survey §3.3)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import BranchMix
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layers.attention.test_syntax_hooks import weights_of
from tests.models import tiny
from tests.reference import syntax_attention as ref

B, T, D, H = 2, 5, 16, 2


def _multiplier(rng):
    return rng.uniform(0.2, 2.0, size=(B, T, T)).astype("float32")


def _reference(layer, x, alpha, mask=None, **syntax):
    plain, _ = ref.syntax_attention(x, x, weights_of(layer.attention), H, mask=mask)
    guided = layer.syntax_attention.guided_heads
    syn, _ = ref.syntax_attention(
        x, x, weights_of(layer.syntax_attention), H, mask=mask, guided_heads=guided, **syntax
    )
    return ref.branch_mix(plain, syn, alpha)


@pytest.mark.parametrize("kind", ["additive", "multiplicative"])
def test_fixed_alpha_matches_reference(rng, kind):
    layer = BranchMix(
        MultiHeadAttention(H), MultiHeadAttention(H, guided_heads=[1], name="syn"), alpha=0.3
    )
    x, m = random_normal(rng, (B, T, D)), _multiplier(rng)
    padding = padding_mask([5, 3], T)
    arg = "attention_bias" if kind == "additive" else "attention_multiplier"
    out = checks.to_numpy(layer(x, padding_mask=padding, **{arg: m}))
    expected = _reference(layer, x, 0.3, padding[:, None, None, :], **{kind: m})
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
    assert checks.count_params(layer) == 2 * tiny.attention_params(D)


@pytest.mark.parametrize("alpha,learn_alpha,initial", [("learned", False, 0.5), (0.2, True, 0.2)])
def test_learned_alpha_is_a_sigmoid_weight(rng, alpha, learn_alpha, initial):
    layer = BranchMix(MultiHeadAttention(H), alpha=alpha, learn_alpha=learn_alpha)
    x, m = random_normal(rng, (B, T, D)), _multiplier(rng)
    layer(x, attention_multiplier=m)
    assert checks.count_params(layer) == 2 * tiny.attention_params(D) + 1
    np.testing.assert_allclose(checks.to_numpy(layer.mixing_weight()), initial, atol=1e-6)
    layer.alpha_logit.assign(1.5)
    expected = _reference(layer, x, ref.sigmoid(1.5), multiplicative=m)
    out = checks.to_numpy(layer(x, attention_multiplier=m))
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"alpha": "learn"}, "alpha"),
        ({"learn_alpha": 1}, "learn_alpha"),
        ({"syntax_attention": FeedForward(8)}, "syntax_attention"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BranchMix(MultiHeadAttention(H), **kwargs)


def test_cached_decoding_equals_full_causal_pass(rng):
    layer = BranchMix(MultiHeadAttention(H, num_key_value_heads=1), alpha=0.6)
    x, m = random_normal(rng, (B, T, D)), _multiplier(rng)
    full = checks.to_numpy(layer(x, use_causal_mask=True, attention_multiplier=m))
    cache = layer.init_cache(B, T)
    assert [tuple(p.shape) for c in cache for p in c] == [(B, 1, T, D // H)] * 4
    steps, _ = checks.decode_stepwise(
        layer, x, cache, step_arguments=lambda start, stop: {
            "attention_multiplier": m[:, start:stop]})
    np.testing.assert_allclose(steps, full, atol=1e-5)


def _block_model(x, m, policy=None):
    block = TransformerBlock(BranchMix(MultiHeadAttention(H), alpha="learned"), FeedForward(32),
                             dtype=policy)
    return checks.wrap_in_model(block, [x], {"attention_multiplier": m})


def test_config_fit_and_saving_in_a_block(rng, tmp_path):
    layer = BranchMix(MultiHeadAttention(H, qk_dim=4), alpha=0.25, learn_alpha=True)
    clone = checks.check_config_round_trip(layer)
    assert clone.learn_alpha and clone.alpha == 0.25 and clone.syntax_attention.qk_dim == 4
    x, m = random_normal(rng, (B, T, D)), _multiplier(rng)
    model = _block_model(x, m)
    inputs = checks.model_inputs([x], {"attention_multiplier": m})
    mix = model.layers[-1].mixer
    before = checks.to_numpy(mix.alpha_logit)
    checks.check_fit_step(model, inputs)
    assert checks.to_numpy(mix.alpha_logit) != before
    checks.check_saving(model, inputs, tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    checks.check_mixed_precision(
        lambda **kw: BranchMix(MultiHeadAttention(H), alpha="learned", **kw),
        [random_normal(rng, (B, T, D))],
        {"attention_bias": _multiplier(rng), "padding_mask": padding_mask([5, 0], T)},
        policy=policy,
    )


@checks.xla_only
def test_jit_compile(rng):
    x, m = random_normal(rng, (B, T, D)), _multiplier(rng)
    checks.check_jit_compile(_block_model(x, m), checks.model_inputs([x], {"attention_multiplier": m}))


def test_causal_lm_with_branch_mix_trains(rng):
    block = TransformerBlock(BranchMix(MultiHeadAttention(tiny.HEADS), alpha="learned"),
                             FeedForward(tiny.FFN), norm_placement="pre")
    model = tiny.causal_lm(block=block, num_layers=1)
    x, y = tiny.batch_for(model, rng)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = model.fit(x, y, epochs=4, batch_size=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
