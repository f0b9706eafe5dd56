"""Numpy oracle of early-exit language models (survey §5.6): every exit's logits of a
decoder, and greedy decoding with token-level adaptive depth.

A token that exits at layer `l` leaves the layers above it without a state of their own;
the survey fills them by duplicating the exit layer: `s^m = s^l` for `m > l`. Here no cache
is kept at all: each layer's keys and values are recomputed from the stored inputs of that
layer at every earlier position, which for an exited token is its exit state. This is the
rule the library's cached decoding must reproduce.

A layer is a dict: `placement` (`"pre"` or `"post"`), `norm1`, `norm2` (functions on
`[..., d]`), `attention` (the weights of `attention.multi_head_attention`), `num_heads` and
`ffn` (the arguments `w_h, b_h, w_f, b_f` of `layers.ffn`, ReLU). Everything is float64.
"""

import numpy as np

from tests.reference import attention as ref_attention
from tests.reference import early_exit as ref_exit
from tests.reference import layers as ref_layers


def decoder_layer(layer, inputs, position):
    """The layer's output at `position` given its inputs `[T, d]` at positions
    `0 … position` (causal self-attention, then the feedforward)."""
    pre = layer["placement"] == "pre"
    context = inputs[: position + 1]
    keys = layer["norm1"](context) if pre else context
    attended = ref_attention.multi_head_attention(
        keys[None, -1:], keys[None], layer["attention"], layer["num_heads"])[0][0, 0]
    x = inputs[position]

    def ffn(h):
        return ref_layers.ffn(h, *layer["ffn"], activation=ref_layers.relu)

    if pre:
        h = x + attended
        return h + ffn(layer["norm2"](h))
    h = layer["norm1"](x + attended)
    return layer["norm2"](h + ffn(h))


def exit_logits(embedded, layers, final_norm, heads, exit_layers):
    """Every exit's logits `[E, T, V]` of one sequence `embedded` `[T, d]`: the full causal
    pass, `heads[e](final_norm(s^l))` at exit `e` on layer `l`."""
    states, logits = embedded, []
    for number, layer in enumerate(layers, 1):
        states = np.stack([decoder_layer(layer, states, j) for j in range(len(states))])
        if number in exit_layers:
            logits.append(heads[len(logits)](final_norm(states)))
    return np.stack(logits)


def exits_here(criterion, threshold, logits, state, previous_state, count):
    """Whether a token may stop at this exit (`count`: the run of unchanged predictions)."""
    if criterion == "entropy":
        return ref_exit.entropy(logits) <= threshold
    if criterion == "max_probability":
        return ref_exit.max_probability(logits) >= threshold
    if criterion == "state_similarity":
        return ref_exit.cosine(state, previous_state) >= threshold
    return count >= threshold


def adaptive_greedy_decode(prompt, max_length, embed, layers, final_norm, heads, exit_layers,
                           criterion, threshold):
    """Greedy decoding of one row with token-level adaptive depth.

    The token at position `j` predicts position `j + 1`; inside the prompt it runs every
    layer, otherwise it stops at the first exit where `criterion` holds (the last exit
    always stops; `criterion=None`: never earlier) and its exit state fills the layers
    above. Returns `(tokens [max_length], exit layer per position)`, 0 on prompt positions.

    Args:
        prompt: list of ids; embed: `ids [n] -> [n, d]`, positions from 0;
        heads: one function `[..., d] -> [..., V]` per exit; final_norm: a function.
    """
    tokens = list(prompt)
    exit_of = [0] * max_length
    inputs = [[] for _ in layers]  # inputs[m][j]: the input of layer m + 1 at position j
    for j in range(max_length - 1):
        x = embed(np.asarray(tokens))[j]
        adaptive = j + 1 >= len(prompt)
        previous_state, previous_logits, count = final_norm(x), None, 0
        for number, layer in enumerate(layers, 1):
            inputs[number - 1].append(x)
            x = decoder_layer(layer, np.stack(inputs[number - 1]), j)
            if number not in exit_layers:
                continue
            e = exit_layers.index(number)
            state = final_norm(x)
            logits = heads[e](state)
            if e:
                same = logits.argmax() == previous_logits.argmax()
                count = count + 1 if same else 0
            stop = number == len(layers) or (
                adaptive and criterion is not None
                and exits_here(criterion, threshold, logits, state, previous_state, count))
            previous_state, previous_logits = state, logits
            if stop:
                for above in inputs[number:]:
                    above.append(x)  # the exit state, copied upward
                break
        if adaptive:
            tokens.append(int(logits.argmax()))
            exit_of[j + 1] = number
    return np.asarray(tokens), np.asarray(exit_of)
