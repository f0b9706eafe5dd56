"""Model growth: `grow_width` (tiled copies `W₁/ρ`, survey §4.4) and `grow_depth`
(shallow-to-deep stacking, survey §4.2.2)."""

import keras
import numpy as np
import pytest

from keras_xf.surgery import grow_depth
from keras_xf.surgery import grow_width
from keras_xf.surgery.grow_width import tiled
from tests.layer_checks import to_numpy
from tests.models import tiny


def _weights(model):
    return {w.path: to_numpy(w) for w in model.weights}


def _find(model, suffix, block=0):
    return next(to_numpy(w) for w in model.weights
                if w.path.endswith(suffix) and (block is None or f"block_{block}/" in w.path))


def _logits(model, x):
    return to_numpy(model(x))


def _fit_losses(model, rng, steps=3):
    x, y = tiny.batch_for(model, rng, batch=2)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    return model.fit(x, y, epochs=steps, verbose=0).history["loss"]


EXACT = [
    dict(tie_embeddings=False, position="learned"),
    dict(tie_embeddings=False, position="rotary", norm_placement="pre", normalization="rms_norm",
         activation="swiglu", num_key_value_heads=1),
]


@pytest.mark.parametrize("kwargs", EXACT, ids=["post_layer_norm", "pre_rms_swiglu_mqa"])
def test_grow_width_computes_the_same_function(kwargs, rng):
    model = tiny.causal_lm(num_layers=1, **kwargs)
    tiny.randomize_embeddings(model)
    wide = grow_width(model, 2)
    backbone = wide.backbone
    assert (backbone.hidden_dim, backbone.intermediate_dim, backbone.num_heads) == (32, 64, 4)
    assert type(wide) is type(model)
    x = tiny.token_batch(rng, lengths=[8, 5])
    np.testing.assert_allclose(_logits(wide, x), _logits(model, x), rtol=1e-4, atol=1e-4)
    # The block matrices of survey §4.4 with ρ = k = 2: rows that read grown units are
    # divided by ρ; what only produces grown units (biases, columns) is copied.
    w1, w2 = _find(model, "/output/kernel"), _find(wide, "/output/kernel")  # [f, d]
    np.testing.assert_allclose(w2, np.tile(w1 / 2, (2, 2)), rtol=1e-6)
    b1, b2 = _find(model, "/hidden/bias"), _find(wide, "/hidden/bias")
    np.testing.assert_allclose(b2, np.tile(b1, 2))
    q1, q2 = _find(model, "/query/kernel"), _find(wide, "/query/kernel")  # [d, H, d_h]
    np.testing.assert_allclose(q2, np.tile(q1 / 2, (2, 2, 1)), rtol=1e-6)


def test_tiling_with_rho_other_than_the_factor():
    w1 = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(tiled(w1, (6, 9), 3, 2.0, "ffn/kernel"), np.tile(w1 / 2.0, (3, 3)))
    np.testing.assert_allclose(tiled(w1, (2, 9), 3, 2.0, "ffn/kernel"), np.tile(w1, (1, 3)))
    np.testing.assert_allclose(tiled(w1, (6, 3), 3, 2.0, "norm/gamma"), np.tile(w1, (3, 1)))
    experts = np.arange(12.0).reshape(2, 3, 2)  # [M, d, f]: rows of each expert read d
    np.testing.assert_allclose(tiled(experts, (2, 6, 2), 2, 2.0, "moe/expert_kernel_in"),
                               np.tile(experts / 2.0, (1, 2, 1)))
    np.testing.assert_allclose(tiled(experts, (2, 3, 4), 2, 2.0, "moe/expert_kernel_out"),
                               np.tile(experts, (1, 1, 2)))
    with pytest.raises(ValueError, match="Cannot grow 'ffn/kernel' from shape \\(2, 3\\) to \\(4, 9\\)"):
        tiled(w1, (4, 9), 3, 2.0, "ffn/kernel")


def test_grow_width_of_a_classifier_is_exact_and_training_continues(rng):
    model = tiny.text_classifier(num_classes=3, tie_embeddings=False, position="learned",
                                 head_intermediate_dim=8)
    wide = grow_width(model, 2)
    x = tiny.token_batch(rng, lengths=[8, 6])
    np.testing.assert_allclose(_logits(wide, x), _logits(model, x), rtol=1e-4, atol=1e-5)
    losses = _fit_losses(wide, rng)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_grow_width_of_an_encoder_decoder_is_exact(rng):
    model = tiny.seq2seq_lm(tie_embeddings=False, position="learned")
    wide = grow_width(model, 2)
    assert wide.backbone.hidden_dim == 32
    x, _ = tiny.batch_for(model, rng)
    np.testing.assert_allclose(_logits(wide, x), _logits(model, x), rtol=1e-4, atol=1e-4)


def test_grow_depth_stacks_the_trained_layers(rng):
    model = tiny.causal_lm(num_layers=2)
    deep = grow_depth(model, 2)
    assert deep.backbone.num_layers == 4 and len(deep.backbone.transformer_stack.blocks) == 4
    for layer in range(4):  # layer l copies layer l mod L
        for suffix in ("/query/kernel", "/hidden/kernel", "mixer_residual/norm/gamma"):
            np.testing.assert_array_equal(_find(deep, suffix, layer), _find(model, suffix, layer % 2))
    embeddings = "token_embedding/embeddings"
    np.testing.assert_array_equal(_find(deep, embeddings, None), _find(model, embeddings, None))
    losses = _fit_losses(deep, rng)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_grow_depth_once_is_the_same_model_and_grows_encoder_and_decoder(rng):
    model = tiny.seq2seq_lm(num_layers=1)
    x, _ = tiny.batch_for(model, rng)
    same = grow_depth(model, 1)
    np.testing.assert_allclose(_logits(same, x), _logits(model, x), rtol=1e-6, atol=1e-6)
    deep = grow_depth(model, 2)
    paths = [w.path for w in deep.weights]
    assert any(p.startswith("encoder/block_1/") for p in paths)
    assert any(p.startswith("decoder/block_1/cross_attention/") for p in paths)
    assert np.all(np.isfinite(_logits(deep, x)))


def test_errors():
    model = tiny.causal_lm(num_layers=1)
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=f"factor must be a positive int. Received: factor={bad!r}"):
            grow_width(model, bad)
        with pytest.raises(ValueError, match=f"times must be a positive int. Received: times={bad!r}"):
            grow_depth(model, bad)
    for bad in (0, -1.0, "1"):
        with pytest.raises(ValueError, match=f"rho must be a positive number. Received: rho={bad!r}"):
            grow_width(model, 2, rho=bad)
    inputs = keras.Input((4,))
    plain = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ValueError, match="grow_width needs a model built from a TransformerBackbone"):
        grow_width(plain, 2)
    with pytest.raises(ValueError, match="grow_depth needs a model built from a TransformerBackbone"):
        grow_depth(plain, 2)
    with pytest.raises(ValueError, match="equally deep encoder and decoder.*num_decoder_layers=2"):
        grow_depth(tiny.seq2seq_lm(num_layers=1, num_decoder_layers=2), 2)
