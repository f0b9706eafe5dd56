"""The text layer of `generate`: strings in, strings out, around the ids path.

Kept apart from `GenerativeTask.generate`, which stays a function of ids: a task with a
preprocessor turns text prompts into id lists (`generate_preprocess`), runs the same
`generate` on them, and turns the generated ids into text (`generate_postprocess`).
"""

import functools
import inspect

from keras_xf.preprocessing import is_text


def generates_text(generate):
    """Wraps a task's `generate` so that, when the task has a preprocessor, a string
    prompt gives a string and a list of prompts a list of strings.

    `max_length` defaults to the preprocessor's output length (`sequence_length`, or a
    seq2seq preprocessor's `decoder_sequence_length`) rather than the model's, unless the
    call gives `max_new_tokens`. When the call leaves `stop_token_ids` at `"auto"` and the
    model has no stop ids of its own (`model.stop_token_ids`, a checkpoint's end ids), text
    stops at the tokenizer's end token (keras-hub's behaviour). Every other argument reaches
    `generate` as given. Each text is
    cut at its first end token past its prompt and loses its padding and special tokens. Ids
    pass straight through; text without a preprocessor raises a `ValueError`.

    A `generate` that returns a tuple (the ids first, then results per row, such as
    `EarlyExitCausalLM`'s exit layers with `return_exit_layers=True`) gives a tuple: the text
    first, then the other results as that `generate` gives them for the prompts' id lists
    (a list per text, aligned with its generated ids; a single string's own row).
    """
    signature = inspect.signature(generate)

    @functools.wraps(generate)
    def wrapper(self, inputs, *args, **kwargs):
        preprocessor = self.preprocessor
        if not is_text(inputs):
            return generate(self, inputs, *args, **kwargs)
        if preprocessor is None:
            raise ValueError(
                f"{type(self).__name__}.generate takes text only with a preprocessor "
                "(preprocessor=, or a folder with tokenizer.json): pass token ids, or give the "
                "model one. Received: text prompts and preprocessor=None"
            )
        prompts = preprocessor.generate_preprocess(inputs)
        arguments = signature.bind(self, prompts, *args, **kwargs).arguments
        if arguments.get("max_length") is None and arguments.get("max_new_tokens") is None:
            arguments["max_length"] = preprocessor.generation_length
        end = preprocessor.tokenizer.end_token_id
        if ("stop_token_ids" not in arguments and not self.stop_token_ids
                and end is not None):
            arguments["stop_token_ids"] = (end,)
        outputs = generate(**arguments)
        others = None
        if isinstance(outputs, tuple):
            outputs, *others = outputs
        texts = preprocessor.generate_postprocess(outputs, prompts)
        if isinstance(inputs, (str, bytes)):
            texts = texts[0]
            others = None if others is None else [rows[0] for rows in others]
        return texts if others is None else (texts, *others)

    return wrapper
