"""Samplers: keras-hub's (greedy, random with temperature, top-k, top-p, beam search), and
the loop conditions that end rows: stop ids given as a tensor, and the stop / non-stop rule
of a stop classifier."""

import copy
import dataclasses

import numpy as np
from keras import ops

from keras_xf.ops.exit_criteria import stop_by_margin


SAMPLER_NAMES = ("greedy", "random", "top_k", "top_p", "beam", "contrastive")
# `"top_p"` by name: keras-hub's default p = 0.1 keeps, for most distributions, the most
# likely token alone (greedy search); 0.9 is the nucleus of Holtzman et al. and transformers'
# usual setting.
DEFAULT_TOP_P = 0.9
# `"top_k"` by name: keras-hub's default.
DEFAULT_TOP_K = 5
# The samplers that `temperature`, `top_k` and `top_p` build, by name.
RANDOM_SAMPLERS = ("random", "top_k", "top_p")


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """A keras-hub random sampler described by plain values (hashable, so that calls with
    equal values share one compiled loop): `kind` `"random"`, `"top_k"` or `"top_p"`,
    `temperature`, `k` (top-k; with top-p, the candidates first kept) and `p` (top-p). The
    seed is not part of it: `generate(seed=...)` restarts the sampler's generators."""

    kind: str
    temperature: float = 1.0
    k: int = None
    p: float = None

    def build(self):
        import keras_hub

        if self.kind == "top_p":
            return keras_hub.samplers.TopPSampler(p=self.p, k=self.k,
                                                  temperature=self.temperature)
        if self.kind == "top_k":
            return keras_hub.samplers.TopKSampler(k=self.k, temperature=self.temperature)
        return keras_hub.samplers.RandomSampler(temperature=self.temperature)


def get_sampler(sampler):
    """A keras-hub sampler from a name (`"greedy"`, `"random"`, `"top_k"`, `"top_p"`,
    `"beam"`, `"contrastive"`), a `SamplerSpec` or a sampler instance. `"top_p"` by name
    keeps p = 0.9 (`DEFAULT_TOP_P`), not keras-hub's 0.1."""
    if isinstance(sampler, str) and sampler not in SAMPLER_NAMES:
        raise ValueError(f"sampler must be one of {SAMPLER_NAMES} or a sampler. "
                         f"Received: sampler={sampler!r}")
    try:
        import keras_hub
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError(
            "Generation uses keras-hub's samplers: pip install 'keras-xf[hub]'"
        ) from error
    if isinstance(sampler, SamplerSpec):
        return sampler.build()
    if sampler == "top_p":
        return SamplerSpec("top_p", p=DEFAULT_TOP_P).build()
    if isinstance(sampler, str):
        return keras_hub.samplers.get(sampler)
    if not isinstance(sampler, keras_hub.samplers.Sampler):
        raise ValueError(f"sampler must be a name or a keras_hub Sampler. Received: sampler={sampler!r}")
    return sampler


def _is_number(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def sampler_from_arguments(sampler, temperature=None, top_k=None, top_p=None):
    """What `generate`'s sampling arguments ask for: `sampler` itself (a name, a sampler or
    `None` for the model's default) when `temperature`, `top_k` and `top_p` are all `None`,
    else a `SamplerSpec`: top-p when `top_p` is given (after keeping the `top_k` most likely
    tokens when that is given too), else top-k when `top_k` is, else random sampling;
    `temperature` divides the logits of each. `sampler` may then name one of those kinds
    (`"top_p"` alone keeps p = 0.9, `"top_k"` alone k = 5).

    Raises:
        ValueError, naming the argument: a temperature that is not a positive number, a
            `top_k` that is not a positive int (or larger than `vocabulary_size`), a `top_p`
            outside (0, 1], these arguments beside a sampler object or a sampler name of
            another kind, or `top_p` with `sampler="top_k"` / either with `"random"`.
    """
    if temperature is None and top_k is None and top_p is None:
        return sampler
    if temperature is not None and not (_is_number(temperature) and temperature > 0):
        raise ValueError("temperature must be a positive number. Received: "
                         f"temperature={temperature!r}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer))
                                  and not isinstance(top_k, bool) and top_k >= 1):
        raise ValueError(f"top_k must be a positive int. Received: top_k={top_k!r}")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be a number in (0, 1]. Received: top_p={top_p!r}")
    if sampler is not None and not (isinstance(sampler, str) and sampler in RANDOM_SAMPLERS):
        raise ValueError(
            "temperature, top_k and top_p build a sampler: pass them without sampler, or with "
            f"sampler one of {RANDOM_SAMPLERS}. Received: sampler={sampler!r}, "
            f"temperature={temperature!r}, top_k={top_k!r}, top_p={top_p!r}"
        )
    kind = sampler or ("top_p" if top_p is not None else "top_k" if top_k is not None
                       else "random")
    if (kind == "random" and (top_k is not None or top_p is not None)) or (
            kind == "top_k" and top_p is not None):
        raise ValueError(
            f"sampler={kind!r} takes no {'top_p' if top_p is not None else 'top_k'}: top_p "
            f"needs sampler='top_p' or None, top_k 'top_k', 'top_p' or None. Received: "
            f"sampler={kind!r}, top_k={top_k!r}, top_p={top_p!r}"
        )
    temperature = 1.0 if temperature is None else float(temperature)
    if kind == "top_p":
        return SamplerSpec("top_p", temperature, None if top_k is None else int(top_k),
                           DEFAULT_TOP_P if top_p is None else float(top_p))
    if kind == "top_k":
        return SamplerSpec("top_k", temperature, DEFAULT_TOP_K if top_k is None else int(top_k))
    return SamplerSpec("random", temperature)


def restart_seed(sampler, seed):
    """Starts the seed generators of a keras-hub `sampler` at `[seed, 0]`, the state of
    `keras.random.SeedGenerator(seed)`, so that a call with a seed draws what a fresh
    `TopKSampler(seed=seed)` (or other) would. A sampler that draws nothing has none.

    Raises:
        ValueError: a seed that is not an int >= 0, or a sampler without random draws.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0. Received: seed={seed!r}")
    variables = list(sampler.variables)
    if not variables:
        raise ValueError(
            "seed needs a sampler that draws at random ('random', 'top_k' or 'top_p', or "
            f"temperature, top_k or top_p given). Received: seed={seed!r} with "
            f"sampler={type(sampler).__name__}"
        )
    for variable in variables:
        variable.assign(np.array([seed, 0]).astype(variable.dtype))


def limit_length(sampler, output_length):
    """A copy of a keras-hub `sampler` whose loop also ends at position `output_length` (an
    int32 scalar tensor): the prompt buffer may be wider (a compile bucket), the positions
    past `output_length` are then never generated. Every keras-hub loop keeps the index third
    among its loop variables."""
    run_loop = sampler.run_loop

    def run_limited_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        def limited(*loop_vars):
            return ops.logical_and(cond(*loop_vars), loop_vars[2] < output_length)

        return run_loop(limited, body, model=model, loop_vars=loop_vars,
                        maximum_iterations=maximum_iterations)

    limited_sampler = copy.copy(sampler)
    limited_sampler.run_loop = run_limited_loop
    return limited_sampler


def penalize_repetition(logits, token_ids, index, penalty):
    """transformers' repetition penalty (Keskar et al. 2019): the logits `[B, V]` of tokens
    present in `token_ids[:, :index]` (prompt and generated so far, `[B, L]`) divided by
    `penalty` where positive, multiplied by it where negative. A scatter of the present ids,
    no `[B, L, V]` one-hot."""
    batch, width = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    vocabulary = ops.shape(logits)[1]
    rows = ops.repeat(ops.arange(batch, dtype="int32")[:, None], width, axis=1)
    indices = ops.stack([ops.reshape(rows, (-1,)),
                         ops.reshape(ops.cast(token_ids, "int32"), (-1,))], axis=1)
    seen = ops.cast(ops.arange(width)[None, :] < index, "float32")
    counts = ops.scatter(indices, ops.reshape(ops.broadcast_to(seen, (batch, width)), (-1,)),
                         (batch, vocabulary))
    logits = ops.cast(logits, "float32")
    penalized = ops.where(logits > 0, logits / penalty, logits * penalty)
    return ops.where(counts > 0, penalized, logits)


def with_repetition_penalty(next, penalty):
    """`next(prompt, cache, index) -> (logits, hidden, cache)` (keras-hub's step) with the
    logits penalised for the tokens of `prompt` before `index` (`penalize_repetition`)."""

    def penalized_next(prompt, cache, index):
        logits, hidden, cache = next(prompt, cache, index)
        return penalize_repetition(logits, prompt, index, penalty), hidden, cache

    return penalized_next


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


def check_stream_sampler(sampler):
    """Streaming hands over each token as it is chosen, which beam and contrastive search
    cannot (their choice is known after the last step): refused."""
    import keras_hub  # `sampler` is resolved already: keras-hub is loaded

    if isinstance(sampler, (keras_hub.samplers.BeamSampler, keras_hub.samplers.ContrastiveSampler)):
        raise ValueError(
            "stream works with samplers that choose each token when it is generated (greedy, "
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
