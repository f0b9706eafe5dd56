"""TextEncoder: pooled, optionally projected, L2-normalised sequence embeddings."""

import numpy as np
import pytest

from keras_xf.models import TextEncoder
from keras_xf.models import TransformerBackbone
from tests.models.tiny import FFN
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.models.tiny import dtype_name
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import text_encoder
from tests.layer_checks import to_numpy
from tests.models.tiny import token_batch


@pytest.fixture(scope="module")
def encoder():
    return randomize_embeddings(text_encoder(position="learned"))


def embed(model, batch):
    return to_numpy(model(batch, training=False))


def test_keyword_form_gives_unit_norm_float32_embeddings(rng):
    model = TextEncoder(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, num_heads=2,
                        intermediate_dim=FFN, max_sequence_length=LENGTH)
    outputs = model(token_batch(rng, lengths=[8, 3]))
    assert tuple(outputs.shape) == (2, WIDTH)
    assert dtype_name(outputs) == "float32"
    np.testing.assert_allclose(np.linalg.norm(to_numpy(outputs), axis=-1), 1.0, atol=1e-5)
    assert model.count_params() == VOCAB * WIDTH + block_params()
    assert not model.backbone.causal


def test_projection_and_no_normalisation(rng):
    projected = text_encoder(projection_dim=8, normalize=False)
    assert projected.count_params() == VOCAB * WIDTH + block_params() + WIDTH * 8 + 8
    outputs = embed(projected, token_batch(rng))
    assert outputs.shape == (2, 8)
    assert not np.allclose(np.linalg.norm(outputs, axis=-1), 1.0, atol=1e-3)


def test_similarity_of_identical_inputs_is_one(encoder, rng):
    a = token_batch(rng, lengths=[8, 5])
    b = token_batch(rng, lengths=[6, 8])
    same = encoder.similarity(a, a)
    assert same.shape == (2,)
    np.testing.assert_allclose(same, 1.0, atol=1e-5)
    different = encoder.similarity(a, b)
    assert np.all(different < 0.999) and np.all(different >= -1.0 - 1e-6)
    expected = np.sum(embed(encoder, a) * embed(encoder, b), axis=-1)
    np.testing.assert_allclose(different, expected, atol=1e-5)


def test_mean_pooling_respects_padding(encoder, rng):
    short = token_batch(rng, lengths=[8, 3])
    # Pad further, with arbitrary ids under the padding: the embedding must not move.
    longer = {
        "token_ids": np.concatenate([short["token_ids"], np.full((2, 4), 9, "int32")], axis=1),
        "padding_mask": np.pad(short["padding_mask"], ((0, 0), (0, 4))),
    }
    longer["token_ids"][1, 3:8] = 11
    np.testing.assert_allclose(embed(encoder, longer), embed(encoder, short), atol=1e-5)
    # ... while a real token at the same place does move it.
    unmasked = dict(longer, padding_mask=np.ones_like(longer["padding_mask"]))
    assert not np.allclose(embed(encoder, unmasked), embed(encoder, short), atol=1e-3)


@pytest.mark.parametrize("pooling", ["cls", "max"])
def test_other_poolings(rng, pooling):
    model = randomize_embeddings(text_encoder(pooling=pooling))
    batch = token_batch(rng, lengths=[8, 4])
    outputs = embed(model, batch)
    assert outputs.shape == (2, WIDTH)
    np.testing.assert_allclose(np.linalg.norm(outputs, axis=-1), 1.0, atol=1e-5)
    hidden = to_numpy(model.backbone(batch))
    pooled = hidden[:, 0] if pooling == "cls" else np.stack(
        [hidden[0].max(axis=0), hidden[1, :4].max(axis=0)])
    expected = pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)
    np.testing.assert_allclose(outputs, expected, atol=1e-5)


@pytest.mark.parametrize("norm_placement", ["pre", "post"])
def test_cls_pooling_computes_the_first_row_of_the_last_layer_alone(rng, norm_placement):
    model = randomize_embeddings(text_encoder(
        num_layers=2, pooling="cls", norm_placement=norm_placement, projection_dim=WIDTH,
        projection_activation="tanh", normalize=False))
    batch = token_batch(rng, lengths=[8, 3])
    # The full path: every position through every layer, then the first row.
    hidden = to_numpy(model.backbone(batch))
    expected = to_numpy(model.projection(hidden[:, 0]))
    first = to_numpy(model.backbone(batch, output_length=1))
    assert first.shape == (2, 1, WIDTH)
    np.testing.assert_allclose(first[:, 0], hidden[:, 0], atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(embed(model, batch), expected, atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(model.predict(batch, verbose=0), expected, atol=2e-6, rtol=2e-6)


def test_config_round_trip():
    model = text_encoder(pooling="max", projection_dim=8, normalize=False)
    config = model.get_config()
    clone = TextEncoder.from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()


def test_bert_base_preset_with_overrides():
    model = TextEncoder.from_preset("bert_base", vocabulary_size=VOCAB, num_layers=1,
                                    hidden_dim=WIDTH, num_heads=2, intermediate_dim=FFN,
                                    max_sequence_length=LENGTH)
    config = model.backbone.get_config()
    assert (config["position"], config["activation"], config["norm_placement"]) == (
        "learned", "gelu", "post")
    assert model.count_params() == VOCAB * WIDTH + LENGTH * WIDTH + block_params()


def test_invalid_arguments_raise():
    causal = TransformerBackbone(VOCAB, 1, WIDTH, num_heads=2, intermediate_dim=FFN, causal=True)
    with pytest.raises(ValueError, match="causal"):
        TextEncoder(backbone=causal)
    with pytest.raises(ValueError, match="pooling=.median."):
        text_encoder(pooling="median")
    with pytest.raises(ValueError, match="Unknown preset"):
        TextEncoder.from_preset("bert_huge")
