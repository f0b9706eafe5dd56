"""Numpy oracle of early exiting (survey §5.6): the exit criteria on an exit's prediction
`p^l = Softmax(logits)` and states, the summed exit losses, the stop/non-stop margin rule,
and the exit each input takes given every exit's logits and states."""

import numpy as np


def softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def entropy(logits):
    """`H(p) = −Σ_k p_k log p_k`."""
    p = softmax(np.asarray(logits, np.float64))
    return -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)


def max_probability(logits):
    return softmax(np.asarray(logits, np.float64)).max(axis=-1)


def cosine(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    norms = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    return (a * b).sum(-1) / np.maximum(norms, 1e-8)


def exit_losses(labels, logits, weights=None):
    """`Σ_e w_e · (−log p^e_y)` per example, logits `[B, E, C]`."""
    logits = np.asarray(logits, np.float64)
    log_p = np.log(softmax(logits))
    nll = -np.take_along_axis(log_p, np.asarray(labels)[:, None, None], axis=-1)[..., 0]
    weights = np.ones(logits.shape[1]) if weights is None else np.asarray(weights)
    return (nll * weights).sum(-1)


def stop_by_margin(stop_probability, margin):
    """`Pr(stop) ≥ Pr(nonstop) + θ_stop`."""
    p = np.asarray(stop_probability, np.float64)
    return p >= 1.0 - p + margin


def early_exits(logits, states, exit_layers, criterion, threshold):
    """The exit of every input: logits `[B, E, C]` and pooled states `[B, E + 1, d]` (the
    embeddings' first) of every exit; returns `(logits [B, C], exit_layer [B])`: the first
    exit where the criterion holds, the last exit otherwise."""
    batch, exits = logits.shape[:2]
    out_logits = np.zeros((batch, logits.shape[2]))
    out_layers = np.zeros(batch, int)
    for row in range(batch):
        count = 0
        for e in range(exits):
            if e:
                same = logits[row, e].argmax() == logits[row, e - 1].argmax()
                count = count + 1 if same else 0
            if criterion == "entropy":
                stop = entropy(logits[row, e]) <= threshold
            elif criterion == "max_probability":
                stop = max_probability(logits[row, e]) >= threshold
            elif criterion == "state_similarity":
                stop = cosine(states[row, e + 1], states[row, e]) >= threshold
            else:
                stop = count >= threshold
            if stop or e == exits - 1:
                out_logits[row], out_layers[row] = logits[row, e], exit_layers[e]
                break
    return out_logits, out_layers


def stop_labels(token_ids, padding_mask=None, end_token_id=None):
    """Per position: 1 where the sequence ends there (the next position holds the end id or
    is padding; a sequence filling the width is cut, not ended), and whether the position
    belongs to the sequence (a real token before the first end id)."""
    token_ids = np.asarray(token_ids)
    batch, length = token_ids.shape
    real = np.ones((batch, length), bool) if padding_mask is None else np.asarray(padding_mask, bool)
    labels = np.zeros((batch, length))
    counted = np.zeros((batch, length), bool)
    for row in range(batch):
        for i in range(length):
            if not real[row, i]:
                continue
            if end_token_id is not None and token_ids[row, i] == end_token_id:
                break
            counted[row, i] = True
            if i + 1 < length and (not real[row, i + 1] or token_ids[row, i + 1] == end_token_id):
                labels[row, i] = 1.0
    return labels, counted


def margin_stop_lengths(stop_probability, prompt_lengths, margin, stop_positions=None):
    """The output length of each row of a generation stopped by the margin rule, step by
    step: the rule reads `Pr(stop|s_i)` (`[B, L]`) at every generated position `i`, from the
    first (`prompt_lengths[b]`) on; the first where it holds is the row's last token. A stop
    token at `stop_positions[b]` (or -1 for none) ends the row there first if it comes
    earlier. Rows that never stop keep all `L` positions."""
    p = np.asarray(stop_probability, np.float64)
    batch, length = p.shape
    lengths = np.full(batch, length)
    for row in range(batch):
        for i in range(prompt_lengths[row], length):
            if stop_positions is not None and stop_positions[row] == i:
                lengths[row] = i + 1
                break
            if stop_by_margin(p[row, i], margin):
                lengths[row] = i + 1
                break
    return lengths


def stop_logits(states, weights):
    """The stop logit `z_i = w_o · relu(W_h s_i + b_h) + b_o` (or `w_o · s_i + b_o`) of each
    state `[..., d]`; `weights` lists `(kernel, bias)` of the hidden layer (if any), then of
    the output layer `[·, 1]`."""
    x = np.asarray(states, np.float64)
    for kernel, bias in weights[:-1]:
        x = np.maximum(x @ np.asarray(kernel, np.float64) + bias, 0.0)
    kernel, bias = weights[-1]
    return (x @ np.asarray(kernel, np.float64) + bias)[..., 0]


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))
