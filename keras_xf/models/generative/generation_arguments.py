"""Checks of `GenerativeTask.generate`'s arguments: stop ids, prompt ids, the output length,
the repetition penalty, the stop classifier and its margin. Each raises a `ValueError` naming
the argument, what it expects and what it got."""

import numpy as np

from keras_xf.generation.prompts import NewTokens
from keras_xf.generation.prompts import bucket_length
from keras_xf.generation.prompts import pad_to_width
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.layers.heads.stop_classifier import StopClassifier
from keras_xf.models.backbones.arguments import check_token_ids


def output_length_request(max_length, max_new_tokens):
    """What `pack_prompts` takes as `max_length`: `max_length` itself, or `NewTokens` for
    `max_new_tokens`; both given raise."""
    if max_new_tokens is None:
        return max_length
    if max_length is not None:
        raise ValueError(
            "Give max_length (the output length) or max_new_tokens (tokens after the longest "
            f"prompt), not both. Received: max_length={max_length!r}, "
            f"max_new_tokens={max_new_tokens!r}"
        )
    return NewTokens(max_new_tokens)


def check_generate_inputs(ids_key, prompts, extras, embeddings):
    """Before anything compiles: every extra input has the prompts' batch size, prompt ids
    (`ids_key`, a `PackedPrompts`) are in the vocabulary of `embeddings` (the output
    embedding), and the output fits its learned position table."""
    batch_size = prompts.token_ids.shape[0]
    for name, value in extras.items():
        if value.shape[0] != batch_size:
            raise ValueError(
                f"{name} and {ids_key} need the same batch size. Received: "
                f"{name}.shape={value.shape} for {batch_size} prompts"
            )
    check_token_ids(ids_key, prompts.token_ids[prompts.padding_mask], embeddings.vocabulary_size)
    check_output_length(prompts.token_ids.shape[1], embeddings)


def bucketed_inputs(prompts, extras, keys, pad_token_id, max_sequence_length):
    """The packed prompts widened to their output length's bucket (`bucket_length`, capped at
    `max_sequence_length`; pad ids outside the prompt mask) under `keys`, and the extra
    inputs as they are."""
    width = bucket_length(prompts.token_ids.shape[1], max_sequence_length)
    return {keys[0]: pad_to_width(prompts.token_ids, width, pad_token_id),
            keys[1]: pad_to_width(prompts.padding_mask, width, False), **extras}


def check_output_length(length, embeddings):
    """An output of `length` positions must fit a learned position table (sinusoidal,
    rotary and no positions are unbounded)."""
    if not isinstance(embeddings, TokenAndPositionEmbedding) or embeddings.position != "learned":
        return
    longest = embeddings.max_sequence_length - embeddings.position_offset
    if length > longest:
        raise ValueError(
            f"max_length must be at most {longest}: the model's learned position table has "
            f"{embeddings.max_sequence_length} rows (position offset "
            f"{embeddings.position_offset}). Received: an output length of {length} (max_length "
            "or the longest prompt plus max_new_tokens)"
        )


def check_repetition_penalty(repetition_penalty):
    """`None`, or a positive number as a float."""
    if repetition_penalty is None:
        return None
    if isinstance(repetition_penalty, bool) or not isinstance(
            repetition_penalty, (int, float, np.integer, np.floating)) or repetition_penalty <= 0:
        raise ValueError("repetition_penalty must be a positive number (1: no penalty). "
                         f"Received: repetition_penalty={repetition_penalty!r}")
    return float(repetition_penalty)


def check_stop_token_ids(stop_token_ids, vocabulary_size):
    """A tuple of distinct ints in `[0, vocabulary_size)`, or `None` for none."""
    if stop_token_ids is None:
        return None
    values = stop_token_ids
    if isinstance(values, (int, np.integer)) or not isinstance(values, (list, tuple, np.ndarray)):
        values = [values]
    ids = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
            0 <= value < vocabulary_size
        ):
            raise ValueError(
                f"stop_token_ids must be ids in [0, {vocabulary_size}). Received: "
                f"stop_token_ids={stop_token_ids!r}"
            )
        ids.append(int(value))
    return tuple(dict.fromkeys(ids)) or None


def check_stop_margin(stop_classifier, stop_margin):
    """`stop_margin` as a float: a number in [-1, 1], other than 0 only with a
    `stop_classifier`."""
    margin_ok = isinstance(stop_margin, (int, float, np.floating)) and not isinstance(
        stop_margin, bool) and -1.0 <= stop_margin <= 1.0
    if not margin_ok:
        raise ValueError(
            "stop_margin must be a number in [-1, 1] (a difference of two probabilities). "
            f"Received: stop_margin={stop_margin!r}"
        )
    if stop_classifier is None and stop_margin != 0.0:
        raise ValueError(
            "stop_margin needs a stop_classifier. Received: stop_classifier=None, "
            f"stop_margin={stop_margin!r}"
        )
    return float(stop_margin)


def build_stop_classifier(stop_classifier, width):
    """Checks that `stop_classifier` is a `StopClassifier` for states of `width`, building it
    for that width when it is not built yet; returns it."""
    if not isinstance(stop_classifier, StopClassifier):
        raise ValueError(
            "stop_classifier must be a keras_xf.layers.StopClassifier. Received: "
            f"stop_classifier={type(stop_classifier).__name__}"
        )
    if not stop_classifier.built:
        stop_classifier.build((None, None, width))
    if stop_classifier.input_dim != width:
        raise ValueError(
            f"stop_classifier must read states of the model's width {width}. Received: "
            f"stop_classifier built for width {stop_classifier.input_dim}"
        )
    return stop_classifier
