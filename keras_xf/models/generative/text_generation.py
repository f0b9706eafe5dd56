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
    seq2seq preprocessor's `decoder_sequence_length`) rather than the model's. While
    `generate`'s own default for `stop_token_ids` is `None`, text stops at the tokenizer's end
    token unless the call names its stop ids (keras-hub's behaviour); a `generate` with
    another default keeps it. Every other argument reaches `generate` as given. Each text is
    cut at its first end token past its prompt and loses its padding and special tokens. Ids
    pass straight through; text without a preprocessor raises a `ValueError`.

    A `generate` that returns a tuple (the ids first, then results per row, such as
    `EarlyExitCausalLM`'s exit layers with `return_exit_layers=True`) gives a tuple: the text
    first, then the other results as that `generate` gives them for the prompts' id lists
    (a list per text, aligned with its generated ids; a single string's own row).
    """
    signature = inspect.signature(generate)
    stop_parameter = signature.parameters.get("stop_token_ids")
    stops_by_default = stop_parameter.default if stop_parameter is not None else ()

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
        if arguments.get("max_length") is None:
            arguments["max_length"] = preprocessor.generation_length
        end = preprocessor.tokenizer.end_token_id
        if "stop_token_ids" not in arguments and stops_by_default is None and end is not None:
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
