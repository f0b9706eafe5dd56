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
        if not is_text(inputs):
            return generate(self, inputs, *args, **kwargs)
        arguments = signature.bind(self, inputs, *args, **kwargs).arguments
        prompts = text_prompts(self, inputs, arguments)
        arguments["inputs"] = prompts
        outputs = generate(**arguments)
        others = None
        if isinstance(outputs, tuple):
            outputs, *others = outputs
        texts = self.preprocessor.generate_postprocess(outputs, prompts)
        if isinstance(inputs, (str, bytes)):
            texts = texts[0]
            others = None if others is None else [rows[0] for rows in others]
        return texts if others is None else (texts, *others)

    return wrapper


def text_prompts(model, inputs, arguments):
    """The id lists of text prompts (`model.preprocessor.generate_preprocess`), with the
    text defaults filled into `arguments` (the call's arguments by name, changed in place):
    `max_length` is the preprocessor's `generation_length` unless the call names it or
    `max_new_tokens`; `stop_token_ids` left at `"auto"` (or not given) on a model without
    stop ids of its own is the tokenizer's end token. A `ValueError` without a
    preprocessor."""
    preprocessor = model.preprocessor
    if preprocessor is None:
        raise ValueError(
            f"{type(model).__name__}.generate and stream take text only with a preprocessor "
            "(preprocessor=, or a folder with tokenizer.json): pass token ids, or give the "
            "model one. Received: text prompts and preprocessor=None"
        )
    prompts = preprocessor.generate_preprocess(inputs)
    if arguments.get("max_length") is None and arguments.get("max_new_tokens") is None:
        arguments["max_length"] = preprocessor.generation_length
    end = preprocessor.tokenizer.end_token_id
    if (arguments.get("stop_token_ids", "auto") == "auto" and not model.stop_token_ids
            and end is not None):
        arguments["stop_token_ids"] = (end,)
    return prompts


class TextPieces:
    """Generated rows decoded as they grow, handed over as the text each step adds.

    Each row is decoded whole (its prompt included, by the preprocessor's
    `generate_postprocess`, as `generate` decodes it) after every step, and the part past
    the text already handed over (at first, the prompt's own text) is the step's piece: a
    row still inside its prompt adds nothing. A decoding that ends in an unfinished
    character (U+FFFD, a byte-level token cut inside a UTF-8 sequence) is held back until
    a later token completes it, so the pieces joined are the decoded text.

    Args:
        preprocessor: the task's preprocessor.
        rows: the id lists the stream starts from (the prompts up to the stream's first
            position; for a seq2seq model, its decoder's start).
        prompts: the prompts' id lists, as `generate_postprocess` takes them.
        prompt_rows: the id lists whose text counts as handed over at the start: `prompts`
            for a causal LM, `rows` for a seq2seq model (whose prompts are its sources).
    """

    def __init__(self, preprocessor, rows, prompts, prompt_rows):
        self.preprocessor = preprocessor
        self.rows = [list(row) for row in rows]
        self.prompts = prompts
        self.sent = preprocessor.generate_postprocess([list(r) for r in prompt_rows], prompts)

    def _texts(self):
        return self.preprocessor.generate_postprocess(self.rows, self.prompts)

    def add(self, tokens):
        """Appends each row's token (`[B]`) and returns each row's new text."""
        for row, token in zip(self.rows, tokens):
            row.append(int(token))
        return self._pieces(final=False)

    def rest(self):
        """Whatever was held back, once the stream has ended."""
        return self._pieces(final=True)

    def _pieces(self, final):
        pieces = []
        for index, text in enumerate(self._texts()):
            sent = self.sent[index]
            ready = text.startswith(sent) and (final or not text.endswith("\ufffd"))
            pieces.append(text[len(sent):] if ready else "")
            if ready:
                self.sent[index] = text
        return pieces
