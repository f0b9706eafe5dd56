"""Tasks that carry a preprocessor: `generate("text")` gives text, `fit`, `evaluate` and
`predict` take strings, the preprocessor is saved with the model, and ids work as before."""

import keras
import numpy as np
import pytest

pytest.importorskip("tokenizers")

from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.models import Seq2SeqLM  # noqa: E402
from keras_xf.models import TextClassifier  # noqa: E402
from keras_xf.models import TextEncoder  # noqa: E402
from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import Seq2SeqLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import TextClassifierPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

TEXTS = ["To be, or not to be", "The slings and arrows"]
SIZES = dict(vocabulary_size=folders.VOCABULARY_SIZE, num_layers=1, hidden_dim=16,
             num_heads=2, intermediate_dim=32, max_sequence_length=32)
LENGTH = 16


@pytest.fixture(scope="module")
def lm(tokenizer):
    keras.utils.set_random_seed(0)
    return CausalLM(preprocessor=CausalLMPreprocessor(tokenizer, sequence_length=LENGTH),
                    pad_token_id=tokenizer.pad_token_id, **SIZES)


def test_causal_lm_generates_text(lm, tokenizer):
    text = lm.generate("To be, or")
    assert isinstance(text, str) and text.startswith("To be, or")
    texts = lm.generate(TEXTS)
    assert isinstance(texts, list) and len(texts) == 2
    assert all(t.startswith(p) for t, p in zip(texts, TEXTS))
    # The text path is the ids path with the preprocessor's output length.
    ids = lm.generate(tokenizer(TEXTS), max_length=LENGTH)
    assert texts == lm.preprocessor.generate_postprocess(ids, tokenizer(TEXTS))
    assert all(isinstance(i, int) for i in ids[0])


def test_causal_lm_fits_predicts_and_evaluates_on_strings(lm):
    lm.compile()
    history = lm.fit(TEXTS, batch_size=2, epochs=1, verbose=0,
                     validation_data=(TEXTS,))
    assert np.isfinite(history.history["loss"][0])
    assert np.isfinite(history.history["val_loss"][0])
    assert lm.predict(TEXTS, verbose=0).shape == (2, LENGTH, folders.VOCABULARY_SIZE)
    assert np.isfinite(lm.evaluate(TEXTS, verbose=0, return_dict=True)["loss"])


def test_causal_lm_saves_its_preprocessor(lm, tmp_path):
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.preprocessor, CausalLMPreprocessor)
    assert loaded.preprocessor.get_config() == lm.preprocessor.get_config()
    assert loaded.generate(TEXTS) == lm.generate(TEXTS)
    restored = CausalLM.from_config(lm.get_config())
    assert restored.preprocessor.sequence_length == LENGTH


def test_ids_work_exactly_as_without_a_preprocessor(lm):
    plain = CausalLM(**SIZES, pad_token_id=lm.pad_token_id)
    plain.set_weights(lm.get_weights())
    assert "preprocessor" not in plain.get_config() and plain.preprocessor is None
    prompts = [[5, 6, 7], [8, 9]]
    np.testing.assert_equal(plain.generate(prompts, max_length=10),
                            lm.generate(prompts, max_length=10))
    with pytest.raises(ValueError, match="type"):
        plain.predict(["To be"], verbose=0)
    with pytest.raises(ValueError, match="Received: text prompts and preprocessor=None"):
        plain.generate("To be")


def test_wrong_preprocessors_are_refused(tokenizer, lm):
    classifier_preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=LENGTH)
    with pytest.raises(ValueError, match="CausalLM takes preprocessor=None or a "
                                         "CausalLMPreprocessor. Received: preprocessor of "
                                         "type TextClassifierPreprocessor"):
        CausalLM(preprocessor=classifier_preprocessor, **SIZES)
    with pytest.raises(ValueError, match="Received: preprocessor of type str"):
        lm.preprocessor = "gpt2"


def test_classifier_fits_and_predicts_on_strings(tokenizer, tmp_path):
    preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=LENGTH)
    classifier = TextClassifier(num_classes=2, preprocessor=preprocessor, **SIZES)
    classifier.compile()
    history = classifier.fit(TEXTS, np.array([0, 1]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    logits = classifier.predict(TEXTS, verbose=0)
    assert logits.shape == (2, 2)
    path = str(tmp_path / "classifier.keras")
    classifier.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.preprocessor, TextClassifierPreprocessor)
    np.testing.assert_allclose(loaded.predict(TEXTS, verbose=0), logits, atol=1e-5)


def test_encoder_embeds_strings(tokenizer):
    preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=LENGTH)
    encoder = TextEncoder(preprocessor=preprocessor, **SIZES)
    embeddings = encoder.predict(TEXTS, verbose=0)
    assert embeddings.shape == (2, 16)
    ids = tokenizer.pack(TEXTS, LENGTH)
    np.testing.assert_allclose(embeddings, encoder.predict(ids, verbose=0), atol=1e-6)
    similarity = encoder.similarity(TEXTS, TEXTS[::-1])
    np.testing.assert_allclose(similarity[0], similarity[1], atol=1e-5)
    assert TextEncoder.from_config(encoder.get_config()).preprocessor.sequence_length == LENGTH


def test_a_backbone_with_segments_gets_segment_ids(tokenizer):
    preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=LENGTH,
                                              segment_ids=True)
    encoder = TextEncoder(preprocessor=preprocessor, num_segments=2, **SIZES)
    ids = {**tokenizer.pack(TEXTS, LENGTH), "segment_ids": np.zeros((2, LENGTH), "int32")}
    np.testing.assert_allclose(encoder.predict(TEXTS, verbose=0),
                               encoder.predict(ids, verbose=0), atol=1e-6)


def test_seq2seq_trains_on_pairs_and_generates_text(tokenizer):
    preprocessor = Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=LENGTH,
                                         decoder_sequence_length=LENGTH, decoder_start_token_id=0)
    model = Seq2SeqLM(preprocessor=preprocessor, start_token_id=0, pad_token_id=2, **SIZES)
    model.compile()
    history = model.fit({"encoder_text": TEXTS, "decoder_text": TEXTS[::-1]}, epochs=1,
                        verbose=0)
    assert np.isfinite(history.history["loss"][0])
    text = model.generate(TEXTS[0])
    assert isinstance(text, str)
    texts = model.generate(TEXTS)
    assert texts[0] == text and len(texts) == 2
    ids = model.generate(tokenizer(TEXTS[:1]), max_length=LENGTH)
    assert preprocessor.generate_postprocess(ids) == [text]


class Recorder:
    """A stand-in task whose `generate` records its arguments and echoes the prompts."""

    def __init__(self, preprocessor, stop_token_ids=()):
        self.preprocessor = preprocessor
        self.stop_token_ids = stop_token_ids
        self.calls = []

    def generate(self, inputs, max_length=None, stop_token_ids="auto", *, max_new_tokens=None):
        self.calls.append({"max_length": max_length, "stop_token_ids": stop_token_ids,
                           "max_new_tokens": max_new_tokens})
        return inputs


def test_text_stops_at_the_end_token_unless_told_otherwise(tokenizer):
    from keras_xf.models.generative.text_generation import generates_text

    generate = generates_text(Recorder.generate)
    recorder = Recorder(CausalLMPreprocessor(tokenizer, sequence_length=LENGTH))
    assert generate(recorder, "To be") == "To be"
    generate(recorder, ["To be"], 12, stop_token_ids=None)
    generate(recorder, ["To be"], stop_token_ids=(3,))
    generate(recorder, ["To be"], max_new_tokens=4)
    assert recorder.calls == [
        {"max_length": LENGTH, "stop_token_ids": (1,), "max_new_tokens": None},
        {"max_length": 12, "stop_token_ids": None, "max_new_tokens": None},
        {"max_length": LENGTH, "stop_token_ids": (3,), "max_new_tokens": None},
        {"max_length": None, "stop_token_ids": (1,), "max_new_tokens": 4},
    ]
    # A model with stop ids of its own (a checkpoint's end ids) keeps them: "auto".
    with_own_stops = Recorder(recorder.preprocessor, stop_token_ids=(2,))
    generate(with_own_stops, "To be")
    assert with_own_stops.calls[-1]["stop_token_ids"] == "auto"
    assert generate(recorder, [[5, 6]]) == [[5, 6]]  # ids pass straight through
