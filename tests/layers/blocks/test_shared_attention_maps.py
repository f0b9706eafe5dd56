"""Attention-map sharing across layers, `TransformerStack(share_attention_maps=k)` (§5.4)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import BranchMix
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layers.attention.test_qk_dim import _check_cached_logits
from tests.layers.attention.test_syntax_hooks import weights_of
from tests.models import tiny
from tests.reference import syntax_attention as ref

B, T, D, H = 2, 5, 16, 2


def _stack(num_layers=3, k=2, kv_heads=2, **kwargs):
    block = TransformerBlock(
        MultiHeadAttention(H, num_key_value_heads=kv_heads), FeedForward(32), norm_placement="pre"
    )
    return TransformerStack(block, num_layers, share_attention_maps=k, **kwargs)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_given_weights_match_reference(rng, kv_heads):
    layer = MultiHeadAttention(H, num_key_value_heads=kv_heads)
    x = random_normal(rng, (B, T, D))
    given = rng.uniform(size=(B, H, T, T)).astype("float32")
    padding = padding_mask([5, 3], T)
    out = checks.to_numpy(layer(x, padding_mask=padding, attention_weights=given))
    expected, _ = ref.syntax_attention(
        x, x, weights_of(layer), H, kv_heads, mask=padding[:, None, None, :], given_weights=given
    )
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)


def test_given_weights_with_wrong_shape_raise(rng):
    layer = MultiHeadAttention(H)
    with pytest.raises(ValueError, match=r"attention_weights.*Received: attention_weights.shape"):
        layer(random_normal(rng, (B, T, D)), attention_weights=np.ones((B, H + 1, T, T), "float32"))


@pytest.mark.parametrize("k,groups", [(2, [0, 0, 2]), (3, [0, 0, 0]), (1, [0, 1, 2])])
def test_stack_reuses_the_maps_of_each_group(rng, k, groups):
    assert ref.shared_map_groups(3, k) == groups
    stack = _stack(3, k)
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 2], T)
    out = checks.to_numpy(stack(x, padding_mask=padding, use_causal_mask=True))
    hidden, maps = x, {}
    for index, block in enumerate(stack.blocks):
        owner = groups[index]
        kwargs = dict(padding_mask=padding, use_causal_mask=True)
        if owner == index:
            hidden, maps[index] = checks.split_scores(block(hidden, return_attention_scores=True, **kwargs))
        else:
            hidden = block(hidden, attention_weights=maps[owner], **kwargs)
    np.testing.assert_allclose(out, checks.to_numpy(stack.output_norm(hidden)), atol=1e-5)
    if k > 1:
        independent = TransformerStack.from_config({**stack.get_config(), "share_attention_maps": 1})
        independent(x)
        independent.set_weights(stack.get_weights())
        assert not np.allclose(
            checks.to_numpy(independent(x, padding_mask=padding, use_causal_mask=True)), out,
            atol=1e-4,
        )


def test_fully_padded_example_gives_finite_outputs(rng):
    stack = _stack(2, 2)
    out = checks.to_numpy(
        stack(random_normal(rng, (B, T, D)), padding_mask=padding_mask([5, 0], T))
    )
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2"])
def test_bad_sharing_raises(k):
    with pytest.raises(ValueError, match=f"share_attention_maps must be an int >= 1.*{k}"):
        _stack(2, k)


def test_sharing_needs_an_attention_mixer():
    block = TransformerBlock(BranchMix(MultiHeadAttention(H)), FeedForward(32))
    with pytest.raises(ValueError, match="share_attention_maps > 1 needs .*mixer=BranchMix"):
        TransformerStack(block, 2, share_attention_maps=2)
    TransformerStack(block, 2, share_attention_maps=1)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_cached_decoding_equals_full_causal_pass(rng, kv_heads):
    stack = _stack(3, 2, kv_heads)
    x = random_normal(rng, (B, T, D))
    checks.check_cached_decoding(stack, x, prefill=2)


def test_config_fit_and_saving(rng, tmp_path):
    stack = _stack(3, 2)
    clone = checks.check_config_round_trip(stack)
    assert clone.share_attention_maps == 2
    x = random_normal(rng, (B, T, D))
    model = checks.wrap_in_model(stack, [x], {"use_causal_mask": True})
    checks.check_fit_step(model, [x])
    checks.check_saving(model, [x], tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    checks.check_mixed_precision(
        lambda **kw: _stack(2, 2, **kw), [random_normal(rng, (B, T, D))],
        {"padding_mask": padding_mask([5, 0], T)},
        policy=policy,
    )


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    checks.check_jit_compile(checks.wrap_in_model(_stack(2, 2), [x]), [x])


def test_causal_lm_trains_saves_and_decodes_with_the_cache(rng, tmp_path):
    model = tiny.causal_lm(num_layers=2, share_attention_maps=2, norm_placement="pre")
    assert model.backbone.transformer_stack.share_attention_maps == 2
    x, y = tiny.batch_for(model, rng)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = model.fit(x, y, epochs=4, batch_size=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    _check_cached_logits(model, x)
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.backbone.transformer_stack.share_attention_maps == 2
    np.testing.assert_allclose(
        checks.to_numpy(loaded(x)), checks.to_numpy(model(x)), atol=1e-5, rtol=1e-5
    )
