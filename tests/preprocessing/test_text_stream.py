"""`stream` on text: the pieces of text handed over as tokens are produced join into
`generate`'s text (after the prompt's own text), for one prompt, a batch, a seeded sampler
and a seq2seq model; a byte tokenizer's unfinished characters are held back until complete."""

import keras
import keras_hub
import pytest

pytest.importorskip("tokenizers")

from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.models import Seq2SeqLM  # noqa: E402
from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from keras_xf.preprocessing import Seq2SeqLMPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402
from tests.models.tiny import randomize_embeddings  # noqa: E402

TEXTS = ["To be, or not to be", "The slings"]
SIZES = dict(num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32,
             max_sequence_length=32)
LENGTH = 16


@pytest.fixture(scope="module")
def lm(tokenizer):
    keras.utils.set_random_seed(0)
    model = CausalLM(preprocessor=CausalLMPreprocessor(tokenizer, sequence_length=LENGTH),
                     vocabulary_size=folders.VOCABULARY_SIZE,
                     pad_token_id=tokenizer.pad_token_id, **SIZES)
    randomize_embeddings(model)
    return model


def prompt_text(model, text):
    """The prompt's own text, decoded from its ids as `generate` decodes its output."""
    ids = model.preprocessor.generate_preprocess([text])
    return model.preprocessor.generate_postprocess(ids, ids)[0]


def test_text_pieces_join_into_generate_text(lm):
    pieces = list(lm.stream(TEXTS[0], stop_token_ids=None))
    assert pieces and all(isinstance(piece, str) and piece for piece in pieces)
    assert prompt_text(lm, TEXTS[0]) + "".join(pieces) == lm.generate(
        TEXTS[0], stop_token_ids=None)


def test_a_batch_streams_a_piece_per_prompt(lm):
    arguments = dict(max_new_tokens=6, top_k=5, temperature=0.9, seed=3)
    steps = list(lm.stream(TEXTS, **arguments))
    assert steps and all(isinstance(step, list) and len(step) == 2 for step in steps)
    generated = lm.generate(TEXTS, **arguments)
    for row, text in enumerate(TEXTS):
        assert prompt_text(lm, text) + "".join(step[row] for step in steps) == generated[row]


def test_seq2seq_streams_the_target_text(tokenizer):
    preprocessor = Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=LENGTH,
                                         decoder_sequence_length=LENGTH,
                                         decoder_start_token_id=0)
    keras.utils.set_random_seed(0)
    model = Seq2SeqLM(preprocessor=preprocessor, start_token_id=0, pad_token_id=2,
                      vocabulary_size=folders.VOCABULARY_SIZE, **SIZES)
    randomize_embeddings(model)
    pieces = list(model.stream(TEXTS[0], stop_token_ids=None))
    assert "".join(pieces) == model.generate(TEXTS[0], stop_token_ids=None)


def test_unfinished_characters_are_held_back():
    """Random bytes from a byte tokenizer cut UTF-8 sequences: no piece ends inside one,
    and the pieces still join into `generate`'s text."""
    keras.utils.set_random_seed(0)
    model = CausalLM(preprocessor=CausalLMPreprocessor(keras_hub.tokenizers.ByteTokenizer(),
                                                       sequence_length=LENGTH),
                     vocabulary_size=256, **SIZES)
    randomize_embeddings(model)
    prompt = "ça "  # a two-byte character first
    pieces = list(model.stream(prompt, stop_token_ids=None, top_k=256, seed=1))
    assert "".join(pieces) and prompt_text(model, prompt) == prompt
    assert prompt + "".join(pieces) == model.generate(prompt, stop_token_ids=None, top_k=256,
                                                      seed=1)
    assert not any(piece.endswith("\ufffd") for piece in pieces[:-1])
