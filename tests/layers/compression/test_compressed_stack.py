import keras
import numpy as np
import pytest

from keras_xf.layers import CompressedStack
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import randomize_weights
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import check_bad_padding_mask
from tests.layers.bad_inputs import raises_naming
from tests.reference import sequence_compression as ref

B, T, D = 2, 7, 8


def _block(placement="pre", causal=False):
    return TransformerBlock(MultiHeadAttention(2, causal=causal), FeedForward(16),
                            norm_placement=placement)


def _stack(causal=False, **kwargs):
    kwargs = dict(dict(num_layers=(1, 1, 1), stride=2, kernel_size=3), **kwargs)
    return CompressedStack(_block(causal=causal), **kwargs)


@pytest.mark.parametrize("upsample,residual", [("repeat", True), ("transposed", False)])
def test_equals_its_parts(upsample, residual):
    """H¹ = Stack₁(H⁰); (C, m′) = Downsample(H¹, m); H² = Upsample(Stack₂(C, m′)) [+ H¹];
    H³ = LNorm(Stack₃(H²))."""
    rng = np.random.default_rng(0)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((7, 4), T)
    stack = _stack(upsample=upsample, residual=residual)
    stack.build(x.shape)
    randomize_weights(stack, rng)
    first, middle, last = stack.stacks
    h1 = first(x, padding_mask=mask)
    compressed, compressed_mask = stack.downsample(h1, padding_mask=mask)
    np.testing.assert_array_equal(checks.to_numpy(compressed_mask), [[1, 1, 1, 1], [1, 1, 0, 0]])
    h2 = stack.upsample(middle(compressed, padding_mask=compressed_mask),
                        residual=h1 if residual else None, padding_mask=mask)
    expected = stack.output_norm(last(h2, padding_mask=mask))
    np.testing.assert_allclose(checks.to_numpy(stack(x, padding_mask=mask)),
                               checks.to_numpy(expected), atol=1e-5)


def test_padding_does_not_reach_real_outputs():
    rng = np.random.default_rng(1)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((5, 2), T)
    noisy = np.where(mask[:, :, None], x, 100.0 * random_normal(rng, x.shape))
    stack = _stack()
    a = checks.to_numpy(stack(x, padding_mask=mask))
    b = checks.to_numpy(stack(noisy, padding_mask=mask))
    np.testing.assert_allclose(a[mask], b[mask], atol=1e-4)
    assert np.all(np.isfinite(a))


def test_final_norm_follows_the_template():
    assert _stack().output_norm is not None
    post = CompressedStack(_block("post"), num_layers=(0, 1, 0))
    assert post.output_norm is None and post.stacks[0] is None and post.stacks[2] is None
    assert post(np.zeros((B, 5, D), "float32")).shape == (B, 5, D)


def _model(stack):
    x = keras.Input((T, D))
    mask = keras.Input((T,), dtype="bool")
    return keras.Model([x, mask], stack(x, padding_mask=mask))


def test_config_fit_and_saving(tmp_path):
    rng = np.random.default_rng(2)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3), T)]
    stack = _stack(upsample="transposed")
    clone = checks.check_config_round_trip(stack)
    assert clone.num_layers == [1, 1, 1]
    model = _model(stack)
    checks.check_saving(model, inputs, tmp_path, atol=1e-5)
    checks.check_fit_step(model, inputs)


@checks.xla_only
def test_jit_compile():
    rng = np.random.default_rng(3)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3), T)]
    checks.check_jit_compile(_model(_stack()), inputs)


@pytest.mark.parametrize("kwargs,name", [
    (dict(num_layers=(1, 0, 1)), "num_layers"),
    (dict(num_layers=(1, 1)), "num_layers"),
    (dict(num_layers=(-1, 1, 0)), "num_layers"),
    (dict(stride=0), "stride"),
    (dict(kernel_size=1), "kernel_size"),
    (dict(upsample="nearest"), "upsample"),
    (dict(residual=None), "residual"),
    (dict(final_norm="yes"), "final_norm"),
])
def test_bad_arguments(kwargs, name):
    raises_naming(name, lambda: _stack(**kwargs))


def test_bad_block():
    raises_naming("block", lambda: CompressedStack(FeedForward(4), (1, 1, 1)))


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_causal_downsampling_matches_the_reference(kernel_size):
    """Causal: window `i` reads positions `i·s − k + 1 … i·s` (shifted right by `k − 1`)."""
    rng = np.random.default_rng(4)
    x = random_normal(rng, (B, T, D))
    mask = padding_mask((7, 4), T)
    stack = _stack(causal=True, kernel_size=kernel_size)
    assert stack.causal and not _stack().causal
    stack.build(x.shape)
    randomize_weights(stack, rng)
    kernel, bias = (checks.to_float64(w) for w in (stack.downsample.kernel,
                                                   stack.downsample.bias))
    for m in (mask, None):
        compressed, compressed_mask = stack._downsample(x, m)
        expected, expected_mask = ref.downsample(x.astype("float64"), kernel, bias, 2, m,
                                                 shift=kernel_size - 1)
        np.testing.assert_allclose(checks.to_numpy(compressed), expected, atol=1e-5)
        if m is not None:
            np.testing.assert_array_equal(checks.to_numpy(compressed_mask), expected_mask)
        else:
            assert compressed_mask is None


def _changed_after(x, position, rng):
    changed = x.copy()
    changed[:, position:] = random_normal(rng, changed[:, position:].shape)
    return changed


@pytest.mark.parametrize("upsample,residual", [("repeat", True), ("transposed", False)])
def test_a_causal_stack_reads_no_later_position(upsample, residual):
    """Output `t` is unchanged when every input after `t` changes (and changes when they do
    for the non-causal stack, so the check can fail)."""
    rng = np.random.default_rng(5)
    x = random_normal(rng, (B, T, D))
    mask = np.ones((B, T), bool)
    stack = _stack(causal=True, upsample=upsample, residual=residual)
    stack.build(x.shape)
    randomize_weights(stack, rng)
    full = checks.to_numpy(stack(x, padding_mask=mask))
    for position in range(1, T):
        changed = checks.to_numpy(stack(_changed_after(x, position, rng), padding_mask=mask))
        np.testing.assert_allclose(changed[:, :position], full[:, :position], atol=1e-5)
        assert not np.allclose(changed[:, position:], full[:, position:], atol=1e-3)
    plain = _stack(upsample=upsample, residual=residual)
    plain.build(x.shape)
    randomize_weights(plain, rng)
    changed = checks.to_numpy(plain(_changed_after(x, T - 1, rng), padding_mask=mask))
    assert not np.allclose(changed[:, :T - 1], checks.to_numpy(plain(x, padding_mask=mask))[
        :, :T - 1], atol=1e-3)


def test_a_causal_stack_saves_and_trains(tmp_path):
    rng = np.random.default_rng(6)
    inputs = [random_normal(rng, (B, T, D)), padding_mask((6, 3), T)]
    stack = _stack(causal=True)
    assert checks.check_config_round_trip(stack).causal
    model = _model(stack)
    checks.check_saving(model, inputs, tmp_path, atol=1e-5)
    checks.check_fit_step(model, inputs)


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
def test_bad_padding_mask(mask):
    check_bad_padding_mask(_stack(), mask, (B, T, D))
