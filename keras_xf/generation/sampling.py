"""Samplers: keras-hub's (greedy, random with temperature, top-k, top-p, beam search)."""

import copy

from keras import ops


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
        # Only positions already generated (before `index`, outside the prompt) count.
        generated = ops.logical_and(
            ops.logical_not(mask), ops.arange(ops.shape(prompt)[1])[None, :] < index
        )
        stops = ops.cast(stop_token_ids, prompt.dtype)
        is_stop = ops.any(ops.equal(prompt[..., None], stops), axis=-1)
        done = ops.any(ops.logical_and(is_stop, generated), axis=-1)
        return ops.logical_not(ops.all(done))

    def run_stopping_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        return run_loop(stop_condition, body, model=model, loop_vars=loop_vars,
                        maximum_iterations=maximum_iterations)

    stopping = copy.copy(sampler)
    stopping.run_loop = run_stopping_loop
    return stopping
