"""Sequence-level knowledge distillation: a training set from the teacher's outputs (survey §5.7)."""

from typing import Protocol
from typing import runtime_checkable

import numpy as np

from keras_xf.ops.checks import check_positive_int


@runtime_checkable
class SequenceGenerator(Protocol):
    """What sequence distillation asks of its teacher: a keras_xf generating task
    (`GenerativeTask`: `Seq2SeqLM`, `CausalLM`, ...), named by its interface because the
    training package sits below the models."""

    prompt_keys: tuple
    pad_token_id: int

    def generate(self, inputs, max_length=None, stop_token_ids=None, sampler=None):
        """The ids of `inputs`' outputs, `[B, max_length]`."""


def sequence_distillation_data(teacher, inputs, max_length, stop_token_ids=None,
                               sampler="beam", batch_size=64):
    """Teacher-forcing examples `(x, y, sample_weight)` whose targets are the teacher's
    outputs: `{(x_k, ỹ_k)}` with `ỹ_k` the teacher's translation of `x_k` (survey §5.7,
    Kim and Rush, 2016).

    The teacher (a keras_xf generating task: `Seq2SeqLM`, `CausalLM`, …) decodes every
    input with `sampler` (`"beam"`, keras-hub's beam search, by default; `"greedy"` or any
    sampler `generate` accepts); its outputs become the data of ordinary training:
    the decoder input is the output shifted right (`[start] + ỹ`, or prompt + continuation
    for a `CausalLM`), the label the output shifted left (`ỹ + [end]`), and the weight 1 on
    the positions up to and including the first stop token, 0 on padding. This is the
    layout of `seq2seq_examples` and `language_model_examples`, so the student trains on
    it with `fit` like on any data (alone, or in a `Distiller`).

    Args:
        teacher: a `GenerativeTask`.
        inputs: a dict of numpy arrays: the conditioning inputs (`encoder_token_ids`,
            `encoder_padding_mask` for a `Seq2SeqLM`) and/or the prompt ids and mask
            (`token_ids`, `padding_mask` for a `CausalLM`, padded to `max_length`).
        max_length: int, the length of the teacher's outputs (start token included).
        stop_token_ids: optional ids that end an output.
        sampler: a sampler or its name.
        batch_size: int, inputs decoded per call of `generate`.

    Returns:
        `(x, y, sample_weight)`: `x` the input dict with the prompt ids and mask replaced by
        the shifted outputs `[N, max_length − 1]`, `y` int32 `[N, max_length − 1]`,
        `sample_weight` float32 `[N, max_length − 1]`.
    """
    if not isinstance(teacher, SequenceGenerator):
        raise ValueError(
            "teacher must be a keras_xf generating task (Seq2SeqLM, CausalLM, ...). "
            f"Received: teacher={type(teacher).__name__}"
        )
    max_length = check_positive_int("max_length", max_length, minimum=2)
    batch_size = check_positive_int("batch_size", batch_size)
    if not isinstance(inputs, dict) or not inputs:
        raise ValueError(f"inputs must be a non-empty dict of arrays. Received: {type(inputs)}")
    inputs = {key: np.asarray(value) for key, value in inputs.items()}
    count = {value.shape[0] for value in inputs.values()}
    if len(count) != 1:
        raise ValueError(
            "inputs must share their batch size. Received: "
            f"{ {key: value.shape for key, value in inputs.items()} }"
        )
    count = count.pop()
    ids_key, mask_key = teacher.prompt_keys
    token_ids, padding_mask = [], []
    batch_size = min(batch_size, count)
    for start in range(0, count, batch_size):
        # The last batch is filled up with copies of its first row: every call has one
        # shape, so one compiled decoding loop serves them all.
        rows = np.arange(start, start + batch_size)
        taken = min(batch_size, count - start)
        rows[taken:] = start
        batch = {key: value[rows] for key, value in inputs.items()}
        outputs = teacher.generate(batch, max_length=max_length, stop_token_ids=stop_token_ids,
                                   sampler=sampler)
        token_ids.append(np.asarray(outputs[ids_key])[:taken])
        padding_mask.append(np.asarray(outputs[mask_key]).astype(bool)[:taken])
    token_ids, padding_mask = np.concatenate(token_ids), np.concatenate(padding_mask)
    # Input position t predicts label t + 1: both are real when the label is.
    weights = padding_mask[:, 1:]
    x = {key: value for key, value in inputs.items() if key not in teacher.prompt_keys}
    x[ids_key] = np.where(weights, token_ids[:, :-1], teacher.pad_token_id).astype("int32")
    x[mask_key] = weights.astype("int32")
    y = np.where(weights, token_ids[:, 1:], teacher.pad_token_id).astype("int32")
    return x, y, weights.astype("float32")
