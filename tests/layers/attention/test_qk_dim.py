"""Low-dimensional queries and keys, `MultiHeadAttention(qk_dim=d′)` (survey §5.3.2)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import random_normal
from tests.layers.attention.test_syntax_hooks import weights_of
from tests.models import tiny
from tests.reference import syntax_attention as ref

B, T, D, H = 2, 5, 16, 2


@pytest.mark.parametrize("qk_dim,kv_heads", [(4, 2), (12, 1)])
def test_matches_reference(rng, qk_dim, kv_heads):
    layer = MultiHeadAttention(H, num_key_value_heads=kv_heads, qk_dim=qk_dim)
    x = random_normal(rng, (B, T, D))
    padding = np.arange(T)[None, :] < np.array([[5], [2]])
    out, alpha = checks.split_scores(layer(x, padding_mask=padding, return_attention_scores=True))
    w = weights_of(layer)
    assert w["wq"].shape == (D, H, qk_dim) and w["wk"].shape == (D, kv_heads, qk_dim)
    assert w["wv"].shape == (D, kv_heads, D // H)
    expected, expected_alpha = ref.syntax_attention(
        x, x, w, H, kv_heads, mask=padding[:, None, None, :]
    )  # scale 1/√d′
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(alpha), expected_alpha, atol=1e-5)
    np.testing.assert_allclose(
        checks.to_numpy(layer(x, padding_mask=padding)), expected, atol=1e-4, rtol=1e-4
    )
    expected_count = (D + 1) * (H + kv_heads) * qk_dim + (D + 1) * kv_heads * (D // H)
    expected_count += H * (D // H) * D + D
    assert checks.count_params(layer) == expected_count


@pytest.mark.parametrize("qk_dim,kv_heads", [(4, 1), (12, 2)])
def test_cached_decoding_with_rotary_equals_full_causal_pass(rng, qk_dim, kv_heads):
    layer = MultiHeadAttention(
        H, num_key_value_heads=kv_heads, qk_dim=qk_dim, position=RotaryEmbedding()
    )
    x = random_normal(rng, (B, T, D))
    checks.check_cached_decoding(layer, x, prefill=2)
    # One tensor for keys and values, zero-padded to the wider of d′ and head_dim.
    keys, values = layer.init_cache(B, T)
    assert (tuple(keys.shape), tuple(values.shape)) == ((B, kv_heads, T, qk_dim), (B, kv_heads, T, D // H))


def test_cross_attention_cache(rng):
    layer = MultiHeadAttention(H, qk_dim=4)
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, T, D))
    full = checks.to_numpy(layer(x, memory))
    out, cache = layer(x[:, :2], memory, cache=layer.init_cache(B, T))
    rest, _ = layer(x[:, 2:], cache=cache)
    np.testing.assert_allclose(
        np.concatenate([checks.to_numpy(out), checks.to_numpy(rest)], axis=1), full, atol=1e-5
    )


@pytest.mark.parametrize("qk_dim", [0, -2, 2.5, True, "4"])
def test_bad_qk_dim_raises(qk_dim):
    with pytest.raises(ValueError, match=f"qk_dim must be a positive int. Received: qk_dim={qk_dim}"):
        MultiHeadAttention(H, qk_dim=qk_dim)


def test_odd_qk_dim_with_rotary_raises():
    with pytest.raises(ValueError, match="qk_dim must be even with a rotary position. *"):
        MultiHeadAttention(H, qk_dim=3, position=RotaryEmbedding())
    MultiHeadAttention(H, qk_dim=3)  # fine without rotary


def _model(x, policy=None):
    layer = MultiHeadAttention(H, qk_dim=4, num_key_value_heads=1, dtype=policy)
    return checks.wrap_in_model(layer, [x], {"use_causal_mask": True})


def test_config_fit_and_saving(rng, tmp_path):
    clone = checks.check_config_round_trip(MultiHeadAttention(H, qk_dim=6))
    assert clone.qk_dim == 6
    x = random_normal(rng, (B, T, D))
    model = _model(x)
    checks.check_fit_step(model, [x])
    checks.check_saving(model, [x], tmp_path, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    checks.check_mixed_precision(
        lambda **kw: MultiHeadAttention(H, qk_dim=4, position=RotaryEmbedding(), **kw),
        [random_normal(rng, (B, T, D))], {"use_causal_mask": True}, policy=policy,
    )


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    checks.check_jit_compile(_model(x), [x])


def test_causal_lm_with_rotary_trains_and_decodes_with_the_cache(rng):
    block = TransformerBlock(MultiHeadAttention(tiny.HEADS, qk_dim=4), FeedForward(tiny.FFN))
    model = tiny.causal_lm(block=block, position="rotary", num_layers=1)
    x, y = tiny.batch_for(model, rng)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    losses = model.fit(x, y, epochs=4, batch_size=2, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    _check_cached_logits(model, x)


def _check_cached_logits(model, x):
    """Token-by-token `call_with_cache` equals the full causal pass."""
    ids = x["token_ids"]
    full = checks.to_numpy(model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))
    cache = model.init_cache(ids.shape[0], ids.shape[1])
    steps = []
    for index in range(ids.shape[1]):
        logits, _, cache = model.call_with_cache(ids[:, index : index + 1], cache, index)
        steps.append(checks.to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-4, rtol=1e-4)
