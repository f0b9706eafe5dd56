"""The `generation_config.json` that `to_huggingface` writes beside a generating model: the
ids `transformers`' `generate` starts, stops and pads with."""

from keras_xf.models import GenerativeTask
from keras_xf.models import Seq2SeqLM


def generation_config(model):
    """The `generation_config.json` of `model` as a dict, or `None` when there is none to
    write (a model that does not generate, or one without a preprocessor).

    The ids come from the preprocessor's tokenizer: `bos_token_id` its start token,
    `eos_token_id` its end token (the ids that end a row, as keras_xf's text generation
    stops there), `pad_token_id` the id packing pads with; a seq2seq model adds its
    `decoder_start_token_id`. A token the tokenizer does not name is left out.

    Args:
        model: a keras_xf task model.

    Returns:
        A dict of `transformers`' `GenerationConfig` fields, or `None`.

    Example:
    >>> from keras_xf.models import CausalLM
    >>> lm = CausalLM(vocabulary_size=64, num_layers=1, hidden_dim=8, num_heads=2,
    ...               intermediate_dim=16)
    >>> generation_config(lm) is None  # no preprocessor: no tokens to name
    True
    """
    if not isinstance(model, GenerativeTask) or model.preprocessor is None:
        return None
    tokenizer = model.preprocessor.tokenizer
    ids = {"bos_token_id": tokenizer.start_token_id, "eos_token_id": tokenizer.end_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    if isinstance(model, Seq2SeqLM):
        ids["decoder_start_token_id"] = model.start_token_id
    return {name: int(value) for name, value in ids.items() if value is not None}
