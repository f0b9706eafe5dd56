"""Cross-entropy over an output projection, chunk by chunk over tokens (survey §2.7, §5.4).

A language model's loss `Σ_i w_i ℓ_i` with `ℓ_i = −log softmax(h_i Eᵀ)[y_i]` needs the logits
`Z = H Eᵀ` of every token, `[N, V]` in float32: for 2,048 tokens and 8,192 words that is 64 MB
before the softmax and its gradient double it. `chunked_cross_entropy` computes the same sum
and its gradients while only one `[chunk_size, V]` block of logits exists at a time.
"""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_token_mask
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import static_dim
from keras_xf.ops.time_loop import time_loop


def chunked_cross_entropy(hidden, table, labels, weights, chunk_size=1024, label_smoothing=0.0,
                          with_gradient=True):
    """`L = Σ_i w_i ℓ_i`, `ℓ_i = (1−ε)(lse(z_i) − z_{i,y_i}) + ε(lse(z_i) − (1/V) Σ_v z_{i,v})`,
    `z_i = h_i Eᵀ` in float32, computed over chunks of `chunk_size` tokens.

    The tokens (every axis of `hidden` but the last, flattened) are padded with rows of
    weight 0 to a multiple of `chunk_size` (not copied when they fit) and visited in a loop.
    For each chunk the logits `Z_c = H_c Eᵀ` are formed in the dtype of `table` and cast to
    float32 (as the plain output layer does), then to log-probabilities, whose target entry
    gives `ℓ`. With `with_gradient` the same pass also forms the gradient of `L`, from
    `∂L/∂Z_c = W_c (P_c − (1−ε) Y_c − ε/V)` (`W_c = diag(w_c)`, `P_c = softmax(Z_c)`,
    `Y_c` the one-hot labels) without forming it: only `P_c` is a `[C, V]` block,

        ∂L/∂H_c = W_c (P_c E − (1−ε) E[y_c] − (ε/V) Σ_v E_v),
        ∂L/∂E = Σ_c ((W_c H_c)ᵀ P_c)ᵀ − (1−ε) Σ_c scatter_add(y_c, W_c H_c)
                − (ε/V) 1 Σ_i w_i h_iᵀ                        (accumulated in float32),

    the one-hot terms being a gather of the table's rows and a scatter-add of the weighted
    hidden rows into their labels' rows (`keras.ops.segment_sum`), and the weights scaling
    `[C, d]` rows instead of the `[C, V]` block. The gradients are kept for the backward
    pass, which scales them by the upstream gradient (a custom gradient,
    `keras.ops.custom_gradient`). So the loss and its gradient take the three `[N, V, d]`
    matmuls of the plain form, two elementwise passes over each `[C, V]` block (log-softmax,
    exp) and no `[N, V]` tensor; the weights carry any normalisation (`1 / Σ_i m_i` for a
    mean), which is why `L` is a weighted sum rather than per-token losses. Neither
    `labels` nor `weights` receives a gradient.

    Args:
        hidden: float `[..., d]` hidden states.
        table: float `[V, d]` output embedding `E` (the tied token embedding).
        labels: int `[...]` target ids in `[0, V)`; where the weight is 0 any id in range.
        weights: float `[...]` per-token weights `w_i` (0 ignores a token).
        chunk_size: int, tokens per chunk.
        label_smoothing: float `ε` in [0, 1).
        with_gradient: bool; `False` computes the loss only (evaluation).

    Returns:
        float32 scalar `L`.
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)
    epsilon = check_rate("label_smoothing", label_smoothing)
    hidden = ops.convert_to_tensor(hidden)
    table = ops.convert_to_tensor(table)
    if len(table.shape) != 2:
        raise ValueError(f"table must have rank 2 [vocabulary, d]. Received: table.shape={table.shape}")
    width = static_dim(table.shape[1])
    check_width(hidden, width, "hidden")
    labels = check_token_mask(ops.convert_to_tensor(labels), hidden, "labels", "hidden")
    weights = check_token_mask(ops.convert_to_tensor(weights), hidden, "weights", "hidden")

    tokens = _count(hidden.shape[:-1])
    if tokens is None:  # a free batch size in a TensorFlow trace
        tokens = ops.prod(ops.convert_to_tensor(ops.shape(labels), "int32"))
    # Rows of weight 0 pad the tokens to whole chunks: the chunk count follows the shape.
    padding = (-tokens) % chunk_size
    flat = (ops.reshape(hidden, (-1, hidden.shape[-1])),
            ops.reshape(ops.cast(labels, "int32"), (-1,)),
            ops.reshape(ops.cast(weights, "float32"), (-1,)))
    hidden, labels, weights = (_chunks(t, padding, chunk_size) for t in flat)
    if not with_gradient:
        return _loss_only(hidden, table, labels, weights, epsilon)
    return _with_gradient(hidden, table, labels, weights, epsilon)


def _count(dims):
    """The product of `dims`, or `None` if one is unknown."""
    count = 1
    for dim in dims:
        if static_dim(dim) is None:
            return None
        count *= dim
    return count


def _chunks(x, padding, chunk_size):
    """`[N, ...]` padded with `padding` zero rows and cut into `[N / chunk_size, chunk_size, ...]`."""
    if not (isinstance(padding, int) and padding == 0):  # no copy when the chunks fit
        zeros = ops.zeros((padding,) + tuple(x.shape[1:]), x.dtype)
        x = ops.concatenate([x, zeros], axis=0)
    return ops.reshape(x, (-1, chunk_size) + tuple(x.shape[1:]))


def _chunk_log_probs(hidden, table, labels, epsilon):
    """float32 log-probabilities `[C, V]` of one chunk and the tokens' losses `ℓ`."""
    logits = ops.cast(ops.matmul(hidden, ops.transpose(table)), "float32")
    log_probs = ops.log_softmax(logits, axis=-1)
    losses = -ops.squeeze(ops.take_along_axis(log_probs, labels[:, None], axis=-1), axis=-1)
    if epsilon:
        losses = (1.0 - epsilon) * losses - epsilon * ops.mean(log_probs, axis=-1)
    return log_probs, losses


def _loss_only(hidden, table, labels, weights, epsilon):
    def step(total, inputs):
        h, y, w = inputs
        _, losses = _chunk_log_probs(h, table, y, epsilon)
        weighted = losses * w
        return total + ops.sum(weighted), weighted

    total, _ = time_loop(step, ops.zeros((), "float32"), (hidden, labels, weights), output_index=2,
                         sequential=True)
    return total


def _with_gradient(hidden, table, labels, weights, epsilon):
    vocabulary, width = table.shape

    @ops.custom_gradient
    def loss_and_gradient(hidden, table, labels, weights):
        # Σ_v E_v, the smoothing term's share of every row's gradient.
        table_sum = ops.sum(ops.cast(table, "float32"), axis=0)

        def step(carry, inputs):
            total, probability_gradient, label_gradient, weighted_sum = carry
            h, y, w = inputs
            log_probs, losses = _chunk_log_probs(h, table, y, epsilon)
            # ∂L/∂Z_c = diag(w)(P − (1−ε)Y − ε/V) is never formed: only P is [C, V]. The
            # one-hot and uniform terms of its products are a gather of the table's rows
            # (Y E = E[y]) and a scatter-add of the hidden rows into the label's rows
            # (hᵀ Y), and w scales the [C, d] sides (one pass over [C, V] fewer).
            probabilities = ops.cast(ops.exp(log_probs), table.dtype)
            weighted = h * ops.cast(w[:, None], h.dtype)
            # hᵀ·P into a [d, V] sum, transposed once at the end: Pᵀ·h would make XLA copy
            # the [C, V] block transposed.
            probability_gradient = probability_gradient + ops.cast(
                ops.matmul(ops.transpose(weighted), probabilities), "float32")
            weighted = ops.cast(weighted, "float32")
            label_gradient = label_gradient + ops.segment_sum(weighted, y, vocabulary)
            weighted_sum = weighted_sum + ops.sum(weighted, axis=0)
            row_gradient = (ops.cast(ops.matmul(probabilities, table), "float32")
                            - (1.0 - epsilon) * ops.cast(ops.take(table, y, axis=0), "float32"))
            if epsilon:
                row_gradient = row_gradient - (epsilon / vocabulary) * table_sum
            hidden_gradient = ops.cast(row_gradient * w[:, None], h.dtype)
            carry = (total + ops.sum(losses * w), probability_gradient, label_gradient,
                     weighted_sum)
            return carry, hidden_gradient

        init = (ops.zeros((), "float32"), ops.zeros((width, vocabulary), "float32"),
                ops.zeros((vocabulary, width), "float32"), ops.zeros((width,), "float32"))
        (total, probability_gradient, label_gradient, weighted_sum), hidden_gradient = time_loop(
            step, init, (hidden, labels, weights), output_index=0, sequential=True)
        table_gradient = ops.transpose(probability_gradient) - (1.0 - epsilon) * label_gradient
        if epsilon:
            table_gradient = table_gradient - (epsilon / vocabulary) * weighted_sum

        def gradient(*args, upstream=None):
            # PyTorch passes the inputs and `upstream=`; TensorFlow and JAX the upstream alone.
            if upstream is None:
                (upstream,) = args
            upstream = ops.cast(upstream, "float32")
            return (
                ops.cast(ops.cast(hidden_gradient, "float32") * upstream, hidden_gradient.dtype),
                ops.cast(table_gradient * upstream, table.dtype),
                None,
                None,
            )

        return total, gradient

    return loss_and_gradient(hidden, table, labels, weights)
