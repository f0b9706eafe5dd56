"""VisionLanguageLM (prefix and cross-attention decoders), GatedCrossAttentionBlock and
PrefixAttentionMask (survey §6.5)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import GatedCrossAttentionBlock
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import PrefixAttentionMask
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from keras_xf.models import VisionLanguageLM
from tests import layer_checks as checks
from tests.layer_checks import attention_weights
from tests.reference import vision_language_decoders as reference
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.layer_checks import to_numpy

IMAGE_SHAPE, PATCH = (8, 8, 1), 4
PATCHES = 4
FORMS = {
    "prefix": dict(fusion="prefix"),
    "cross_attention": dict(fusion="cross_attention"),
    "gated": dict(fusion="cross_attention", gated_cross_attention=True),
}


def vision_lm(form="prefix", **kwargs):
    config = dict(vocabulary_size=VOCAB, image_shape=IMAGE_SHAPE, patch_size=PATCH,
                  num_layers=1, hidden_dim=WIDTH, num_heads=HEADS, intermediate_dim=FFN,
                  max_sequence_length=LENGTH, vision_layers=1)
    return VisionLanguageLM(**{**config, **FORMS[form], **kwargs})


def batch(rng, lengths=(8, 5), length=8):
    ids = rng.integers(3, VOCAB, size=(2, length)).astype("int32")
    mask = (np.arange(length)[None, :] < np.asarray(lengths)[:, None]).astype("int32")
    images = rng.uniform(size=(2,) + IMAGE_SHAPE).astype("float32")
    return {"images": images, "token_ids": ids * mask, "padding_mask": mask}


def open_gates(model, value=0.8):
    """Gates start closed (α = 0); open them so the image reaches the text."""
    for variable in model.weights:
        if variable.path.endswith("_gate"):
            variable.assign(np.float32(value))


def logits_of(model, inputs):
    return to_numpy(model(inputs, training=False)).astype("float64")


@pytest.mark.parametrize("form", list(FORMS))
def test_trains_a_few_steps(form, rng):
    model = vision_lm(form)
    x = batch(rng, lengths=(8, 8))
    logits = model(x)
    assert tuple(logits.shape) == (2, 8, VOCAB)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, np.roll(x["token_ids"], -1, axis=1), epochs=3, batch_size=2,
                        verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("form", list(FORMS))
def test_cached_steps_equal_the_full_pass(form, rng):
    # Generation (cached = uncached for both fusions) is tested in
    # tests/generation/test_generative_task.py; here the cached calls themselves.
    model = vision_lm(form)
    open_gates(model)
    # The cached step's logits equal the full pass's at every text position.
    x = batch(rng, lengths=(8, 8))
    full = logits_of(model, x)
    cache = model.init_cache(2, 8)
    prefill, _, cache = model.call_with_cache(x["token_ids"][:, :3], cache, 0,
                                              model.encode_images(x["images"]))
    np.testing.assert_allclose(to_numpy(prefill), full[:, :3], atol=1e-4)
    for index in range(3, 8):
        step, _, cache = model.call_with_cache(x["token_ids"][:, index:index + 1], cache, index)
        np.testing.assert_allclose(to_numpy(step)[:, 0], full[:, index], atol=1e-4)


def test_a_recurrent_cross_attention_decoder_generates_with_its_state(rng):
    # A GRU decoder layer with cross-attention to the image (no vision encoder, whose blocks
    # could not hold cross-attention): the prefill writes only the image keys and values, and
    # the loop feeds every text token once, from the first.
    block = TransformerBlock(RecurrentMixer("gru"), FeedForward(FFN),
                             cross_attention=MultiHeadAttention(HEADS))
    model = vision_lm("cross_attention", block=block, vision_layers=0)
    assert model._has_recurrent_cache()
    prompts = {"images": rng.uniform(size=(2,) + IMAGE_SHAPE).astype("float32"),
               "token_ids": [[1, 5, 7], [1, 4]]}
    cached = model.generate(prompts, max_length=6)
    assert cached == model.generate(prompts, max_length=6, use_cache=False)
    assert [row[:len(p)] for row, p in zip(cached, prompts["token_ids"])] == prompts["token_ids"]


@pytest.mark.parametrize("form", ["prefix", "gated"])
def test_the_answer_depends_on_the_image_and_earlier_text_only(form, rng):
    model = vision_lm(form)
    open_gates(model)
    x = batch(rng, lengths=(8, 8))
    base = logits_of(model, x)
    other_image = dict(x, images=np.flip(x["images"], axis=1).copy())
    assert not np.allclose(logits_of(model, other_image), base, atol=1e-4)
    later = dict(x, token_ids=x["token_ids"].copy())
    later["token_ids"][:, 5] = 2  # causal text: positions before 5 are unchanged
    changed = logits_of(model, later)
    np.testing.assert_allclose(changed[:, :5], base[:, :5], atol=1e-5)
    assert not np.allclose(changed[:, 5:], base[:, 5:], atol=1e-5)


def test_prefix_attention_mask_matches_reference():
    layer = PrefixAttentionMask(PATCHES)
    queries = np.zeros((1, 7, WIDTH), "float32")
    np.testing.assert_array_equal(to_numpy(layer(queries)),
                                  reference.prefix_lm_mask(7, 7, PATCHES))
    # A cached query block: absolute positions from start_index, keys over the whole cache.
    np.testing.assert_array_equal(
        to_numpy(layer(queries[:, :2], key_length=10, start_index=5)),
        reference.prefix_lm_mask(2, 10, PATCHES, offset=5),
    )
    checks.check_config_round_trip(layer)
    with pytest.raises(ValueError, match="prefix_length=-1"):
        PrefixAttentionMask(-1)


@pytest.mark.parametrize("form", ["prefix", "cross_attention"])
def test_text_padding_with_images_present(form, rng):
    """Left-padded text: the values of padded tokens never reach the real ones, and padded
    rows stay finite."""
    model = vision_lm(form)
    x = batch(rng, lengths=(8, 8))
    x["padding_mask"][1, :3] = 0
    other = dict(x, token_ids=x["token_ids"].copy())
    other["token_ids"][1, :3] = rng.integers(3, VOCAB, size=3)
    base, changed = logits_of(model, x), logits_of(model, other)
    assert np.all(np.isfinite(base))
    np.testing.assert_allclose(changed[1, 3:], base[1, 3:], atol=1e-5)
    np.testing.assert_allclose(changed[0], base[0], atol=1e-6)
    assert not np.allclose(changed[1, :3], base[1, :3], atol=1e-5)  # the pads themselves


@pytest.mark.parametrize("form,policy", [("prefix", "mixed_float16"),
                                         ("gated", "mixed_bfloat16")])
def test_mixed_precision(form, policy, rng):
    model = vision_lm(form, dtype=policy)
    open_gates(model)
    x = batch(rng)
    logits = model(x)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.all(np.isfinite(to_numpy(logits)))
    for variable in model.weights:
        assert keras.backend.standardize_dtype(variable.dtype) == "float32", variable.path
    assert model.decoder.compute_dtype == keras.DTypePolicy(policy).compute_dtype
    generated = model.generate({"images": x["images"], "token_ids": [[1, 4], [1]]},
                               max_length=6)
    assert all(0 <= token < VOCAB for row in generated for token in row)


@checks.xla_only
@pytest.mark.parametrize("form", ["prefix", "gated"])
def test_jit_compile(form, rng):
    model = vision_lm(form)
    open_gates(model)
    x = batch(rng)
    expected = model.predict(x, verbose=0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=True)
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-5, rtol=1e-4)
    history = model.fit(x, x["token_ids"], epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


@pytest.mark.parametrize("form", ["prefix", "gated"])
def test_keras_round_trip(form, rng, tmp_path):
    model = vision_lm(form, position="learned", patch_position="sinusoidal_2d")
    open_gates(model, 0.5)
    x = batch(rng)
    loaded = checks.check_saving(model, x, tmp_path, atol=1e-5)
    assert loaded.get_config() == model.get_config()
    prompts = {"images": x["images"], "token_ids": [[1, 6], [1]]}
    assert loaded.generate(prompts, max_length=6) == model.generate(prompts, max_length=6)


def test_closed_gates_give_the_language_model_text_path(rng):
    """α = 0 at the start: the gated decoder equals its language-model layers alone."""
    model = vision_lm("gated", num_layers=2)
    x = batch(rng)
    text = model.embeddings(x["token_ids"])
    mask = keras.ops.cast(x["padding_mask"], "bool")
    for block in model.decoder.blocks:
        assert to_numpy(block.cross_attention_gate) == 0.0
        text = block.block(text, padding_mask=mask, use_causal_mask=True)
    if model.decoder.output_norm is not None:
        text = model.decoder.output_norm(text)
    expected = to_numpy(model.embeddings(text, reverse=True))
    np.testing.assert_allclose(logits_of(model, x), expected, atol=1e-5)
    # Different images change nothing while the gates are closed.
    other = dict(x, images=rng.uniform(size=x["images"].shape).astype("float32"))
    np.testing.assert_allclose(logits_of(model, other), expected, atol=1e-5)


def _norm(layer):
    return to_numpy(layer.gamma).astype("float64"), to_numpy(layer.beta).astype("float64")


@pytest.mark.parametrize("alphas", [(0.0, 0.0), (0.7, -1.3)])
def test_gated_block_matches_reference(alphas, rng):
    block = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(FFN), norm_placement="pre")
    gated = GatedCrossAttentionBlock(block, MultiHeadAttention(HEADS), FeedForward(FFN))
    x = rng.normal(size=(2, 5, WIDTH)).astype("float32")
    image = rng.normal(size=(2, PATCHES, WIDTH)).astype("float32")
    gated(x, encoder_outputs=image, use_causal_mask=True)
    for variable in gated.weights:
        if "norm" in variable.path:
            variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.3 + (
                1.0 if variable.path.endswith("gamma") else 0.0))
    gated.cross_attention_gate.assign(np.float32(alphas[0]))
    gated.feedforward_gate.assign(np.float32(alphas[1]))
    ff = gated.feedforward
    z = reference.gated_cross_attention(
        x.astype("float64"), image.astype("float64"), attention_weights(gated.cross_attention),
        HEADS, _norm(gated.cross_attention_norm), alphas[0],
        ffn_weights=tuple(to_numpy(w).astype("float64") for w in (
            ff.hidden_dense.kernel, ff.hidden_dense.bias, ff.output_dense.kernel,
            ff.output_dense.bias)),
        norm_2=_norm(gated.feedforward_norm), alpha_ffn=alphas[1],
    )
    if alphas == (0.0, 0.0):
        np.testing.assert_allclose(z, x, atol=1e-12)
    expected = to_numpy(block(z.astype("float32"), use_causal_mask=True))
    actual = to_numpy(gated(x, encoder_outputs=image, use_causal_mask=True))
    np.testing.assert_allclose(actual, expected, atol=1e-4)
    np.testing.assert_allclose(reference.tanh_gate(1.0, 2.0, 0.5), 1.0 + 2.0 * np.tanh(0.5))
    clone = checks.check_config_round_trip(gated)
    assert clone.block.cross_attention is None and clone.feedforward is not None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(patch_size=3), "divisible by patch_size"),
        (dict(fusion="late"), "fusion='late'"),
        (dict(gated_cross_attention=True), "gated_cross_attention=True"),
        (dict(image_shape=(8, 8)), "image_shape="),
        (dict(vision_layers=-1), "vision_layers=-1"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vision_lm("prefix", **kwargs)


def test_bad_inputs_raise(rng):
    model = vision_lm("cross_attention")
    x = batch(rng)
    with pytest.raises(ValueError, match="channels"):
        model(dict(x, images=np.zeros((2, 8, 8, 3), "float32")))
    with pytest.raises(ValueError, match="images"):
        model({"token_ids": x["token_ids"], "padding_mask": x["padding_mask"]})
    with pytest.raises(ValueError, match="images"):
        model.generate({"token_ids": [[1]]}, max_length=4)
    with pytest.raises(ValueError, match=r"images.shape=\(2, 4, 4, 1\)"):
        model.generate({"images": np.zeros((2, 4, 4, 1), "float32")}, max_length=4)
    with pytest.raises(ValueError, match="same batch size"):
        model.generate({"images": x["images"], "token_ids": [[1]]}, max_length=4)
    block = TransformerBlock(MultiHeadAttention(HEADS), FeedForward(FFN))
    with pytest.raises(ValueError, match="encoder_outputs=None"):
        GatedCrossAttentionBlock(block, MultiHeadAttention(HEADS))(
            rng.normal(size=(2, 3, WIDTH)).astype("float32"))


def test_embedding_scale_multiplies_the_token_embeddings(rng):
    model = vision_lm("prefix", embedding_scale=True, position="none")
    ids = rng.integers(3, VOCAB, size=(2, 5)).astype("int32")
    table = to_numpy(model.embeddings.token_embedding.embeddings)
    np.testing.assert_allclose(to_numpy(model.embeddings(ids)), table[ids] * np.sqrt(WIDTH),
                               rtol=1e-6)
    assert VisionLanguageLM.from_config(model.get_config()).embedding_scale is True
    prompts = {"images": rng.uniform(size=(2,) + IMAGE_SHAPE).astype("float32"),
               "token_ids": [[1, 5, 7], [1]]}
    assert model.generate(prompts, max_length=6) == model.generate(prompts, max_length=6,
                                                                   use_cache=False)


def test_gated_template_from_a_block_without_feedforward_has_none(rng):
    # TransformerBlock(mixer, None): the gated cross-attention block copies no feedforward.
    block = TransformerBlock(MultiHeadAttention(HEADS), None, norm_placement="pre")
    model = vision_lm("gated", block=block)
    gated = [layer for layer in model._flatten_layers()
             if isinstance(layer, GatedCrossAttentionBlock)]
    assert len(gated) == 1 and gated[0].feedforward is None
    assert np.all(np.isfinite(logits_of(model, batch(rng))))
