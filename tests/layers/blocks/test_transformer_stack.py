"""TransformerStack: `H^l = Block_l(H^{l-1})`, blocks cloned from one template (survey §2.1)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import layers as ref

WIDTH, HEADS, HIDDEN, LAYERS = 8, 2, 16, 2
EPSILON = 1e-5
BATCH, LENGTH, ENC_LENGTH = 2, 5, 6


def make_template(cross=False, norm_placement="pre", normalization="layer_norm", dtype=None):
    return TransformerBlock(
        MultiHeadAttention(HEADS, dtype=dtype),
        FeedForward(HIDDEN, dtype=dtype),
        cross_attention=MultiHeadAttention(HEADS, dtype=dtype) if cross else None,
        norm_placement=norm_placement,
        normalization=normalization,
        epsilon=EPSILON,
        dtype=dtype,
    )


def make_stack(num_layers=LAYERS, cross=False, norm_placement="pre", dtype=None, **kwargs):
    template = make_template(cross=cross, norm_placement=norm_placement, dtype=dtype)
    return TransformerStack(template, num_layers, dtype=dtype, **kwargs)


def make_inputs(rng):
    return rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")


def make_encoder_outputs(rng):
    return rng.normal(size=(BATCH, ENC_LENGTH, WIDTH)).astype("float32")


def block_params(cross=False):
    d, h = WIDTH, HIDDEN
    attention = 4 * d * d + 4 * d
    return (2 if cross else 1) * attention + (2 * d * h + d + h) + (3 if cross else 2) * 2 * d


# --- Behaviour ---------------------------------------------------------------------------------


def test_build_clones_the_template():
    template = make_template()
    stack = TransformerStack(template, LAYERS)
    stack.build((BATCH, LENGTH, WIDTH))
    assert len(stack.blocks) == LAYERS
    assert all(isinstance(block, TransformerBlock) and block.built for block in stack.blocks)
    assert len({id(block) for block in stack.blocks}) == LAYERS
    assert template not in stack.blocks
    assert not template.built and not template.weights
    assert tuple(stack.compute_output_shape((BATCH, LENGTH, WIDTH))) == (BATCH, LENGTH, WIDTH)


@pytest.mark.parametrize("norm_placement", ["pre", "post", "rezero"])
def test_a_built_template_gives_fresh_unbuilt_clones(rng, norm_placement):
    template = make_template(norm_placement=norm_placement)
    inputs = make_inputs(rng)
    template(inputs)
    stack = TransformerStack(template, LAYERS, share_layers=[0, 1])
    assert not any(block.built for block in stack.blocks)
    assert to_numpy(stack(inputs)).shape == (BATCH, LENGTH, WIDTH)
    unbuilt = TransformerStack(make_template(norm_placement=norm_placement), LAYERS)
    unbuilt.build((BATCH, LENGTH, WIDTH))
    assert count_params(stack) == count_params(unbuilt)
    kernel = to_numpy(template.mixer.query_dense.kernel)
    assert not any(np.allclose(to_numpy(block.mixer.query_dense.kernel), kernel)
                   for block in stack.blocks)
    # The stack's config describes unbuilt templates, so it round-trips.
    assert "build_config" not in str(stack.get_config()["block"])
    check_config_round_trip(stack)


def test_clones_have_distinct_weights(rng):
    stack = make_stack()
    stack(make_inputs(rng))
    paths = [w.path for w in stack.weights]
    assert len(paths) == len(set(paths))
    kernels = [to_numpy(block.mixer.query_dense.kernel) for block in stack.blocks]
    for i in range(LAYERS):
        for j in range(i + 1, LAYERS):
            assert not np.allclose(kernels[i], kernels[j])
    # Training one block's variable leaves the others alone: they are separate variables.
    stack.blocks[0].feedforward.output_dense.bias.assign(np.ones(WIDTH, "float32"))
    np.testing.assert_array_equal(to_numpy(stack.blocks[1].feedforward.output_dense.bias), 0.0)


@pytest.mark.parametrize("norm_placement, cross", [("post", False), ("pre", True)])
def test_weight_count(norm_placement, cross):
    stack = make_stack(cross=cross, norm_placement=norm_placement)
    stack.build((BATCH, LENGTH, WIDTH), (BATCH, ENC_LENGTH, WIDTH) if cross else None)
    final_norm = 2 * WIDTH if norm_placement == "pre" else 0
    assert count_params(stack) == LAYERS * block_params(cross) + final_norm


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
def test_final_norm_for_pre_norm_only(normalization):
    pre = TransformerStack(make_template(norm_placement="pre", normalization=normalization), 2)
    post = TransformerStack(make_template(norm_placement="post", normalization=normalization), 2)
    expected = {
        "layer_norm": keras.layers.LayerNormalization,
        "rms_norm": keras.layers.RMSNormalization,
    }[normalization]
    assert pre.final_norm is True and isinstance(pre.output_norm, expected)
    assert pre.output_norm.epsilon == EPSILON
    assert post.final_norm is False and post.output_norm is None
    # Explicit choices override the default.
    assert TransformerStack(make_template(norm_placement="post"), 2, final_norm=True).output_norm
    assert TransformerStack(make_template(), 2, final_norm=False).output_norm is None


def test_config_round_trip():
    stack = make_stack(cross=True, norm_placement="post", final_norm=True)
    clone = check_config_round_trip(stack)
    assert clone.num_layers == LAYERS and clone.final_norm is True
    assert all(block.cross_attention is not None for block in clone.blocks)


def test_fit_step(rng):
    x = make_inputs(rng)
    padding = np.arange(LENGTH)[None] < np.array([[LENGTH], [3]])
    model = wrap_in_model(make_stack(), [x], {"padding_mask": padding})
    check_fit_step(model, [x, padding])


def test_saving(rng, tmp_path):
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    model = wrap_in_model(
        make_stack(cross=True), [x], {"encoder_outputs": enc, "use_causal_mask": True}
    )
    loaded = check_saving(model, [x, enc], tmp_path)
    stacks = [layer for layer in loaded.layers if isinstance(layer, TransformerStack)]
    assert len(stacks) == 1 and len(stacks[0].blocks) == 2


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    outputs = check_mixed_precision(
        lambda dtype: make_stack(dtype=dtype), [make_inputs(rng)], policy=policy
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


@xla_only
def test_jit_compile(rng):
    x = make_inputs(rng)
    check_jit_compile(wrap_in_model(make_stack(), [x]), [x])


# --- Correctness -------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_stack_composes_its_blocks(rng, norm_placement):
    stack = make_stack(norm_placement=norm_placement)
    x = make_inputs(rng)
    actual = to_numpy(stack(x, use_causal_mask=True))
    hidden = x
    for block in stack.blocks:
        hidden = block(hidden, use_causal_mask=True)
    expected = to_numpy(hidden)
    if norm_placement == "pre":
        gamma, beta = (to_numpy(w) for w in (stack.output_norm.gamma, stack.output_norm.beta))
        expected = ref.layer_norm(expected.astype("float64"), gamma, beta, epsilon=EPSILON)
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-5)


def test_decoder_stack_with_cross_attention(rng):
    stack = make_stack(cross=True)
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    enc_padding = np.arange(ENC_LENGTH)[None] < np.array([[ENC_LENGTH], [2]])
    kwargs = {"encoder_padding_mask": enc_padding, "use_causal_mask": True}
    y = to_numpy(stack(x, encoder_outputs=enc, **kwargs))
    assert y.shape == (BATCH, LENGTH, WIDTH) and np.all(np.isfinite(y))
    # The encoder outputs matter, except where they are padded.
    changed = enc.copy()
    changed[1, 2:] += 5.0
    y_changed = to_numpy(stack(x, encoder_outputs=changed, **kwargs))
    np.testing.assert_allclose(y_changed, y, atol=1e-5)
    changed[1, 0] += 5.0
    y_changed = to_numpy(stack(x, encoder_outputs=changed, **kwargs))
    np.testing.assert_allclose(y_changed[0], y[0], atol=1e-5)
    assert not np.allclose(y_changed[1], y[1])
    with pytest.raises(ValueError, match="encoder_outputs"):
        stack(x)


@pytest.mark.parametrize("cross", [False, True])
def test_cache_has_one_entry_per_layer(rng, cross):
    stack = make_stack(cross=cross)
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    stack.build(x.shape, enc.shape if cross else None)
    cache = stack.init_cache(BATCH, LENGTH, encoder_length=ENC_LENGTH if cross else None)
    assert isinstance(cache, tuple) and len(cache) == LAYERS
    kwargs = {"encoder_outputs": enc} if cross else {}
    outputs, new_cache = stack(x[:, :1], cache=cache, cache_index=0, use_causal_mask=True, **kwargs)
    assert tuple(outputs.shape) == (BATCH, 1, WIDTH)
    assert isinstance(new_cache, tuple) and len(new_cache) == LAYERS
    head_dim = WIDTH // HEADS
    for entry in new_cache:
        self_cache = entry[0] if cross else entry
        assert tuple(tuple(p.shape) for p in self_cache) == ((BATCH, HEADS, LENGTH, head_dim),) * 2
        if cross:
            assert tuple(tuple(p.shape) for p in entry[1]) == ((BATCH, HEADS, ENC_LENGTH, head_dim),) * 2
    with pytest.raises(ValueError, match=f"one entry per layer \\({LAYERS}\\)"):
        stack(x[:, :1], cache=cache[:-1], cache_index=0, **kwargs)


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
@pytest.mark.parametrize("cross", [False, True])
def test_incremental_decoding_equals_full_pass(rng, cross, norm_placement):
    stack = make_stack(cross=cross, norm_placement=norm_placement)
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    kwargs = {"encoder_outputs": enc} if cross else {}
    full = to_numpy(stack(x, use_causal_mask=True, **kwargs))
    cache = stack.init_cache(BATCH, LENGTH, encoder_length=ENC_LENGTH if cross else None)
    steps = []
    # One token at a time; the cache index is a tensor, as in a compiled generation loop.
    for index in range(LENGTH):
        outputs, cache = stack(
            x[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_index=keras.ops.convert_to_tensor(index, "int32"),
            **kwargs,
        )
        kwargs = {}  # the cross-attention cache is filled on the first call
        steps.append(to_numpy(outputs))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5, rtol=1e-5)


# --- Validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("num_layers", [0, -2, 1.5])
def test_invalid_num_layers(num_layers):
    with pytest.raises(ValueError, match=f"num_layers={num_layers}"):
        TransformerStack(make_template(), num_layers)


def test_wrong_input_rank():
    stack = make_stack(num_layers=1)
    with pytest.raises(ValueError, match=r"rank 3.*inputs_shape=\(2, 8\)"):
        stack(np.zeros((2, WIDTH), "float32"))
