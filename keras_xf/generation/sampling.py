"""Samplers: keras-hub's (greedy, random with temperature, top-k, top-p, beam search)."""


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
