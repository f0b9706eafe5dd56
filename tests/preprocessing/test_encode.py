"""`TextEncoder.encode`: texts to float32 embeddings in host-side batches, equal to `predict`
on the preprocessor's packed ids; refused without a preprocessor."""

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from keras_xf.models import TextEncoder  # noqa: E402
from keras_xf.preprocessing import HuggingFaceTokenizer  # noqa: E402
from keras_xf.preprocessing import TextClassifierPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

SIZES = dict(vocabulary_size=folders.VOCABULARY_SIZE, num_layers=1, hidden_dim=16,
             num_heads=2, intermediate_dim=32, max_sequence_length=32)
LENGTH = 32
TEXTS = folders.SHAKESPEARE[:5]


@pytest.fixture(scope="module")
def preprocessor(tmp_path_factory):
    tokenizer = HuggingFaceTokenizer(folders.write_tokenizer_folder(tmp_path_factory.mktemp("t")))
    return TextClassifierPreprocessor(tokenizer, sequence_length=LENGTH)


@pytest.fixture(scope="module")
def encoder(preprocessor):
    return TextEncoder(preprocessor=preprocessor, projection_dim=8, **SIZES)


@pytest.mark.parametrize("batch_size", [2, 5, 32])
def test_encode_equals_predict_on_the_packed_ids(encoder, preprocessor, batch_size):
    embeddings = encoder.encode(TEXTS, batch_size=batch_size)
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(TEXTS), 8)
    packed = preprocessor.tokenizer.pack(TEXTS, LENGTH)
    np.testing.assert_allclose(embeddings, encoder.predict(packed, verbose=0), atol=1e-6)


def test_a_single_string_gives_one_vector(encoder):
    vector = encoder.encode(TEXTS[1])
    assert vector.shape == (8,) and vector.dtype == np.float32
    np.testing.assert_allclose(vector, encoder.encode(TEXTS)[1], atol=1e-6)
    np.testing.assert_allclose(encoder.encode(tuple(TEXTS[:2])), encoder.encode(TEXTS[:2]))


def test_encode_with_segments_and_without_projection(preprocessor):
    with_segments = TextClassifierPreprocessor(preprocessor.tokenizer, sequence_length=LENGTH,
                                               segment_ids=True)
    encoder = TextEncoder(preprocessor=with_segments, num_segments=2, pooling="cls", **SIZES)
    packed = {**with_segments.tokenizer.pack(TEXTS, LENGTH),
              "segment_ids": np.zeros((len(TEXTS), LENGTH), "int32")}
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=3),
                               encoder.predict(packed, verbose=0), atol=1e-6)


def test_encode_refuses_missing_preprocessor_and_bad_arguments(encoder):
    bare = TextEncoder(**SIZES)
    with pytest.raises(ValueError, match="Received: preprocessor=None"):
        bare.encode(TEXTS)
    with pytest.raises(ValueError, match="batch_size must be a positive int. Received: "
                                         "batch_size=0"):
        encoder.encode(TEXTS, batch_size=0)
    with pytest.raises(ValueError, match="texts must be a string or a non-empty list"):
        encoder.encode([])


def test_docstring_example_runs():
    pytest.importorskip("keras_hub")
    calls = folders.docstring_calls(TextEncoder.encode)
    assert calls
    namespace = {"TextEncoder": TextEncoder}
    for call in calls:
        exec(call, namespace)
