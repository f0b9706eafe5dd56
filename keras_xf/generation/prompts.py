"""Prompt packing for generation: plain prompts or keras-hub style dicts to padded batches."""

import numpy as np
from keras import ops


class PackedPrompts:
    """Left-aligned prompts `[B, L]` with a prompt mask, and how to give results back.

    Attributes:
        token_ids: int32 numpy `[B, L]`, each prompt starting at column 0.
        padding_mask: bool numpy `[B, L]`, True on prompt tokens.
        form: `"dict"`, `"array"` (2-D), `"single"` (one 1-D prompt) or `"list"` (ragged).
    """

    def __init__(self, token_ids, padding_mask, form):
        self.token_ids = token_ids
        self.padding_mask = padding_mask
        self.form = form

    @property
    def prefill_length(self):
        """How many leading positions one parallel pass fills into the cache before the
        decoding loop starts: the shortest prompt's length rounded down to a power of two.

        Every row has a prompt token at each of these positions. Rounding keeps the number of
        compiled programs small (one per power of two rather than one per prompt length); the
        remaining prompt tokens are fed one at a time by the loop, which keeps them.
        """
        shortest = int(self.padding_mask.sum(axis=1).min())
        return 1 << (shortest.bit_length() - 1)

    def unpack(self, token_ids, padding_mask):
        """Results in the structure the prompts came in."""
        token_ids = np.asarray(ops.convert_to_numpy(token_ids))
        padding_mask = np.asarray(ops.convert_to_numpy(padding_mask)).astype(bool)
        if self.form == "dict":
            return {"token_ids": token_ids, "padding_mask": padding_mask}
        if self.form == "single":
            return token_ids[0][padding_mask[0]]
        if self.form == "list":
            return [row[mask].tolist() for row, mask in zip(token_ids, padding_mask)]
        return token_ids


def _left_align(token_ids, padding_mask):
    """Moves each row's prompt to start at column 0 (left-padded prompts become right-padded)."""
    aligned_ids = np.zeros_like(token_ids)
    aligned_mask = np.zeros_like(padding_mask)
    for row, (ids, mask) in enumerate(zip(token_ids, padding_mask)):
        tokens = ids[mask]
        if not np.array_equal(np.flatnonzero(mask), np.arange(len(tokens)) + np.argmax(mask)):
            raise ValueError(
                "Each row of padding_mask must mark one contiguous prompt. Received a row "
                f"with mask {mask.astype(int).tolist()}"
            )
        aligned_ids[row, : len(tokens)] = tokens
        aligned_mask[row, : len(tokens)] = True
    return aligned_ids, aligned_mask


def pack_prompts(inputs, max_length=None, default_max_length=None, pad_token_id=0):
    """Packs prompts into a `PackedPrompts` of length `max_length`.

    Accepted forms: a dict with `token_ids` and `padding_mask` (keras-hub's form: ids padded to
    the output length, the mask marking the prompt; left or right padding), a 2-D array of
    equal-length prompts, a 1-D array or list (one prompt), or a list of lists (ragged).

    Raises:
        ValueError: for empty prompts, prompts longer than `max_length`, or a mask that is not
            one contiguous run per row. Nothing is truncated.
    """
    if isinstance(inputs, dict):
        if "token_ids" not in inputs:
            raise ValueError(f"A dict prompt needs 'token_ids'. Received keys: {sorted(inputs)}")
        token_ids = np.asarray(ops.convert_to_numpy(inputs["token_ids"])).astype("int32")
        if "padding_mask" in inputs:
            mask = np.asarray(ops.convert_to_numpy(inputs["padding_mask"])).astype(bool)
        else:
            mask = token_ids != pad_token_id
        token_ids, mask = _left_align(token_ids, mask)
        form = "dict"
    elif (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], (list, tuple, np.ndarray))):
        rows = [np.asarray(row, "int32").reshape(-1) for row in inputs]
        width = max(len(row) for row in rows)
        token_ids = np.full((len(rows), width), pad_token_id, "int32")
        mask = np.zeros((len(rows), width), bool)
        for index, row in enumerate(rows):
            token_ids[index, : len(row)] = row
            mask[index, : len(row)] = True
        form = "list"
    else:
        array = np.asarray(ops.convert_to_numpy(inputs)).astype("int32")
        form = "single" if array.ndim == 1 else "array"
        token_ids = array.reshape(1, -1) if array.ndim == 1 else array
        if token_ids.ndim != 2:
            raise ValueError(f"Prompts must be 1-D or 2-D. Received shape {array.shape}")
        mask = np.ones_like(token_ids, dtype=bool)

    lengths = mask.sum(axis=1)
    if np.any(lengths == 0):
        raise ValueError(f"Every prompt needs at least one token. Received lengths {lengths.tolist()}")
    if max_length is None:
        max_length = token_ids.shape[1] if form == "dict" else default_max_length
    if max_length is None:
        raise ValueError("max_length is required for these prompts.")
    if lengths.max() > max_length or token_ids.shape[1] > max_length and form == "dict" and (
        mask[:, max_length:].any()
    ):
        raise ValueError(
            f"A prompt is longer than max_length. Received: prompt lengths {lengths.tolist()}, "
            f"max_length={max_length}"
        )
    width = token_ids.shape[1]
    if width < max_length:
        token_ids = np.pad(token_ids, ((0, 0), (0, max_length - width)), constant_values=pad_token_id)
        mask = np.pad(mask, ((0, 0), (0, max_length - width)))
    token_ids, mask = token_ids[:, :max_length], mask[:, :max_length]
    return PackedPrompts(token_ids, mask, form)


def output_padding_mask(token_ids, prompt_mask, stop_token_ids):
    """True on the prompt and on generated tokens up to and including the first stop token."""
    if not stop_token_ids:
        return ops.ones_like(token_ids, dtype="bool")
    generated = ops.logical_not(prompt_mask)
    is_stop = ops.zeros_like(prompt_mask)
    for stop in stop_token_ids:
        is_stop = ops.logical_or(is_stop, ops.equal(token_ids, stop))
    stops = ops.cast(ops.logical_and(is_stop, generated), "int32")
    after_stop = ops.cumsum(stops, axis=-1) - stops
    return ops.logical_not(ops.cast(after_stop, "bool"))
