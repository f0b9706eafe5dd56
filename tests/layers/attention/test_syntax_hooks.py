"""Syntax matrices `M` given at call time (survey §3.2, §3.3): additive and multiplicative,
on all heads or on `guided_heads`, through MultiHeadAttention, TransformerBlock and
TransformerStack."""

import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.reference import attention as ref_attention
from tests.reference import syntax_attention as ref

B, T, D, H = 2, 5, 16, 2


def _matrix(rng, rank=3, length=T, key_length=None, kind="additive"):
    shape = (B, length, key_length or length) if rank == 3 else (B, H, length, key_length or length)
    if kind == "additive":
        return rng.normal(size=shape).astype("float32")
    return rng.uniform(0.2, 2.0, size=shape).astype("float32")


def weights_of(layer):
    w = {
        "wq": layer.query_dense.kernel,
        "wk": layer.key_dense.kernel,
        "wv": layer.value_dense.kernel,
        "wo": layer.output_dense.kernel,
        "bq": layer.query_dense.bias,
        "bk": layer.key_dense.bias,
        "bv": layer.value_dense.bias,
        "bo": layer.output_dense.bias,
    }
    return {k: checks.to_numpy(v).astype("float64") for k, v in w.items()}


@pytest.mark.parametrize(
    "kind,rank,guided_heads,kv_heads",
    [
        ("additive", 3, None, 2),
        ("additive", 4, [1], 1),
        ("multiplicative", 3, [0], 2),
        ("multiplicative", 4, None, 1),
    ],
)
def test_matches_reference_with_padding(rng, kind, rank, guided_heads, kv_heads):
    layer = MultiHeadAttention(H, num_key_value_heads=kv_heads, guided_heads=guided_heads)
    x, m = random_normal(rng, (B, T, D)), _matrix(rng, rank, kind=kind)
    padding = padding_mask([5, 3], T)
    arg = "attention_bias" if kind == "additive" else "attention_multiplier"
    out, alpha = checks.split_scores(layer(x, padding_mask=padding, return_attention_scores=True, **{arg: m}))
    mask = padding[:, None, None, :]
    expected, expected_alpha = ref.syntax_attention(
        x, x, weights_of(layer), H, kv_heads, mask=mask, guided_heads=guided_heads,
        **{kind: m},
    )
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(checks.to_numpy(alpha), expected_alpha, atol=1e-5)
    # Without returned weights (the fused kernel for the additive M): the same numbers.
    fast = layer(x, padding_mask=padding, **{arg: m})
    np.testing.assert_allclose(checks.to_numpy(fast), expected, atol=1e-4, rtol=1e-4)
    # M changes the outputs (only the guided heads' weights).
    plain, plain_alpha = checks.split_scores(layer(x, padding_mask=padding, return_attention_scores=True))
    assert not np.allclose(checks.to_numpy(plain), checks.to_numpy(out), atol=1e-4)
    if guided_heads is not None:
        unguided = [h for h in range(H) if h not in guided_heads]
        np.testing.assert_allclose(
            checks.to_numpy(alpha)[:, unguided], checks.to_numpy(plain_alpha)[:, unguided],
            atol=1e-6,
        )


def test_additive_and_multiplicative_together_with_causal_mask(rng):
    layer = MultiHeadAttention(H, causal=True)
    x = random_normal(rng, (B, T, D))
    add, mul = _matrix(rng), _matrix(rng, 4, kind="multiplicative")
    out = layer(x, attention_bias=add, attention_multiplier=mul)
    mask = ref_attention.causal_mask(T)[None, None]
    expected, _ = ref.syntax_attention(
        x, x, weights_of(layer), H, mask=mask, additive=add, multiplicative=mul
    )
    np.testing.assert_allclose(checks.to_numpy(out), expected, atol=1e-4, rtol=1e-4)


def test_fully_masked_rows_and_minus_infinity_give_no_nan(rng):
    layer = MultiHeadAttention(H, guided_heads=[0])
    x = random_normal(rng, (B, T, D))
    add = _matrix(rng)
    add[0, 1, :] = -np.inf  # a row the syntax forbids entirely
    add[1, :, 2] = -np.inf
    padding = padding_mask([5, 0], T)  # the second example has no real token
    out, alpha = checks.split_scores(layer(
        x, padding_mask=padding, attention_bias=add,
        attention_multiplier=_matrix(rng, kind="multiplicative"),
        return_attention_scores=True,
    ))
    out, alpha = checks.to_numpy(out), checks.to_numpy(alpha)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(alpha))
    np.testing.assert_array_equal(alpha[1], 0.0)
    fused = checks.to_numpy(layer(x, padding_mask=padding, attention_bias=add))
    assert np.all(np.isfinite(fused))
    # A forbidden key gets no weight where the row has allowed keys.
    fused_alpha = checks.to_numpy(
        layer(x, attention_bias=add, return_attention_scores=True)["attention_scores"]
    )
    np.testing.assert_allclose(fused_alpha[1, 0, :, 2], 0.0, atol=1e-12)


@pytest.mark.parametrize(
    "arg,shape",
    [
        ("attention_bias", (B, T)),  # rank
        ("attention_bias", (B, T + 1, T)),  # query length
        ("attention_multiplier", (B, T, T + 2)),  # key length
        ("attention_multiplier", (B, H + 1, T, T)),  # heads
    ],
)
def test_wrong_shapes_raise(rng, arg, shape):
    layer = MultiHeadAttention(H)
    with pytest.raises(ValueError, match=rf"{arg}.*Received: {arg}\.shape=\({shape[0]}"):
        layer(random_normal(rng, (B, T, D)), **{arg: np.ones(shape, "float32")})


@pytest.mark.parametrize("guided_heads", [[2], [-1], [0, 0], [], 1, ["0"]])
def test_bad_guided_heads_raise(guided_heads):
    with pytest.raises(ValueError, match="guided_heads"):
        MultiHeadAttention(H, guided_heads=guided_heads)


def test_cached_decoding_equals_full_causal_pass(rng):
    layer = MultiHeadAttention(H, num_key_value_heads=1, guided_heads=[1])
    x = random_normal(rng, (B, T, D))
    add, mul = _matrix(rng), _matrix(rng, 4, kind="multiplicative")
    full = checks.to_numpy(
        layer(x, use_causal_mask=True, attention_bias=add, attention_multiplier=mul)
    )
    steps, _ = checks.decode_stepwise(
        layer, x, layer.init_cache(B, T), step_arguments=lambda start, stop: {
            "attention_bias": add[:, start:stop], "attention_multiplier": mul[:, :, start:stop]})
    np.testing.assert_allclose(steps, full, atol=1e-5)


def _block(**mixer):
    return TransformerBlock(MultiHeadAttention(H, **mixer), FeedForward(32), norm_placement="pre")


def test_block_and_stack_pass_the_matrices_to_every_mixer(rng):
    x, add, mul = random_normal(rng, (B, T, D)), _matrix(rng), _matrix(rng, kind="multiplicative")
    padding = padding_mask([5, 4], T)
    stack = TransformerStack(_block(guided_heads=[0]), num_layers=2)
    out = checks.to_numpy(
        stack(x, padding_mask=padding, attention_bias=add, attention_multiplier=mul)
    )
    hidden = x
    for block in stack.blocks:
        hidden = block(hidden, padding_mask=padding, attention_bias=add, attention_multiplier=mul)
    np.testing.assert_allclose(out, checks.to_numpy(stack.output_norm(hidden)), atol=1e-5)
    plain = checks.to_numpy(stack(x, padding_mask=padding))
    assert not np.allclose(out, plain, atol=1e-4)


def _stack_model(x, add, policy=None):
    stack = TransformerStack(_block(guided_heads=[1]), num_layers=1, dtype=policy)
    return checks.wrap_in_model(stack, [x], {"attention_bias": add})


def test_config_round_trip_fit_and_saving(rng, tmp_path):
    layer = MultiHeadAttention(H, guided_heads=[1, 0], qk_dim=4)
    clone = checks.check_config_round_trip(layer)
    assert clone.guided_heads == [0, 1]
    x, add = random_normal(rng, (B, T, D)), _matrix(rng)
    model = _stack_model(x, add)
    checks.check_fit_step(model, checks.model_inputs([x], {"attention_bias": add}))
    checks.check_saving(model, checks.model_inputs([x], {"attention_bias": add}), tmp_path, 1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    x, add, mul = random_normal(rng, (B, T, D)), _matrix(rng), _matrix(rng, kind="multiplicative")
    add[0, 0] = -np.inf
    checks.check_mixed_precision(
        lambda **kw: MultiHeadAttention(H, guided_heads=[0], **kw), [x],
        {"attention_bias": add, "attention_multiplier": mul,
         "padding_mask": padding_mask([5, 2], T)},
        policy=policy,
    )


@checks.xla_only
def test_jit_compile(rng):
    x, add = random_normal(rng, (B, T, D)), _matrix(rng)
    model = _stack_model(x, add)
    checks.check_jit_compile(model, checks.model_inputs([x], {"attention_bias": add}))
