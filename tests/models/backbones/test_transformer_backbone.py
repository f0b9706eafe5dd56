"""TransformerBackbone's embedding options: segment (token-type) embeddings, a norm of the
summed embeddings and a position offset (BERT, RoBERTa), in the layer and in the models."""

import keras
import numpy as np
import pytest

from keras_xf.layers import TokenAndPositionEmbedding
from keras_xf.models import CausalLM
from keras_xf.models import TextClassifier
from keras_xf.models import TextEncoder
from keras_xf.models import TransformerBackbone
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import to_numpy
from tests.layers.bad_inputs import raises_naming
from tests.models.tiny import SIZES
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import token_batch

OPTIONS = dict(position="learned", num_segments=3, embedding_normalization="layer_norm",
               embedding_epsilon=1e-6, position_offset=2)


def backbone(**overrides):
    return TransformerBackbone(**{**SIZES, "num_layers": 1, **OPTIONS, **overrides})


def segment_batch(rng, lengths=(8, 5), segments=3):
    batch = token_batch(rng, lengths=list(lengths))
    batch["segment_ids"] = rng.integers(0, segments, size=batch["token_ids"].shape).astype("int32")
    return batch


def make_layer(**kwargs):
    arguments = dict(position="learned", max_sequence_length=12, num_segments=3,
                     normalization="layer_norm", epsilon=1e-6, position_offset=2)
    return TokenAndPositionEmbedding(VOCAB, WIDTH, **{**arguments, **kwargs})


def reference_embedding(layer, ids, segments):
    """`LN(E[x_j] + P[j + offset] + S[s_j])` in float64 (unit scale, zero shift)."""
    table = to_numpy(layer.token_embedding.embeddings).astype("float64")
    positions = to_numpy(layer.position_embedding.position_embeddings).astype("float64")
    types = to_numpy(layer.segment_embedding.embeddings).astype("float64")
    offset = layer.position_offset
    summed = table[ids] + positions[offset : offset + ids.shape[1]][None] + types[segments]
    centred = summed - summed.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + layer.epsilon)


def test_layer_equals_the_equation(rng):
    layer = make_layer()
    ids = rng.integers(0, VOCAB, size=(2, 10)).astype("int32")
    segments = rng.integers(0, 3, size=(2, 10)).astype("int32")
    layer(ids, segment_ids=segments)
    for weight in layer.weights:  # unit-scale tables, so that every term matters
        if "embeddings" in weight.path:
            weight.assign(rng.normal(size=weight.shape).astype("float32"))
    np.testing.assert_allclose(to_numpy(layer(ids, segment_ids=segments)),
                               reference_embedding(layer, ids, segments), atol=1e-5)
    # No segment ids: segment 0 everywhere.
    np.testing.assert_allclose(to_numpy(layer(ids)),
                               reference_embedding(layer, ids, np.zeros_like(ids)), atol=1e-5)


def test_layer_weights_and_config(rng):
    layer = make_layer()
    layer(rng.integers(0, VOCAB, size=(2, 5)).astype("int32"))
    # Tokens, 12 positions, 3 segments, the norm's scale and shift.
    assert layer.count_params() == (VOCAB + 12 + 3 + 2) * WIDTH
    clone = check_config_round_trip(layer)
    assert (clone.num_segments, clone.normalization, clone.position_offset) == (3, "layer_norm", 2)
    defaults = TokenAndPositionEmbedding(VOCAB, WIDTH).get_config()
    assert (defaults["num_segments"], defaults["normalization"], defaults["position_offset"]) \
        == (None, None, 0)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_layer_mixed_precision(rng, policy):
    ids = rng.integers(0, VOCAB, size=(2, 5)).astype("int32")
    outputs = check_mixed_precision(make_layer, [ids], {"segment_ids": np.ones_like(ids)}, policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype


def test_backbone_inputs_and_shapes(rng):
    model = backbone()
    assert sorted(model.input) == ["padding_mask", "segment_ids", "token_ids"]
    assert model.uses_segment_ids
    assert tuple(model(segment_batch(rng)).shape) == (2, 8, WIDTH)
    # One segment: its row is added to every token, and there is no segment_ids input.
    single = backbone(num_segments=1)
    assert sorted(single.input) == ["padding_mask", "token_ids"]
    assert tuple(single(token_batch(rng)).shape) == (2, 8, WIDTH)
    # The defaults keep the plain backbone.
    plain = TransformerBackbone(**SIZES, num_layers=1, position="learned")
    assert plain.embeddings.segment_embedding is None and plain.embeddings.norm is None
    assert plain.count_params() == backbone(num_segments=None, embedding_normalization=None,
                                            position_offset=0).count_params()


def test_offset_positions_equal_a_shifted_input(rng):
    """Token `j` takes position `j + offset`: the offset model's outputs are those of the
    same weights with no offset, read at positions shifted by the offset."""
    model = backbone(num_segments=None, embedding_normalization=None)
    ids = rng.integers(3, VOCAB, size=(1, 6)).astype("int32")
    hidden = model.embeddings(ids)
    table = to_numpy(model.embeddings.position_embedding.position_embeddings)
    tokens = to_numpy(model.embeddings.token_embedding.embeddings)[ids]
    np.testing.assert_allclose(to_numpy(hidden), tokens + table[2:8][None], atol=1e-6)
    # The longest input is max_sequence_length - position_offset.
    raises_naming("position_offset", lambda: model.embeddings(np.ones((1, 11), "int32")))


def test_config_round_trip_and_tasks(rng):
    model = backbone()
    clone = TransformerBackbone.from_config(model.get_config())
    assert clone.get_config() == model.get_config()
    assert {k: model.get_config()[k] for k in OPTIONS} == OPTIONS
    encoder = TextEncoder(model, pooling="cls", projection_dim=WIDTH,
                          projection_activation="tanh", normalize=False)
    assert sorted(encoder.input) == ["padding_mask", "segment_ids", "token_ids"]
    pooled = to_numpy(encoder(segment_batch(rng)))
    assert np.all(np.abs(pooled) <= 1.0)
    assert TextEncoder.from_config(encoder.get_config()).get_config() == encoder.get_config()
    classifier = TextClassifier(num_classes=2, backbone=backbone())
    classifier.compile()
    history = classifier.fit(segment_batch(rng), np.array([0, 1], "int32"), verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def test_wrong_segment_ids_are_named(rng):
    model = backbone()
    batch = segment_batch(rng)
    batch["segment_ids"] = batch["segment_ids"][:, :5]
    raises_naming("segment_ids", lambda: model(batch))
    layer = TokenAndPositionEmbedding(VOCAB, WIDTH)
    ids = np.ones((2, 4), "int32")
    raises_naming("segment_ids", lambda: layer(ids, segment_ids=ids))
    raises_naming("segment_ids", lambda: make_layer()(ids, segment_ids=ids[:, :3]))


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"num_segments": 0}, "num_segments"),
        ({"num_segments": 2.5}, "num_segments"),
        ({"num_segments": True}, "num_segments"),
        ({"embedding_normalization": "batch_norm"}, "embedding_normalization"),
        ({"embedding_epsilon": 0.0}, "embedding_epsilon"),
        ({"embedding_epsilon": float("nan")}, "embedding_epsilon"),
        ({"position_offset": -1}, "position_offset"),
        ({"position_offset": 1.5}, "position_offset"),
        ({"position_offset": 12}, "position_offset"),
        ({"position_offset": 2, "position": "rotary"}, "position_offset"),
    ],
)
def test_bad_backbone_arguments_raise(overrides, name):
    raises_naming(name, lambda: backbone(**overrides))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_segments": -2}, "num_segments"),
        ({"normalization": "group_norm"}, "normalization"),
        ({"epsilon": -1e-5}, "epsilon"),
        ({"position_offset": "2"}, "position_offset"),
        ({"position_offset": 2, "position": "none"}, "position_offset"),
    ],
)
def test_bad_layer_arguments_raise(kwargs, name):
    raises_naming(name, lambda: make_layer(**kwargs))


def test_bad_task_arguments_raise():
    raises_naming("projection_activation",
                  lambda: TextEncoder(backbone(), projection_dim=4, projection_activation="no"))
    raises_naming("projection_activation",
                  lambda: TextEncoder(backbone(), projection_activation="tanh"))
    raises_naming("num_segments", lambda: CausalLM(**SIZES, num_layers=1, num_segments=2))
