"""Prompt packing for generation: plain prompts or keras-hub style dicts to padded batches.

One input contract for every generating task: a dict with token ids and an optional padding
mask, a padded 2-D array (or a 1-D array, one prompt), and a list of lists (ragged prompts)
describe the same prompts. Without a mask, entries equal to `pad_token_id` in an array are
padding; in a list every entry is a token.
"""

import numpy as np
from keras import ops


class NewTokens:
    """An output length given as a count of new tokens: the longest prompt's length plus
    `count` (`generate(max_new_tokens=...)`); `pack_prompts` takes it as `max_length`."""

    def __init__(self, count):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"max_new_tokens must be a positive int. Received: "
                             f"max_new_tokens={count!r}")
        self.count = int(count)


def bucket_length(length, cap=None, smallest=8):
    """The compile bucket of an output length: the smallest power of two `>= length` (at
    least `smallest`), no larger than `cap` (the model's `max_sequence_length`) when `length`
    fits under it. Outputs padded to their bucket share one compiled program."""
    bucket = max(smallest, 1 << max(int(length) - 1, 0).bit_length())
    if cap is not None and length <= cap:
        bucket = min(bucket, cap)
    return bucket


def pad_to_width(array, width, value):
    """A `[B, W]` numpy array padded on the right with `value` to `[B, width]`."""
    return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=value)


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
    def shortest(self):
        """The shortest prompt's length (an int)."""
        return int(self.padding_mask.sum(axis=1).min())

    def prefill_length(self, width, in_order=False):
        """How many leading positions one parallel pass writes into the cache before the
        decoding loop starts at the shortest prompt's end (`generate_step`'s
        `prefill_length`), for inputs widened to `width`.

        A cache addressed by position (attention's keys and values): the shortest prompt's
        length rounded up to a power of two, at most `width`. The pass runs past the shorter
        prompts' ends; the loop writes each of those positions again before any query reads
        it. Feeding the rest of the prompt one token at a time instead would cost a whole
        decoding step, every weight read once, per token. A cache written in order
        (`in_order`: a recurrent state sees each token once, a rolling cache keeps only the
        latest positions) gets the length rounded down instead, and the loop feeds the tokens
        after it. Rounding keeps the compiled programs few (one per power of two).
        """
        # In NumPy: `prefill_length` in backend ops would compile its eager ops once per
        # prompt width on JAX (a tenth of a second a call, for a count).
        shortest = self.shortest
        if in_order:
            return 1 << (shortest.bit_length() - 1)
        return min(bucket_length(shortest), width)

    def unpack(self, token_ids, padding_mask, form=None, keys=("token_ids", "padding_mask")):
        """Results in the structure the prompts came in (or in `form`); a dict result uses
        `keys`."""
        token_ids = np.asarray(ops.convert_to_numpy(token_ids))
        padding_mask = np.asarray(ops.convert_to_numpy(padding_mask)).astype(bool)
        form = form or self.form
        if form == "dict":
            return {keys[0]: token_ids, keys[1]: padding_mask}
        if form == "single":
            return token_ids[0][padding_mask[0]]
        if form == "list":
            return [row[mask].tolist() for row, mask in zip(token_ids, padding_mask)]
        return token_ids


def check_keys(inputs, allowed, required=()):
    """Raises a `ValueError` for a dict of generation inputs with unknown or missing keys."""
    unknown = sorted(set(inputs) - set(allowed))
    missing = [key for key in required if key not in inputs]
    if unknown or missing:
        raise ValueError(
            f"inputs must be a dict with keys among {list(allowed)} (required: "
            f"{list(required)}). Received: keys {sorted(inputs)}"
        )


def _array(value, name, dtype):
    try:
        return np.asarray(ops.convert_to_numpy(value)).astype(dtype)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{name} must be an array of {dtype} or a list of them. Received: {name}={value!r}"
        ) from error


def _left_align(token_ids, padding_mask, name):
    """Moves each row's prompt to start at column 0 (left-padded prompts become right-padded)."""
    aligned_ids = np.zeros_like(token_ids)
    aligned_mask = np.zeros_like(padding_mask)
    for row, (ids, mask) in enumerate(zip(token_ids, padding_mask)):
        tokens = ids[mask]
        if tokens.size and not np.array_equal(np.flatnonzero(mask), np.arange(len(tokens)) + np.argmax(mask)):
            raise ValueError(
                f"Each row of {name} must hold one contiguous prompt (padding before or after "
                f"it). Received a row whose prompt mask is {mask.astype(int).tolist()}"
            )
        aligned_ids[row, : len(tokens)] = tokens
        aligned_mask[row, : len(tokens)] = True
    return aligned_ids, aligned_mask


def _is_ragged(inputs):
    return isinstance(inputs, (list, tuple)) and len(inputs) > 0 and isinstance(
        inputs[0], (list, tuple, np.ndarray))


def pack_prompts(inputs, max_length=None, default_max_length=None, pad_token_id=0,
                 keys=("token_ids", "padding_mask")):
    """Packs prompts into a `PackedPrompts` of length `max_length`.

    Accepted forms, all describing the same prompts:
    - a dict with `keys[0]` (token ids `[B, W]`) and optionally `keys[1]` (a mask `[B, W]`
      marking the prompt; left or right padding); without the mask, `pad_token_id` entries
      are padding;
    - a 2-D array `[B, W]` of prompts padded with `pad_token_id` (left or right), or a 1-D
      array (one prompt, padding stripped likewise);
    - a list of lists (ragged prompts, every entry a token), or a list of ints (one prompt).

    `max_length` (an int, or `NewTokens(n)`: the longest prompt's length plus `n`) defaults
    to the dict's width, else to `default_max_length`, else to the packed width.

    Raises:
        ValueError, naming the argument: for empty prompts, prompts longer than
            `max_length`, a mask of another shape than the ids, ids of rank other than 2
            (1 for a single prompt), or a mask that is not one contiguous run per row.
            Nothing is truncated.
    """
    ids_name, mask_name = keys
    if isinstance(inputs, dict):
        if ids_name not in inputs:
            raise ValueError(f"A dict of prompts needs {ids_name!r}. Received: keys {sorted(inputs)}")
        token_ids = _array(inputs[ids_name], ids_name, "int32")
        if token_ids.ndim != 2:
            raise ValueError(
                f"{ids_name} must be 2-D [batch, length]. Received: {ids_name}.shape="
                f"{token_ids.shape}"
            )
        if mask_name in inputs and inputs[mask_name] is not None:
            mask = _array(inputs[mask_name], mask_name, bool)
            if mask.shape != token_ids.shape:
                raise ValueError(
                    f"{mask_name} must have the shape of {ids_name}. Received: {mask_name}."
                    f"shape={mask.shape}, {ids_name}.shape={token_ids.shape}"
                )
        else:
            mask = token_ids != pad_token_id
        form = "dict"
    elif _is_ragged(inputs):
        rows = [_array(row, ids_name, "int32") for row in inputs]
        for row in rows:
            if row.ndim != 1:
                raise ValueError(
                    f"A list of prompts must hold 1-D prompts. Received: a prompt of shape "
                    f"{row.shape} in {ids_name}"
                )
        width = max(len(row) for row in rows)
        token_ids = np.full((len(rows), width), pad_token_id, "int32")
        mask = np.zeros((len(rows), width), bool)
        for index, row in enumerate(rows):
            token_ids[index, : len(row)] = row
            mask[index, : len(row)] = True
        form = "list"
    else:
        array = _array(inputs, ids_name, "int32")
        if array.ndim not in (1, 2):
            raise ValueError(
                f"{ids_name} must be 2-D [batch, length] or one 1-D prompt. Received: "
                f"{ids_name}.shape={array.shape}"
            )
        form = "single" if array.ndim == 1 else "array"
        token_ids = array.reshape(1, -1) if array.ndim == 1 else array
        if isinstance(inputs, (list, tuple)):  # a list of ints: every entry a token
            mask = np.ones_like(token_ids, dtype=bool)
        else:
            mask = token_ids != pad_token_id
    token_ids, mask = _left_align(token_ids, mask, ids_name)

    lengths = mask.sum(axis=1)
    if token_ids.shape[0] == 0 or np.any(lengths == 0):
        raise ValueError(
            f"Every prompt in {ids_name} needs at least one token. Received lengths "
            f"{lengths.tolist()}"
        )
    if isinstance(max_length, NewTokens):
        max_length = int(lengths.max()) + max_length.count
    if max_length is None:
        max_length = token_ids.shape[1] if form == "dict" else default_max_length
    if max_length is None:
        max_length = token_ids.shape[1]
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or (
        max_length <= 0
    ):
        raise ValueError(f"max_length must be a positive int. Received: max_length={max_length!r}")
    if lengths.max() > max_length:
        raise ValueError(
            f"A prompt in {ids_name} is longer than max_length. Received: prompt lengths "
            f"{lengths.tolist()}, max_length={max_length}"
        )
    width = token_ids.shape[1]
    if width < max_length:
        token_ids = np.pad(token_ids, ((0, 0), (0, max_length - width)), constant_values=pad_token_id)
        mask = np.pad(mask, ((0, 0), (0, max_length - width)))
    token_ids, mask = token_ids[:, :max_length], mask[:, :max_length]
    return PackedPrompts(token_ids, mask, form)


def shortest_prompt(padding_mask):
    """The shortest prompt's length, an int32 scalar tensor (exported generation computes it
    from its inputs). `padding_mask` `[B, L]` marks left-aligned prompts."""
    return ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))


def output_padding_mask(token_ids, prompt_mask, stop_token_ids):
    """True on the prompt and on generated tokens up to and including the first stop token.

    `stop_token_ids`: a tuple of ids, `None`, or a 1-D int tensor (exported generation; it
    may be empty)."""
    if stop_token_ids is None or (isinstance(stop_token_ids, tuple) and not stop_token_ids):
        return ops.ones_like(token_ids, dtype="bool")
    stops = ops.cast(ops.convert_to_tensor(stop_token_ids), token_ids.dtype)
    is_stop = ops.any(ops.equal(token_ids[..., None], stops), axis=-1)
    generated = ops.logical_not(prompt_mask)
    stops = ops.cast(ops.logical_and(is_stop, generated), "int32")
    after_stop = ops.cumsum(stops, axis=-1) - stops
    return ops.logical_not(ops.cast(after_stop, "bool"))
