"""TransformerBlock: self-attention (+ cross-attention) + FFN, each in a Residual (§2.1-2.6)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Residual
from keras_xf.layers import TransformerBlock
from tests.layer_checks import attention_weights
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import padding_mask
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import attention as ref_attention
from tests.reference import layers as ref

WIDTH, HEADS, HIDDEN = 8, 2, 16
EPSILON = 1e-5
BATCH, LENGTH, ENC_LENGTH = 2, 5, 6




def make_block(
    cross=False,
    norm_placement="post",
    normalization="layer_norm",
    dropout=0.0,
    dtype=None,
    heads=HEADS,
    hidden=HIDDEN,
    use_bias=True,
    kernel_initializer="glorot_uniform",
):
    init = {"kernel_initializer": kernel_initializer}
    if use_bias:
        init["bias_initializer"] = "random_normal"
    mixer = MultiHeadAttention(heads, use_bias=use_bias, dtype=dtype, **init)
    feedforward = FeedForward(hidden, dtype=dtype, **init)
    cross_attention = None
    if cross:
        cross_attention = MultiHeadAttention(heads, use_bias=use_bias, dtype=dtype, **init)
    return TransformerBlock(
        mixer,
        feedforward,
        cross_attention=cross_attention,
        normalization=normalization,
        norm_placement=norm_placement,
        dropout=dropout,
        epsilon=EPSILON,
        dtype=dtype,
    )


def make_inputs(rng):
    return rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")


def make_encoder_outputs(rng):
    return rng.normal(size=(BATCH, ENC_LENGTH, WIDTH)).astype("float32")


def residuals(block):
    found = [block.mixer_residual, block.cross_attention_residual, block.feedforward_residual]
    return [r for r in found if r is not None]


def randomize_weights(layer, rng):
    """Independent random values for every weight (norm scales around 1), so that the oracle
    checks each projection, bias and norm parameter separately, whatever the initializers."""
    for weight in layer.weights:
        name = weight.path.split("/")[-1]
        loc = 1.0 if name in ("gamma", "scale") else 0.0
        weight.assign(rng.normal(loc=loc, scale=0.3, size=weight.shape).astype("float32"))


# --- The numpy oracle: reference.multi_head_attention + ffn + layer_norm ----------------------


def numpy_norm(residual):
    norm = residual.norm
    if residual.normalization == "layer_norm":
        gamma, beta = (to_numpy(w).astype("float64") for w in (norm.gamma, norm.beta))
        return lambda h: ref.layer_norm(h, gamma, beta, epsilon=EPSILON)
    return lambda h: ref.rms_norm(h, to_numpy(norm.scale).astype("float64"), epsilon=EPSILON)


def numpy_block(block, x, padding=None, causal=False, encoder_outputs=None, encoder_padding=None):
    x = x.astype("float64")
    length = x.shape[1]
    mask = np.ones((1, 1, length, length), bool)
    if padding is not None:
        mask = mask & padding[:, None, None, :]
    if causal:
        mask = mask & ref_attention.causal_mask(length)[None, None]
    placement = ref.post_norm if block.norm_placement == "post" else ref.pre_norm

    def self_attention(h):
        return ref_attention.multi_head_attention(
            h, h, attention_weights(block.mixer), block.mixer.num_heads, mask=mask
        )[0]

    hidden = placement(self_attention, x, numpy_norm(block.mixer_residual))
    if block.cross_attention is not None:
        enc = encoder_outputs.astype("float64")
        cross_mask = None if encoder_padding is None else encoder_padding[:, None, None, :]

        def cross_attention(h):
            return ref_attention.multi_head_attention(
                h, enc, attention_weights(block.cross_attention), block.cross_attention.num_heads,
                mask=cross_mask,
            )[0]

        hidden = placement(cross_attention, hidden, numpy_norm(block.cross_attention_residual))
    ffn = block.feedforward
    params = [
        to_numpy(w).astype("float64")
        for w in (
            ffn.hidden_dense.kernel,
            ffn.hidden_dense.bias,
            ffn.output_dense.kernel,
            ffn.output_dense.bias,
        )
    ]
    return placement(
        lambda h: ref.ffn(h, *params, activation=ref.relu),
        hidden,
        numpy_norm(block.feedforward_residual),
    )


# --- Behaviour ---------------------------------------------------------------------------------


def test_build_wraps_each_sublayer_in_a_residual():
    block = make_block(cross=True, norm_placement="pre", normalization="rms_norm")
    block.build((BATCH, LENGTH, WIDTH), (BATCH, ENC_LENGTH, WIDTH))
    assert block.built
    for residual in residuals(block):
        assert isinstance(residual, Residual) and residual.built
        assert residual.norm_placement == "pre"
        assert isinstance(residual.norm, keras.layers.RMSNormalization)
    assert isinstance(block.mixer, MultiHeadAttention) and block.mixer.built
    assert isinstance(block.cross_attention, MultiHeadAttention) and block.cross_attention.built
    assert isinstance(block.feedforward, FeedForward) and block.feedforward.built
    assert tuple(block.compute_output_shape((BATCH, LENGTH, WIDTH))) == (BATCH, LENGTH, WIDTH)


def test_encoder_block_has_no_cross_attention():
    block = make_block()
    assert block.cross_attention is None
    assert block.cross_attention_residual is None


def test_config_round_trip():
    block = make_block(cross=True, norm_placement="pre", normalization="rms_norm", dropout=0.1)
    clone = check_config_round_trip(block)
    assert isinstance(clone.mixer, MultiHeadAttention)
    assert isinstance(clone.cross_attention, MultiHeadAttention)
    assert isinstance(clone.feedforward, FeedForward)
    assert (clone.norm_placement, clone.normalization, clone.dropout) == ("pre", "rms_norm", 0.1)
    check_config_round_trip(make_block())


@pytest.mark.parametrize("width, heads, hidden", [(8, 2, 16), (12, 3, 20), (16, 4, 64)])
def test_survey_parameter_count_table(width, heads, hidden):
    """Survey §2.5, Table: self-attention 4d², FFN 2d·d_ffn + d + d_ffn, each LNorm 2d;
    an encoder layer has two LNorms, a decoder layer three (plus 4d² of cross-attention)."""
    d = width
    # Zero kernels: only the shapes matter here, and JAX compiles a random initializer per shape.
    config = {"heads": heads, "hidden": hidden, "use_bias": False, "kernel_initializer": "zeros"}
    encoder = make_block(**config)
    encoder.build((BATCH, LENGTH, d))
    assert count_params(encoder) == 4 * d**2 + 2 * d * hidden + d + hidden + 4 * d
    assert count_params(encoder.mixer) == 4 * d**2
    assert count_params(encoder.feedforward) == 2 * d * hidden + d + hidden

    decoder = make_block(cross=True, **config)
    decoder.build((BATCH, LENGTH, d), (BATCH, ENC_LENGTH, d))
    assert count_params(decoder) == 8 * d**2 + 2 * d * hidden + d + hidden + 6 * d
    assert count_params(decoder.cross_attention) == 4 * d**2


def test_weight_count_with_biases_and_rms_norm():
    block = make_block(normalization="rms_norm")
    block.build((BATCH, LENGTH, WIDTH))
    d, h = WIDTH, HIDDEN
    attention = 4 * d * d + 4 * d  # four projections with biases
    assert count_params(block) == attention + (2 * d * h + d + h) + 2 * d


def test_fit_step_encoder(rng):
    x = make_inputs(rng)
    padding = padding_mask([LENGTH, 3], LENGTH)
    model = wrap_in_model(make_block(dropout=0.1), [x], {"padding_mask": padding})
    check_fit_step(model, [x, padding])


def test_fit_step_decoder(rng):
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    block = make_block(cross=True, norm_placement="pre")
    model = wrap_in_model(block, [x], {"encoder_outputs": enc, "use_causal_mask": True})
    check_fit_step(model, [x, enc])


def test_saving(rng, tmp_path):
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    enc_padding = padding_mask([ENC_LENGTH, 4], ENC_LENGTH)
    block = make_block(cross=True)
    model = wrap_in_model(
        block,
        [x],
        {"encoder_outputs": enc, "encoder_padding_mask": enc_padding, "use_causal_mask": True},
    )
    randomize_weights(block, rng)
    loaded = check_saving(model, [x, enc, enc_padding], tmp_path)
    restored = [layer for layer in loaded.layers if isinstance(layer, TransformerBlock)]
    assert len(restored) == 1 and restored[0].cross_attention is not None


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_mixed_precision(rng, policy, norm_placement):
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    outputs = check_mixed_precision(
        lambda dtype: make_block(cross=True, norm_placement=norm_placement, dtype=dtype),
        [x],
        {"encoder_outputs": enc, "use_causal_mask": True},
        policy=policy,
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


@pytest.mark.parametrize(
    "policy",
    ["mixed_float16", "mixed_bfloat16"],
)
def test_fit_step_under_mixed_policy(rng, policy):
    """A compiled (graph / jit) forward and training step in half precision, not just eager."""
    x = make_inputs(rng)
    padding = padding_mask([LENGTH, 0], LENGTH)  # the second sequence is fully padded
    block = make_block(norm_placement="pre", dtype=policy)
    model = wrap_in_model(block, [x], {"padding_mask": padding, "use_causal_mask": True})
    assert keras.backend.standardize_dtype(model.outputs[0].dtype) == (
        keras.DTypePolicy(policy).compute_dtype
    )
    check_fit_step(model, [x, padding], learning_rate=0.01)


@xla_only
def test_jit_compile(rng):
    x = make_inputs(rng)
    padding = padding_mask([LENGTH, 2], LENGTH)
    model = wrap_in_model(make_block(norm_placement="pre"), [x], {"padding_mask": padding})
    check_jit_compile(model, [x, padding])


# --- Correctness against numpy ---------------------------------------------------------------


def test_post_norm_encoder_block_matches_reference(rng):
    """`H' = LNorm(FFN(S) + S)`, `S = LNorm(MHA(H) + H)` with padding (survey §2.1, §2.4)."""
    block = make_block()
    x = make_inputs(rng)
    padding = padding_mask([LENGTH, 3], LENGTH)
    block.build(x.shape)
    randomize_weights(block, rng)
    actual = to_numpy(block(x, padding_mask=padding))
    expected = numpy_block(block, x, padding=padding)
    np.testing.assert_allclose(actual, expected, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_decoder_block_matches_reference(rng, norm_placement):
    """Causal self-attention, cross-attention to padded encoder outputs, FFN (survey §2.6)."""
    block = make_block(cross=True, norm_placement=norm_placement)
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    enc_padding = padding_mask([ENC_LENGTH, 2], ENC_LENGTH)
    block.build(x.shape, enc.shape)
    randomize_weights(block, rng)
    actual = to_numpy(
        block(x, encoder_outputs=enc, encoder_padding_mask=enc_padding, use_causal_mask=True)
    )
    expected = numpy_block(
        block, x, causal=True, encoder_outputs=enc, encoder_padding=enc_padding
    )
    np.testing.assert_allclose(actual, expected, atol=5e-5, rtol=1e-5)


def test_encoder_outputs_of_another_width(rng):
    """Cross-attention keys/values are projected from `d_enc` (here 4) to the heads."""
    block = make_block(cross=True, norm_placement="pre")
    x = make_inputs(rng)
    enc = rng.normal(size=(BATCH, ENC_LENGTH, 4)).astype("float32")
    block.build(x.shape, enc.shape)
    randomize_weights(block, rng)
    actual = to_numpy(block(x, encoder_outputs=enc, use_causal_mask=True))
    assert tuple(block.cross_attention.key_dense.kernel.shape)[0] == 4
    expected = numpy_block(block, x, causal=True, encoder_outputs=enc)
    np.testing.assert_allclose(actual, expected, atol=5e-5, rtol=1e-5)


def test_causal_block_ignores_future_tokens(rng):
    block = make_block(norm_placement="pre")
    x = make_inputs(rng)
    changed = x.copy()
    changed[:, 3:] = rng.normal(size=changed[:, 3:].shape)
    y, y_changed = (to_numpy(block(v, use_causal_mask=True)) for v in (x, changed))
    np.testing.assert_allclose(y[:, :3], y_changed[:, :3], atol=1e-6)
    assert not np.allclose(y[:, 3:], y_changed[:, 3:])


def test_residual_dropout_only_in_training(rng):
    block = make_block(dropout=0.5)
    x = make_inputs(rng)
    block.build(x.shape)
    randomize_weights(block, rng)
    inference = to_numpy(block(x, training=False))
    np.testing.assert_allclose(inference, numpy_block(block, x), atol=5e-5, rtol=1e-5)
    assert not np.allclose(to_numpy(block(x, training=True)), inference)


@pytest.mark.parametrize("cross", [False, True])
def test_incremental_decoding_equals_full_pass(rng, cross):
    block = make_block(cross=cross, norm_placement="pre")
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    kwargs = {"encoder_outputs": enc} if cross else {}
    full = to_numpy(block(x, use_causal_mask=True, **kwargs))
    cache = block.init_cache(BATCH, LENGTH, encoder_length=ENC_LENGTH if cross else None)
    steps = []
    # A prompt of two tokens, then one token at a time; encoder outputs only on the first call.
    for start, stop in [(0, 2), (2, 3), (3, 4), (4, 5)]:
        outputs, cache = block(
            x[:, start:stop], use_causal_mask=True, cache=cache, cache_index=start, **kwargs
        )
        kwargs = {}
        steps.append(to_numpy(outputs))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5, rtol=1e-5)
    if cross:
        self_cache, cross_cache = cache
        assert tuple(cross_cache[0].shape)[2] == ENC_LENGTH
    else:
        assert tuple(cache[0].shape)[2] == LENGTH


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("cross", [False, True])
def test_fully_padded_sequence_is_finite(rng, policy, cross):
    block = make_block(cross=cross, dtype=policy)
    x, enc = make_inputs(rng), make_encoder_outputs(rng)
    padding = padding_mask([LENGTH, 0], LENGTH)
    kwargs = {"padding_mask": padding}
    if cross:
        kwargs.update(encoder_outputs=enc, encoder_padding_mask=padding_mask([3, 0], ENC_LENGTH))
    outputs = to_numpy(block(x, **kwargs)).astype("float32")
    assert outputs.shape == (BATCH, LENGTH, WIDTH)
    assert np.all(np.isfinite(outputs))


# --- Validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"norm_placement": "middle"}, r"norm_placement='middle'"),
        ({"normalization": "group_norm"}, r"normalization='group_norm'"),
        ({"dropout": -0.1}, r"dropout=-0\.1"),
    ],
)
def test_invalid_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_block(**kwargs)


def test_missing_sublayers():
    with pytest.raises(ValueError, match="mixer=None"):
        TransformerBlock(None, FeedForward(HIDDEN))


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_a_block_without_feedforward_is_the_mixer_residual(rng, norm_placement):
    # feedforward=None: H' = Layer_self(H) (a Mamba block when pre-norm).
    block = TransformerBlock(MultiHeadAttention(HEADS), None, normalization="rms_norm",
                             norm_placement=norm_placement, epsilon=EPSILON)
    x = rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")
    out = block(x, use_causal_mask=True)
    assert block.feedforward is None and block.feedforward_residual is None
    expected = block.mixer_residual(x, use_causal_mask=True)
    np.testing.assert_allclose(to_numpy(out), to_numpy(expected), atol=1e-6)
    assert {w.path.split("/")[1] for w in block.weights} == {"mixer_residual"}
    clone = check_config_round_trip(block)
    assert clone.get_config()["feedforward"] is None
    cache = block.init_cache(BATCH, LENGTH)
    step, _ = block(x[:, :1], cache=cache, cache_index=0)
    np.testing.assert_allclose(to_numpy(step), to_numpy(out)[:, :1], atol=1e-5)


def test_wrong_input_rank():
    block = make_block()
    with pytest.raises(ValueError, match=r"rank 3.*inputs_shape=\(2, 8\)"):
        block(np.zeros((2, WIDTH), "float32"))


def test_encoder_outputs_need_cross_attention(rng):
    block = make_block()
    with pytest.raises(ValueError, match="without cross_attention"):
        block(make_inputs(rng), encoder_outputs=make_encoder_outputs(rng))


def test_cross_attention_needs_encoder_outputs(rng):
    block = make_block(cross=True)
    with pytest.raises(ValueError, match="encoder_outputs"):
        block(make_inputs(rng))


def test_cross_attention_cache_needs_encoder_length():
    block = make_block(cross=True)
    block.build((BATCH, LENGTH, WIDTH))
    with pytest.raises(ValueError, match="encoder_length"):
        block.init_cache(BATCH, LENGTH)
