"""ReversibleBlock and ReversibleStack: `y1 = x1 + F(x2)`, `y2 = x2 + G(y1)`, with the
backward pass recomputing each layer's inputs from its outputs (survey §5.4)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import ReversibleBlock
from keras_xf.layers import ReversibleStack
from keras_xf.layers import TransformerBlock
from tests.layer_checks import attention_weights
from tests.layer_checks import check_cached_decoding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import padding_mask
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.layer_checks import value_and_gradients
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import attention as ref_attention
from tests.reference import layers as ref
from tests.reference import numerical_blocks as ref_rev

WIDTH, HIDDEN, HEADS = 8, 16, 2


def make_block(**kwargs):
    return ReversibleBlock(MultiHeadAttention(HEADS), FeedForward(HIDDEN), **kwargs)


def make_stack(num_layers=3, dtype=None, **kwargs):
    return ReversibleStack(make_block(), num_layers, dtype=dtype, **kwargs)


def make_inputs(rng, length=5):
    return [rng.normal(size=(2, length, WIDTH)).astype("float32")]


def numpy_norm(norm):
    gamma, beta = to_float64(norm.gamma), to_float64(norm.beta)
    return lambda h: ref.layer_norm(h, gamma, beta)


def numpy_layers(blocks, mask):
    layers = []
    for block in blocks:
        weights = attention_weights(block.mixer)
        ffn = block.feedforward
        params = [to_float64(w) for w in (ffn.hidden_dense.kernel, ffn.hidden_dense.bias,
                                          ffn.output_dense.kernel, ffn.output_dense.bias)]
        f_norm, g_norm = numpy_norm(block.mixer_norm), numpy_norm(block.feedforward_norm)

        def f(h, weights=weights, f_norm=f_norm):
            h = f_norm(h)
            return ref_attention.multi_head_attention(h, h, weights, HEADS, mask=mask)[0]

        def g(h, params=params, g_norm=g_norm):
            return ref.ffn(g_norm(h), *params, activation=ref.relu)

        layers.append((f, g))
    return layers


def built_pair(rng, x, num_layers=3, **kwargs):
    """A recomputing stack and a plain-autodiff one with the same random weights."""
    reversible = make_stack(num_layers, recompute=True, **kwargs)
    plain = make_stack(num_layers, recompute=False, **kwargs)
    reversible(x)
    plain(x)
    randomize_weights(reversible, rng)
    plain.set_weights(reversible.get_weights())
    return reversible, plain


@pytest.mark.parametrize("recompute", [True, False])
def test_matches_numpy_reference(rng, recompute):
    (x,) = make_inputs(rng)
    stack = make_stack(recompute=recompute)
    stack(x)
    randomize_weights(stack, rng)
    mask = ref_attention.causal_mask(5)
    expected = ref_rev.reversible_stack(x.astype("float64"), numpy_layers(stack.blocks, mask),
                                        numpy_norm(stack.output_norm))
    np.testing.assert_allclose(to_numpy(stack(x, use_causal_mask=True)), expected,
                               atol=1e-5, rtol=1e-5)


def test_block_inverse_recovers_inputs(rng):
    """The block is invertible: `x2 = y2 − G(y1)`, `x1 = y1 − F(x2)`."""
    x = rng.normal(size=(2, 5, 2 * WIDTH)).astype("float32")
    block = make_block()
    block.build(x.shape)
    randomize_weights(block, rng)
    y = to_float64(block(x, use_causal_mask=True))
    (f, g), = numpy_layers([block], ref_attention.causal_mask(5))
    x1, x2 = ref_rev.reversible_inverse(y[..., :WIDTH], y[..., WIDTH:], f, g)
    np.testing.assert_allclose(np.concatenate([x1, x2], -1), x, atol=1e-5)


def test_weight_gradients_equal_autodiff(rng):
    """The custom gradient (inputs recomputed from outputs) gives the gradients of plain
    autodiff, for the inputs and every weight."""
    (x,) = make_inputs(rng)
    reversible, plain = built_pair(rng, x, num_layers=3)
    probe = rng.normal(size=x.shape).astype("float32")
    mask = padding_mask([5, 3], 5)

    def loss(stack):
        def function(inputs, *values):
            fixed = [v.value for v in stack.non_trainable_variables]
            outputs, _ = stack.stateless_call(list(values), fixed, inputs, use_causal_mask=True,
                                              padding_mask=keras.ops.convert_to_tensor(mask))
            return keras.ops.sum(keras.ops.multiply(outputs, keras.ops.convert_to_tensor(probe)))

        return function

    weights = [to_numpy(w) for w in reversible.trainable_variables]
    value, grads = value_and_gradients(loss(reversible), [x] + weights)
    expected_value, expected = value_and_gradients(loss(plain), [x] + weights)
    np.testing.assert_allclose(value, expected_value, rtol=1e-5)
    assert len(grads) == len(expected) == 1 + len(weights)
    names = ["inputs"] + [v.path for v in reversible.trainable_variables]
    for grad, want, name in zip(grads, expected, names):
        assert np.abs(want).max() > 0, name
        np.testing.assert_allclose(grad, want, atol=2e-5, rtol=1e-4, err_msg=name)


def test_fit_step_equals_autodiff(rng):
    """One SGD step of `fit` updates every weight as plain autodiff does (the optimiser
    reads the gradients of the variables themselves)."""
    inputs = make_inputs(rng)
    reversible, plain = built_pair(rng, inputs[0], num_layers=2)
    targets = rng.normal(size=inputs[0].shape).astype("float32")
    results = []
    for stack in (reversible, plain):
        model = wrap_in_model(stack, inputs, {"use_causal_mask": True})
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(inputs, targets, epochs=1, batch_size=2, verbose=0)
        results.append([to_numpy(w) for w in stack.trainable_variables])
    changed = False
    for after, expected in zip(*results):
        np.testing.assert_allclose(after, expected, atol=1e-5, rtol=1e-5)
        changed = changed or not np.allclose(after, expected * 0)
    assert changed


def test_cached_decoding_equals_full_pass(rng):
    x = rng.normal(size=(2, 6, WIDTH)).astype("float32")
    stack = make_stack()
    stack(x)
    randomize_weights(stack, rng)
    check_cached_decoding(stack, x, prefill=2)


def test_transformer_block_template(rng):
    (x,) = make_inputs(rng)
    template = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(HIDDEN),
                                normalization="rms_norm", norm_placement="pre")
    stack = ReversibleStack(template, 2)
    stack(x)
    assert all(isinstance(block, ReversibleBlock) for block in stack.blocks)
    assert stack.blocks[0].normalization == "rms_norm"
    # Same parameters per layer as the ordinary pre-norm block.
    template(x)
    assert count_params(stack) == 2 * count_params(template) + count_params(stack.output_norm)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ReversibleStack(make_block(), 0), "num_layers"),
        (lambda: ReversibleStack(make_block(), 2, recompute="yes"), "recompute"),
        (lambda: ReversibleStack(FeedForward(4), 2), "block"),
        (lambda: ReversibleStack(TransformerBlock(MultiHeadAttention(2), FeedForward(4),
                                                  dropout=0.1), 2), "dropout"),
        (lambda: ReversibleBlock(FeedForward(4), FeedForward(4)), "mixer"),
    ],
)
def test_bad_config_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_odd_stream_width_raises(rng):
    with pytest.raises(ValueError, match="2 \\* dim"):
        make_block()(rng.normal(size=(2, 3, 7)).astype("float32"))


def test_config_round_trip():
    check_config_round_trip(make_stack(recompute=False, final_norm=False))
    check_config_round_trip(make_block(normalization="rms_norm"))


def test_saving(rng, tmp_path):
    inputs = make_inputs(rng)
    check_saving(wrap_in_model(make_stack(), inputs, {"use_causal_mask": True}), inputs,
                 tmp_path)


def test_mixed_bfloat16(rng):
    inputs = make_inputs(rng)
    check_mixed_precision(lambda dtype: make_stack(dtype=dtype), inputs,
                          {"use_causal_mask": True}, policy="mixed_bfloat16")
    # A bfloat16 training step through the custom gradient.
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = wrap_in_model(make_stack(), inputs, {"use_causal_mask": True})
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(inputs, np.zeros_like(inputs[0]), epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@xla_only
def test_jit_compile(rng):
    inputs = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_stack(), inputs, {"use_causal_mask": True}), inputs)
