"""Exit criteria of early-exit models (survey §5.6, conditional computation).

At each exit `l` a classifier gives `p^l = Softmax(s^l · W_o^l)`; the computation stops for
an input once a criterion on the predictions or states so far says that more layers would
not change the answer. Every function here works on a batch, row by row, in float32, and
returns per-row values, so that the decision compiles (no Python branch on a tensor).

- `prediction_entropy`: `H(p^l) = −Σ_k p_k log p_k`; exit when it is at most a threshold
  (a confident, peaked distribution; DeeBERT's rule).
- `max_probability`: `max_k p_k`; exit when it is at least a threshold.
- `state_similarity`: the cosine of two consecutive exits' states `s^{l−1}`, `s^l`; exit when
  it is at least a threshold (the representation has converged).
- `unchanged_predictions`: how many consecutive exits kept the same prediction; exit when it
  reaches the patience `k` (PABEE's rule).
- `stop_by_margin`: the stop / non-stop rule of early-exit generation,
  `Pr(stop|s_i) ≥ Pr(nonstop|s_i) + θ_stop`, i.e. `Pr(stop|s_i) ≥ (1 + θ_stop) / 2`.
- `stop_labels`: the training labels of that rule's classifier `f_stop`, read off token
  sequences: position `i` is "stop" where the sequence ends at `i`.
"""

import numbers

from keras import ops

EXIT_CRITERIA = ("entropy", "max_probability", "state_similarity", "patience")


def check_exit_rule(criterion, threshold, criterion_name="criterion",
                    threshold_name="threshold"):
    """Raises a `ValueError` naming the argument unless `criterion` is one of
    `EXIT_CRITERIA` and `threshold` suits it (an int `k ≥ 1` for `"patience"`, a real number
    otherwise); returns `(criterion, threshold)`."""
    if criterion not in EXIT_CRITERIA:
        raise ValueError(f"{criterion_name} must be one of {EXIT_CRITERIA}. Received: "
                         f"{criterion_name}={criterion!r}")
    if criterion == "patience":
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Integral) or (
                threshold < 1):
            raise ValueError(
                f"{threshold_name} must be an int >= 1 (the patience) with {criterion_name}="
                f"'patience'. Received: {threshold_name}={threshold!r}"
            )
        return criterion, int(threshold)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise ValueError(f"{threshold_name} must be a number. Received: "
                         f"{threshold_name}={threshold!r}")
    return criterion, float(threshold)


def prediction_entropy(logits):
    """`H(Softmax(logits))` in nats over the last axis, float32 `[...]`."""
    logits = ops.cast(logits, "float32")
    log_probabilities = ops.log_softmax(logits, axis=-1)
    return -ops.sum(ops.exp(log_probabilities) * log_probabilities, axis=-1)


def max_probability(logits):
    """`max_k Softmax(logits)_k` over the last axis, float32 `[...]`."""
    return ops.max(ops.softmax(ops.cast(logits, "float32"), axis=-1), axis=-1)


def state_similarity(states, previous_states, epsilon=1e-8):
    """The cosine of `states` and `previous_states` (`[..., d]`) over the last axis,
    float32 `[...]`; zero vectors have similarity 0."""
    a = ops.cast(states, "float32")
    b = ops.cast(previous_states, "float32")
    norms = ops.sqrt(ops.sum(a * a, axis=-1) * ops.sum(b * b, axis=-1))
    return ops.sum(a * b, axis=-1) / ops.maximum(norms, epsilon)


def unchanged_predictions(logits, previous_logits, count):
    """`count + 1` where the argmax of `logits` equals that of `previous_logits`, else 0
    (int32 `[...]`): the run of exits that kept their prediction."""
    same = ops.equal(ops.argmax(logits, axis=-1), ops.argmax(previous_logits, axis=-1))
    return ops.where(same, ops.cast(count, "int32") + 1, 0)


def exit_decision(criterion, threshold, logits, states, previous_logits, previous_states,
                  count, first):
    """`(exits, count)`: whether each row may stop at this exit under `criterion`, and the
    updated run of unchanged predictions.

    Args:
        criterion: one of `EXIT_CRITERIA`.
        threshold: the criterion's threshold (for `"patience"`, the patience `k`).
        logits: `[B, C]` this exit's logits.
        states: `[B, d]` this exit's (pooled) states.
        previous_logits, previous_states: the same at the previous exit (ignored at the
            first exit for `"patience"`; at the first exit `previous_states` are the
            embeddings' pooled states).
        count: int32 `[B]`, the run of unchanged predictions up to the previous exit.
        first: Python bool, whether this is the first exit (no earlier prediction).
    """
    if first:
        count = ops.zeros_like(ops.cast(count, "int32"))
    else:
        count = unchanged_predictions(logits, previous_logits, count)
    if criterion == "entropy":
        exits = prediction_entropy(logits) <= threshold
    elif criterion == "max_probability":
        exits = max_probability(logits) >= threshold
    elif criterion == "state_similarity":
        exits = state_similarity(states, previous_states) >= threshold
    else:
        exits = count >= threshold
    return exits, count


def stop_by_margin(stop_probability, margin):
    """Whether to stop: `Pr(stop) ≥ Pr(nonstop) + θ_stop` with `Pr(nonstop) = 1 − Pr(stop)`
    (survey Eq. of the simple early stop), bool with the shape of `stop_probability`."""
    p = ops.cast(stop_probability, "float32")
    return p >= (1.0 - p) + margin


def stop_labels(token_ids, padding_mask=None, end_token_id=None):
    """The stop / non-stop labels of a stop classifier `Pr(c | s_i)` (survey §5.6) on
    sequences `token_ids [B, T]`.

    Position `i` is "stop" (1) where the sequence ends at `i`: the next position holds
    `end_token_id` or is padding. The positions that belong to a sequence are its real tokens
    (`padding_mask`) before its first `end_token_id`: only they carry a label, so the end
    token, what follows it and padding are left out of the loss (a classifier stops a row
    instead of generating an end token). A sequence that fills the width is cut, not ended:
    its last position is "nonstop".

    Args:
        token_ids: int `[B, T]`.
        padding_mask: optional bool or int `[B, T]`, true on real tokens (default: all).
        end_token_id: optional int, the id that ends a sequence.

    Returns:
        `(labels, counted)`: float32 `[B, T]` labels in {0, 1}, and bool `[B, T]`, true at
        the positions that belong to a sequence (the loss weights).
    """
    token_ids = ops.convert_to_tensor(token_ids)
    real = (ops.ones_like(token_ids, dtype="bool") if padding_mask is None
            else ops.cast(padding_mask, "bool"))
    if end_token_id is None:
        is_end = ops.zeros_like(real)
    else:
        is_end = ops.logical_and(real, ops.equal(token_ids, ops.cast(end_token_id, token_ids.dtype)))
    ended = ops.cumsum(ops.cast(is_end, "int32"), axis=-1) > 0
    counted = ops.logical_and(real, ops.logical_not(ended))
    # Whether position i + 1 ends the sequence; the position past the last column does not.
    ends = ops.logical_or(is_end, ops.logical_not(real))
    next_ends = ops.concatenate([ends[:, 1:], ops.zeros_like(ends[:, :1])], axis=1)
    labels = ops.logical_and(counted, next_ends)
    return ops.cast(labels, "float32"), counted
