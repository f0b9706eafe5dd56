"""TextClassifier: pooled encoder states through a classification head."""

import keras
import numpy as np
import pytest

from keras_xf.models import TextClassifier
from tests.models.tiny import FFN
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.models.tiny import dtype_name
from tests.models.tiny import text_classifier
from tests.layer_checks import to_numpy
from tests.models.tiny import token_batch


def separable_task(rng, size=32, length=8):
    """Class 1 iff token 5 occurs; other tokens are noise from 6..VOCAB, lengths 3..8."""
    ids = rng.integers(6, VOCAB, size=(size, length)).astype("int32")
    labels = np.arange(size) % 2
    lengths = rng.integers(3, length + 1, size=size)
    for row in np.flatnonzero(labels):
        ids[row, rng.integers(0, lengths[row])] = 5
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype("int32")
    return {"token_ids": ids * mask, "padding_mask": mask}, labels.astype("int32")


def test_keyword_form(rng):
    model = TextClassifier(num_classes=3, vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH,
                           num_heads=2, intermediate_dim=FFN, max_sequence_length=LENGTH)
    logits = model(token_batch(rng, lengths=[8, 2]))
    assert tuple(logits.shape) == (2, 3)
    assert dtype_name(logits) == "float32"
    assert model.count_params() == VOCAB * WIDTH + block_params() + WIDTH * 3 + 3


def test_head_intermediate_dim_adds_a_pooler(rng):
    model = text_classifier(num_classes=3, head_intermediate_dim=8, pooling="cls")
    assert model.count_params() == (
        VOCAB * WIDTH + block_params() + (WIDTH * 8 + 8) + (8 * 3 + 3))
    batch = token_batch(rng)
    # "cls" pooling reads position 0 only.
    hidden = to_numpy(model.backbone(batch))
    head_only = to_numpy(model.head(hidden[:, 0]))
    np.testing.assert_allclose(to_numpy(model(batch)), head_only, atol=1e-5)


def test_cls_pooling_equals_the_full_path_with_padding(rng):
    model = text_classifier(num_classes=3, num_layers=2, pooling="cls", norm_placement="pre")
    batch = token_batch(rng, lengths=[8, 2])
    expected = to_numpy(model.head(to_numpy(model.backbone(batch))[:, 0]))
    np.testing.assert_allclose(to_numpy(model(batch)), expected, atol=2e-6, rtol=2e-6)
    np.testing.assert_allclose(model.predict(batch, verbose=0), expected, atol=2e-6, rtol=2e-6)


def test_trains_on_a_separable_task(rng):
    x, y = separable_task(rng)
    model = text_classifier()
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, batch_size=16, epochs=15, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert history.history["accuracy"][-1] >= 0.75


def test_config_round_trip():
    model = text_classifier(num_classes=4, pooling="max", head_intermediate_dim=8,
                            head_dropout=0.1, activation="softmax")
    config = model.get_config()
    clone = TextClassifier.from_config(config)
    assert clone.get_config() == config
    assert clone.count_params() == model.count_params()


def test_softmax_output_compiles_with_probability_loss(rng):
    model = text_classifier(activation="softmax")
    probabilities = to_numpy(model(token_batch(rng)))
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, atol=1e-5)
    model.compile()
    assert model.loss.get_config()["from_logits"] is False


def test_bert_base_preset_with_overrides():
    model = TextClassifier.from_preset("bert_base", num_classes=2, vocabulary_size=VOCAB,
                                       num_layers=1, hidden_dim=WIDTH, num_heads=2,
                                       intermediate_dim=FFN, max_sequence_length=LENGTH)
    assert model.backbone.position == "learned"
    assert model.count_params() == (
        VOCAB * WIDTH + LENGTH * WIDTH + block_params() + WIDTH * 2 + 2)


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="num_classes"):
        text_classifier(num_classes=0)
    with pytest.raises(ValueError, match="Unknown preset"):
        TextClassifier.from_preset("bert_huge", num_classes=2)
