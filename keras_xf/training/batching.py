"""Turning token lists into padded batches with masks (survey §2.7, "batching and padding")."""

import numpy as np


def pack_sequences(sequences, sequence_length=None, pad_token_id=0, start_token_id=None,
                   end_token_id=None):
    """Pads token lists into `[N, L]` ids and a boolean padding mask (numpy).

    Optional start/end tokens are added around each sequence. Nothing is truncated: a
    sequence longer than `sequence_length` raises `ValueError`. For `tf.data` pipelines,
    keras-hub's `StartEndPacker` does the same in-graph.

    Returns:
        `(token_ids, padding_mask)`.
    """
    rows = []
    for sequence in sequences:
        row = list(sequence)
        if start_token_id is not None:
            row = [start_token_id] + row
        if end_token_id is not None:
            row = row + [end_token_id]
        rows.append(row)
    longest = max((len(r) for r in rows), default=0)
    sequence_length = longest if sequence_length is None else sequence_length
    if longest > sequence_length:
        raise ValueError(
            f"A sequence is longer than sequence_length. Received: longest={longest}, "
            f"sequence_length={sequence_length}"
        )
    token_ids = np.full((len(rows), sequence_length), pad_token_id, dtype="int32")
    padding_mask = np.zeros((len(rows), sequence_length), dtype=bool)
    for index, row in enumerate(rows):
        token_ids[index, : len(row)] = row
        padding_mask[index, : len(row)] = True
    return token_ids, padding_mask


def language_model_examples(token_ids, sequence_length, stride=None):
    """Cuts a long id stream into next-token examples for `CausalLM.fit`.

    Returns `(x, y, sample_weight)` with `x = {"token_ids", "padding_mask"}` of shape
    `[N, sequence_length]`, `y` the ids shifted by one, and `sample_weight` all ones.
    """
    token_ids = np.asarray(token_ids, dtype="int32")
    stride = stride or sequence_length
    # A window needs sequence_length + 1 ids: starts 0 … len - sequence_length - 1 inclusive.
    starts = np.arange(0, len(token_ids) - sequence_length, stride)
    if len(starts) == 0:
        raise ValueError(
            f"The stream ({len(token_ids)} ids) is shorter than sequence_length + 1 "
            f"({sequence_length + 1})."
        )
    windows = np.stack([token_ids[s : s + sequence_length + 1] for s in starts])
    x = {"token_ids": windows[:, :-1], "padding_mask": np.ones_like(windows[:, :-1], dtype="int32")}
    return x, windows[:, 1:], np.ones_like(windows[:, 1:], dtype="float32")


def stream_examples(token_ids, batch_size, chunk_length):
    """Lays a long id stream out for a model that carries a memory from batch to batch
    (`MemoryAttention(stateful=True)`, survey §5.2.1).

    The stream is cut into `batch_size` contiguous rows, each of `n · chunk_length + 1` ids
    (the tail that does not fill a chunk is left out), and batch `k` holds chunk `k` of every
    row: row `b` of batch `k` continues row `b` of batch `k − 1`. Train with
    `fit(x, y, batch_size=batch_size, shuffle=False)`.

    Returns `(x, y, sample_weight)` as `language_model_examples`: `x = {"token_ids",
    "padding_mask"}` of shape `[n · batch_size, chunk_length]`, `y` the ids shifted by one.

    Example:
    >>> x, y, w = stream_examples(np.arange(100), batch_size=2, chunk_length=8)
    >>> x["token_ids"][2:4, 0]  # batch 1 continues batch 0 in each row
    array([ 8, 58], dtype=int32)
    """
    token_ids = np.asarray(token_ids, dtype="int32")
    for name, value in (("batch_size", batch_size), ("chunk_length", chunk_length)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    chunks = (len(token_ids) // batch_size - 1) // chunk_length
    if chunks < 1:
        raise ValueError(
            f"The stream ({len(token_ids)} ids) is too short for {batch_size} rows of one "
            f"chunk each: it needs batch_size * (chunk_length + 1) = "
            f"{batch_size * (chunk_length + 1)} ids."
        )
    row_length = len(token_ids) // batch_size
    rows = token_ids[: batch_size * row_length].reshape(batch_size, row_length)
    rows = rows[:, : chunks * chunk_length + 1]
    inputs = rows[:, :-1].reshape(batch_size, chunks, chunk_length).transpose(1, 0, 2)
    labels = rows[:, 1:].reshape(batch_size, chunks, chunk_length).transpose(1, 0, 2)
    inputs = inputs.reshape(-1, chunk_length)
    labels = labels.reshape(-1, chunk_length)
    x = {"token_ids": inputs, "padding_mask": np.ones_like(inputs, dtype="int32")}
    return x, labels, np.ones_like(labels, dtype="float32")


def seq2seq_examples(sources, targets, source_length=None, target_length=None, pad_token_id=0,
                     start_token_id=1, end_token_id=2):
    """Teacher-forcing examples for `Seq2SeqLM.fit` from lists of source and target ids.

    The decoder input is `[start] + target`, the label is `target + [end]`.

    Returns `(x, y, sample_weight)`.
    """
    encoder_ids, encoder_mask = pack_sequences(sources, source_length, pad_token_id)
    decoder_ids, decoder_mask = pack_sequences(
        targets, None if target_length is None else target_length, pad_token_id,
        start_token_id=start_token_id,
    )
    labels, label_mask = pack_sequences(
        targets, decoder_ids.shape[1], pad_token_id, end_token_id=end_token_id
    )
    x = {
        "encoder_token_ids": encoder_ids,
        "encoder_padding_mask": encoder_mask.astype("int32"),
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": decoder_mask.astype("int32"),
    }
    return x, labels, label_mask.astype("float32")
