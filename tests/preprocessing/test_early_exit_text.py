"""`EarlyExitCausalLM.generate` with an exit criterion or `return_exit_layers=True` takes text
when the model has a preprocessor: text comes back (with the exit layers where asked), equal
to the ids path on the prompts' ids."""

import keras
import pytest

pytest.importorskip("tokenizers")

from keras_xf.models import EarlyExitCausalLM  # noqa: E402
from keras_xf.preprocessing import CausalLMPreprocessor  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

TEXTS = ["To be, or not to be", "The slings and arrows"]
LENGTH = 20
SIZES = dict(vocabulary_size=folders.VOCABULARY_SIZE, num_layers=2, hidden_dim=16,
             num_heads=2, intermediate_dim=32, max_sequence_length=32, norm_placement="pre",
             exit_layers=[1, 2])
EXIT = dict(exit_criterion="max_probability", exit_threshold=0.003)


@pytest.fixture(scope="module")
def lm(tokenizer):
    keras.utils.set_random_seed(0)
    return EarlyExitCausalLM(
        preprocessor=CausalLMPreprocessor(tokenizer, sequence_length=LENGTH),
        pad_token_id=tokenizer.pad_token_id, **SIZES)


def ids_path(lm, tokenizer, texts, **kwargs):
    """The ids path on the texts' prompt ids, with the text path's length and stop id."""
    prompts = lm.preprocessor.generate_preprocess(texts)
    return prompts, lm.generate(prompts, max_length=LENGTH,
                                stop_token_ids=(tokenizer.end_token_id,), **kwargs)


def test_adaptive_generate_takes_text(lm, tokenizer):
    texts = lm.generate(TEXTS, **EXIT)
    assert isinstance(texts, list) and all(t.startswith(p) for t, p in zip(texts, TEXTS))
    prompts, ids = ids_path(lm, tokenizer, TEXTS, **EXIT)
    assert texts == lm.preprocessor.generate_postprocess(ids, prompts)
    assert lm.generate(TEXTS[0], **EXIT) == texts[0]


@pytest.mark.parametrize("exit_rule", [EXIT, {}], ids=["criterion", "every_layer"])
def test_text_with_exit_layers(lm, tokenizer, exit_rule):
    texts, layers = lm.generate(TEXTS, return_exit_layers=True, **exit_rule)
    prompts, (ids, expected) = ids_path(lm, tokenizer, TEXTS, return_exit_layers=True,
                                        **exit_rule)
    assert texts == lm.preprocessor.generate_postprocess(ids, prompts)
    assert layers == expected
    for prompt, row, row_layers in zip(prompts, ids, layers):
        assert len(row_layers) == len(row)
        assert set(row_layers[: len(prompt)]) == {0}  # prompt tokens read 0
        assert all(1 <= layer <= 2 for layer in row_layers[len(prompt):])
    if exit_rule:  # some tokens exit at the first layer
        assert any(1 in row for row in layers)
    else:  # every token runs every layer
        assert all(set(row[len(p):]) <= {2} for row, p in zip(layers, prompts))
    text, row_layers = lm.generate(TEXTS[1], return_exit_layers=True, **exit_rule)
    assert (text, row_layers) == (texts[1], layers[1])


def test_text_without_a_preprocessor_is_refused():
    bare = EarlyExitCausalLM(**SIZES)
    with pytest.raises(ValueError, match="Received: text prompts and preprocessor=None"):
        bare.generate(TEXTS, return_exit_layers=True, **EXIT)
