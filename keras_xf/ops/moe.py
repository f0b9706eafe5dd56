"""Sparse token-to-expert dispatch for mixtures of experts (survey §4.4, §5.6).

Tokens are flattened to `N` rows. Each of the `k·N` assignments (token `t`, choice `j`,
expert `e`) gets a slot in a static buffer of expert rows; the experts run on their rows
only, and the outputs are gathered back and weighted by the gates. Shapes depend on `N`,
`k`, `M` and the capacity only, never on the routing, so XLA compiles it.
"""

import math

import keras
from keras import ops


def expert_capacity(num_tokens, num_experts, top_k, capacity_factor):
    """`C = ceil(capacity_factor · k · N / M)` rows per expert (at least 1, at most `N`)."""
    if isinstance(num_tokens, int):
        capacity = math.ceil(capacity_factor * top_k * num_tokens / num_experts)
        return max(1, min(capacity, num_tokens))
    capacity = ops.ceil(capacity_factor * top_k * ops.cast(num_tokens, "float32") / num_experts)
    return ops.cast(ops.clip(capacity, 1, ops.cast(num_tokens, "float32")), "int32")


def choice_major(x):
    """`[N, k, ...]` -> `[k·N, ...]`, all first choices before all second choices."""
    x = ops.swapaxes(x, 0, 1)
    return ops.reshape(x, (-1,) + tuple(x.shape[2:]))


def _positions(expert_index, valid, num_experts):
    """Position of each assignment among those of its expert, in choice-major order.

    Returns `(positions [k·N], counts [M])`; invalid assignments take no position.
    """
    flat = choice_major(expert_index)
    one_hot = ops.one_hot(flat, num_experts, dtype="int32") * ops.cast(
        choice_major(valid), "int32")[:, None]
    positions = ops.sum((ops.cumsum(one_hot, axis=0) - 1) * one_hot, axis=-1)
    return positions, ops.sum(one_hot, axis=0)


def expert_counts(expert_index, valid, num_experts):
    """`[M]`: the number of `valid` assignments (bool `[N, k]`) routed to each expert."""
    one_hot = ops.one_hot(ops.reshape(expert_index, (-1,)), num_experts, dtype="int32")
    return ops.sum(one_hot * ops.reshape(ops.cast(valid, "int32"), (-1, 1)), axis=0)


def capacity_slots(expert_index, valid, num_experts, capacity):
    """Slots of a fixed-capacity dispatch: expert `e` owns rows `[e·C, (e+1)·C)`.

    Args:
        expert_index: int `[N, k]`, the experts of each token, best first.
        valid: bool `[N, k]`, assignments that may take a row (padding tokens may not).
        num_experts: int `M`.
        capacity: int `C`.

    Returns:
        `(slots [k·N], kept [k·N], counts [M])`: the row of each choice-major assignment
        (`M·C` for a dropped or invalid one), whether it was kept, and the number of valid
        assignments routed to each expert. Earlier choices take precedence over later ones,
        then earlier tokens.
    """
    positions, counts = _positions(expert_index, valid, num_experts)
    flat = choice_major(expert_index)
    kept = ops.logical_and(choice_major(valid), positions < capacity)
    slots = ops.where(kept, flat * capacity + positions, num_experts * capacity)
    return slots, kept, counts


def dropless_slots(expert_index, valid, num_experts, block_size, num_blocks):
    """Slots of a dropless dispatch: each expert's rows padded to whole blocks.

    Expert `e` receives `ceil(n_e / b)` blocks of `b` rows, laid out one expert after the
    other; `num_blocks = ceil((k·N + M·(b - 1)) / b)` blocks always suffice, so every valid
    assignment gets a row.

    Returns:
        `(slots [k·N], block_expert [num_blocks], counts [M])`: the row of each assignment
        (`num_blocks·b` for an invalid one), the expert that owns each block, and the number of
        valid assignments routed to each expert.
    """
    positions, counts = _positions(expert_index, valid, num_experts)
    flat = choice_major(expert_index)
    padded = (counts + block_size - 1) // block_size * block_size
    ends = ops.cumsum(padded)
    starts = ends - padded
    start = ops.take(starts, flat, axis=0)
    slots = ops.where(choice_major(valid), start + positions, num_blocks * block_size)
    block_start = ops.arange(num_blocks, dtype="int32") * block_size
    owner = ops.sum(ops.cast(ends[None, :] <= block_start[:, None], "int32"), axis=-1)
    return slots, ops.minimum(owner, num_experts - 1), counts


def gather_rows(inputs, slots, num_rows):
    """Expert input rows `[num_rows, d]` of a dispatch, and a mask of the filled ones.

    `inputs` are the `[N, d]` tokens; `slots` the `[k·N]` rows of the choice-major
    assignments (`num_rows` marks an assignment without a row). Each row takes its token by a
    gather, so the work is linear in the number of rows.
    """
    num_tokens = ops.shape(inputs)[0]
    top_k = ops.shape(slots)[0] // num_tokens
    token = ops.tile(ops.arange(num_tokens, dtype="int32"), (top_k,))
    # Unique rows for kept assignments; every other assignment lands on the extra row, which
    # is dropped. `scatter_update` (an index write) rather than `scatter`: Keras's PyTorch
    # `scatter` loops over the indices in Python, one small op per assignment.
    row_token = ops.scatter_update(
        ops.zeros((num_rows + 1,), "int32"), ops.expand_dims(slots, -1), token + 1
    )
    row_token = row_token[:num_rows] - 1
    filled = row_token >= 0
    rows = ops.take(inputs, ops.maximum(row_token, 0), axis=0)
    return rows * ops.cast(filled, rows.dtype)[:, None], filled


def combine_rows(rows, slots, gates):
    """`Σ_j g_j · row(slot_j)` per token: `rows [R, d]`, `slots [k·N]`, `gates [N, k]`.

    A slot equal to `R` (a dropped assignment) contributes zero.
    """
    rows = ops.concatenate([rows, ops.zeros_like(rows[:1])], axis=0)
    picked = ops.take(rows, slots, axis=0)
    num_tokens, top_k = ops.shape(gates)[0], ops.shape(gates)[1]
    picked = ops.reshape(picked, (top_k, num_tokens, -1))
    weights = ops.cast(ops.transpose(gates), picked.dtype)[:, :, None]
    return ops.sum(picked * weights, axis=0)


def grouped_matmul(x, w):
    """`x[g] @ w[g]` for `x [G, R, a]`, `w [G, a, b]`: the experts' matmuls.

    Why not `keras.ops.matmul` alone: TensorFlow's CPU `BatchMatMulV2` kernel takes more time
    per FLOP than its `MatMul`, so on TensorFlow a few groups run as one `MatMul` each (a
    batched matmul elsewhere)."""
    groups = x.shape[0]
    if keras.config.backend() == "tensorflow" and isinstance(groups, int) and groups <= 64:
        return ops.stack([ops.matmul(a, b) for a, b in zip(ops.unstack(x, groups, axis=0),
                                                            ops.unstack(w, groups, axis=0))])
    return ops.matmul(x, w)
