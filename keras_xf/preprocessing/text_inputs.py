"""Strings in, id lists and packed arrays out: what every tokenizer and preprocessor shares.

Packing is host-side NumPy: text is tokenized before any backend sees it, so the same
arrays reach TensorFlow, JAX and PyTorch.
"""

import numpy as np

from keras_xf.ops.checks import check_positive_int


def is_text(inputs):
    """Whether `inputs` is text: a string, or a non-empty list, tuple or NumPy array of
    strings (what a preprocessor takes and a task routes to it)."""
    if isinstance(inputs, (str, bytes)):
        return True
    if isinstance(inputs, np.ndarray):
        return inputs.size > 0 and (inputs.dtype.kind in "US" or (
            inputs.dtype == object and all(isinstance(v, (str, bytes)) for v in inputs.flat)))
    if isinstance(inputs, (list, tuple)):
        return len(inputs) > 0 and all(isinstance(v, (str, bytes)) for v in inputs)
    return False


def text_list(texts, name="texts"):
    """`texts` (a string, or a list, tuple or 1-D array of strings) as a list of `str`."""
    if not is_text(texts):
        raise ValueError(
            f"{name} must be a string or a non-empty list of strings. Received: {name} of type "
            f"{type(texts).__name__}"
        )
    if isinstance(texts, (str, bytes)):
        texts = [texts]
    rows = np.asarray(texts, dtype=object).reshape(-1).tolist()
    return [row.decode("utf-8") if isinstance(row, bytes) else row for row in rows]


def check_sequence_length(sequence_length, name="sequence_length"):
    """A positive int (the packed width)."""
    return check_positive_int(name, sequence_length)


def check_lengths(rows, sequence_length, name="sequence_length", received=None):
    """Raises a `ValueError` naming the first row longer than `sequence_length` (the room
    that the argument `name`, of value `received`, leaves): nothing is truncated unless
    truncation is asked for."""
    received = sequence_length if received is None else received
    for index, row in enumerate(rows):
        if len(row) > sequence_length:
            raise ValueError(
                f"Text {index} has {len(row)} tokens (special tokens included), more than the "
                f"{sequence_length} that {name}={received} allows; pass truncate=True to cut "
                f"it, or a larger {name}. Received: {name}={received}"
            )


def fit_rows(rows, sequence_length, truncate, keep_last=0, name="sequence_length",
             received=None):
    """Rows no longer than `sequence_length`: cut (keeping their last `keep_last` ids, e.g.
    an end token) when `truncate`, else a `ValueError` for the first that is longer (see
    `check_lengths`)."""
    if not truncate:
        check_lengths(rows, sequence_length, name, received)
        return [list(row) for row in rows]
    head = sequence_length - keep_last
    return [list(row) if len(row) <= sequence_length
            else list(row[:head]) + list(row[len(row) - keep_last:]) for row in rows]


def pack_rows(rows, sequence_length, pad_token_id):
    """Id lists right-padded into `{"token_ids", "padding_mask"}`, both int32
    `[len(rows), sequence_length]`; the mask is 1 on the ids, 0 on the padding."""
    check_lengths(rows, sequence_length)
    token_ids = np.full((len(rows), sequence_length), pad_token_id, "int32")
    padding_mask = np.zeros((len(rows), sequence_length), "int32")
    for index, row in enumerate(rows):
        token_ids[index, : len(row)] = row
        padding_mask[index, : len(row)] = 1
    return {"token_ids": token_ids, "padding_mask": padding_mask}


def unpadded_rows(ids):
    """Token ids to a list of id lists: a dict of ids with a mask (`token_ids` /
    `padding_mask`, or any `*token_ids` / `*padding_mask` pair) loses its padding; an array
    or a list of lists is kept whole; one 1-D row gives a list of one row."""
    if isinstance(ids, dict):
        key = next(k for k in ids if k.endswith("token_ids"))
        rows = np.asarray(ids[key])
        masks = np.asarray(ids[key[: -len("token_ids")] + "padding_mask"]).astype(bool)
        return [row[mask].tolist() for row, mask in zip(rows, masks)]
    if isinstance(ids, np.ndarray):
        ids = ids.tolist()
    ids = list(ids)
    if not ids:
        return [[]]
    if not isinstance(ids[0], (list, tuple, np.ndarray)):
        return [[int(i) for i in ids]]
    return [[int(i) for i in np.asarray(row).reshape(-1)] for row in ids]


def is_single_row(ids):
    """Whether `ids` is one row of ids (a 1-D array or a list of ints), not a batch."""
    if isinstance(ids, np.ndarray):
        return ids.ndim == 1
    return isinstance(ids, (list, tuple)) and (
        not ids or isinstance(ids[0], (int, np.integer)))
