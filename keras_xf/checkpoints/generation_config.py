"""The `generation_config.json` that `to_huggingface` writes beside a generating model: the
ids `transformers`' `generate` starts, stops and pads with."""

from keras_xf.models import GenerativeTask
from keras_xf.models import Seq2SeqLM


def generation_config(model):
    """The `generation_config.json` of `model` as a dict, or `None` when there is none to
    write (a model that does not generate, or one with neither a preprocessor nor stop ids).

    `eos_token_id` holds the ids that end a row: the model's own stop ids
    (`model.stop_token_ids`, a checkpoint's end ids after `from_huggingface`; an int for
    one, a list for several), else its tokenizer's end token, as keras_xf's text generation
    stops. With a preprocessor, `bos_token_id` is the tokenizer's start token and
    `pad_token_id` the id packing pads with; a seq2seq model adds its
    `decoder_start_token_id`. A token the tokenizer does not name is left out.

    Args:
        model: a keras_xf task model.

    Returns:
        A dict of `transformers`' `GenerationConfig` fields, or `None`.

    Example:
    >>> from keras_xf.models import CausalLM
    >>> lm = CausalLM(vocabulary_size=64, num_layers=1, hidden_dim=8, num_heads=2,
    ...               intermediate_dim=16)
    >>> generation_config(lm) is None  # no preprocessor, no stop ids: nothing to name
    True
    >>> lm.stop_token_ids = [2, 3]
    >>> generation_config(lm)
    {'eos_token_id': [2, 3]}
    """
    if not isinstance(model, GenerativeTask):
        return None
    stops = [int(i) for i in model.stop_token_ids]
    ends = stops[0] if len(stops) == 1 else stops or None
    preprocessor = model.preprocessor
    if preprocessor is None:
        return None if ends is None else {"eos_token_id": ends}
    tokenizer = preprocessor.tokenizer
    ids = {"bos_token_id": tokenizer.start_token_id,
           "eos_token_id": ends if ends is not None else tokenizer.end_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    if isinstance(model, Seq2SeqLM):
        ids["decoder_start_token_id"] = model.start_token_id
    return {name: value if isinstance(value, list) else int(value)
            for name, value in ids.items() if value is not None}
