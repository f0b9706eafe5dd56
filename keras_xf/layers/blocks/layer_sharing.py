"""Parameter sharing across the layers of a stack (survey §4.2.4, §5.4)."""

import numbers


def layer_owners(share_layers, num_layers):
    """The layer whose weights each layer uses: `owners[l] ≤ l`, `owners[l] == l` for a
    layer with weights of its own.

    `share_layers`: `None` (no sharing), `"all"` (`θ^1 = … = θ^L`, one set of weights),
    an int `k ≥ 1` (every `k`-th layer shares: layer `l` uses the weights of layer
    `l mod k`, so there are `k` sets), or a list of `L` group names (ints or strings):
    layers with equal names share, `θ^{l_1} = … = θ^{l_n}`."""
    if share_layers is None:
        return list(range(num_layers))
    if share_layers == "all":
        return [0] * num_layers
    if isinstance(share_layers, numbers.Integral) and not isinstance(share_layers, bool):
        if share_layers < 1:
            raise ValueError(f"share_layers as an int must be >= 1. Received: "
                             f"share_layers={share_layers}")
        return [index % share_layers for index in range(num_layers)]
    if isinstance(share_layers, (list, tuple)):
        ok = len(share_layers) == num_layers and all(
            isinstance(g, (str, numbers.Integral)) and not isinstance(g, bool)
            for g in share_layers)
        if ok:
            first = {}
            return [first.setdefault(group, index) for index, group in enumerate(share_layers)]
    raise ValueError(
        'share_layers must be None, "all", an int k >= 1, or a list of num_layers group names '
        f"(ints or strings). Received: share_layers={share_layers!r} with num_layers={num_layers}"
    )


def kept_groups(share_layers, num_layers, layers):
    """`share_layers` of a stack that keeps only `layers` (indices into `num_layers`), as a
    list of group names (or `None`), so that kept layers share as before."""
    if share_layers is None:
        return None
    owners = layer_owners(share_layers, num_layers)
    return [owners[index] for index in layers]
