"""Samplers: keras-hub's (greedy, random with temperature, top-k, top-p, beam search), and
the loop conditions that end rows: stop ids given as a tensor, and the stop / non-stop rule
of a stop classifier."""

import copy

from keras import ops

from keras_xf.ops.exit_criteria import stop_by_margin


SAMPLER_NAMES = ("greedy", "random", "top_k", "top_p", "beam", "contrastive")


def get_sampler(sampler):
    """A keras-hub sampler from a name (`"greedy"`, `"random"`, `"top_k"`, `"top_p"`,
    `"beam"`) or a sampler instance."""
    if isinstance(sampler, str) and sampler not in SAMPLER_NAMES:
        raise ValueError(f"sampler must be one of {SAMPLER_NAMES} or a sampler. "
                         f"Received: sampler={sampler!r}")
    try:
        import keras_hub
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError(
            "Generation uses keras-hub's samplers: pip install 'keras-xf[hub]'"
        ) from error
    if isinstance(sampler, str):
        return keras_hub.samplers.get(sampler)
    if not isinstance(sampler, keras_hub.samplers.Sampler):
        raise ValueError(f"sampler must be a name or a keras_hub Sampler. Received: sampler={sampler!r}")
    return sampler


def stops_on_tensor(sampler, stop_token_ids):
    """A copy of a keras-hub `sampler` whose loop ends once every row holds one of
    `stop_token_ids` among the tokens it generated.

    keras-hub's own stop condition iterates over a Python tuple of ids; exported generation
    takes the ids as a 1-D int tensor (possibly empty) instead. The copy is called with
    `stop_token_ids=None` and checks the tensor in its loop condition; the loop body, hence
    the tokens, are the sampler's. Loop variables are keras-hub's `(prompt, cache, index,
    mask)` (every sampler but beam search).
    """
    run_loop = sampler.run_loop

    def stop_condition(prompt, cache, index, mask):
        return ops.logical_not(ops.all(rows_with_stop_token(prompt, index, mask, stop_token_ids)))

    def run_stopping_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        return run_loop(stop_condition, body, model=model, loop_vars=loop_vars,
                        maximum_iterations=maximum_iterations)

    stopping = copy.copy(sampler)
    stopping.run_loop = run_stopping_loop
    return stopping


def check_rule_sampler(sampler):
    """A stop classifier's rule runs in the loop of the samplers whose loop state is
    keras-hub's `(prompt, cache, index, mask)`; beam and contrastive search keep beams and
    scores of their own in theirs, and are refused."""
    import keras_hub  # `sampler` is resolved already: keras-hub is loaded

    if isinstance(sampler, (keras_hub.samplers.BeamSampler, keras_hub.samplers.ContrastiveSampler)):
        raise ValueError(
            "stop_classifier works with samplers that keep one sequence per row (greedy, "
            "random, top_k, top_p), not with beam or contrastive search. Received: "
            f"sampler={type(sampler).__name__}"
        )


def rows_with_stop_token(prompt, index, mask, stop_token_ids):
    """bool `[B]`: whether each row holds one of `stop_token_ids` (a tuple of ids or a 1-D
    int tensor, possibly empty) among the tokens it generated: positions before `index`
    outside the prompt `mask`."""
    generated = ops.logical_and(
        ops.logical_not(mask), ops.arange(ops.shape(prompt)[1])[None, :] < index
    )
    stops = ops.cast(ops.convert_to_tensor(stop_token_ids), prompt.dtype)
    is_stop = ops.any(ops.equal(prompt[..., None], stops), axis=-1)
    return ops.any(ops.logical_and(is_stop, generated), axis=-1)


def sample_with_stop_rule(sampler, next, prompt, cache, index, mask, stop_probability, margin,
                          stop_token_ids=None, hidden_states=None, model=None):
    """Runs a keras-hub `sampler` in which a row ends once a stop classifier says so
    (survey §5.6): `Pr(stop|s_i) ≥ Pr(nonstop|s_i) + θ_stop` (`stop_by_margin`).

    The step that feeds the token at `i` (keras-hub's step at `index = i + 1`) gives its
    top-layer state `s_i`; where `i` is a generated position (outside the prompt `mask`) and
    the rule holds, the row's output length becomes `i + 1`, once. The lengths travel
    through the loop beside the model's cache, as `(cache, lengths, mask)`: `next` is the only
    part of keras-hub's loop body that a caller supplies, and the cache is the part of its
    loop state that `next` reads and returns. The loop ends once every row has ended, by the
    rule or by one of `stop_token_ids` (a tuple, a 1-D int tensor or `None`); the tokens are
    the sampler's, so rows that have not ended get the tokens they get without the rule.

    Args:
        sampler: a keras-hub sampler whose loop state is `(prompt, cache, index, mask)`
            (every sampler but beam and contrastive search).
        next: `next(prompt, cache, index) -> (logits [B, V], hidden [B, d], cache)`.
        prompt, cache, index, mask, hidden_states, model: the sampler's arguments.
        stop_probability: `f(hidden [B, d]) -> float32 [B]`, `Pr(stop | s_i)`.
        margin: float, `θ_stop`.
        stop_token_ids: ids that also end a row, or `None`.

    Returns:
        `(prompt, lengths)`: the sampler's ids `[B, L]` and int32 `[B]`, each row's output
        length under the rule (`L` for rows it did not end).
    """
    width = ops.shape(prompt)[1]
    mask = ops.cast(mask, "bool")

    def next_with_rule(prompt, state, index):
        cache, lengths, mask = state
        logits, hidden, cache = next(prompt, cache, index)
        generated = ops.logical_not(ops.take(mask, index - 1, axis=1))
        stops = ops.logical_and(stop_by_margin(stop_probability(hidden), margin), generated)
        ends = ops.logical_and(stops, lengths >= width)
        lengths = ops.where(ends, ops.cast(index, "int32"), lengths)
        return logits, hidden, (cache, lengths, mask)

    def condition(prompt, state, index, mask):
        done = state[1] < width
        if stop_token_ids is not None:
            done = ops.logical_or(done, rows_with_stop_token(prompt, index, mask, stop_token_ids))
        return ops.logical_not(ops.all(done))

    run_loop = sampler.run_loop
    final_state = []

    def run_ruled_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        loop_vars = run_loop(condition, body, model=model, loop_vars=loop_vars,
                             maximum_iterations=maximum_iterations)
        final_state.append(loop_vars[1])  # keras-hub's sampler returns the ids alone
        return loop_vars

    ruled = copy.copy(sampler)
    ruled.run_loop = run_ruled_loop
    lengths = ops.full((ops.shape(prompt)[0],), width, "int32")
    prompt = ruled(next=next_with_rule, prompt=prompt, cache=(cache, lengths, mask),
                   index=index, mask=mask, stop_token_ids=None, hidden_states=hidden_states,
                   model=model)
    return prompt, final_state[0][1]
