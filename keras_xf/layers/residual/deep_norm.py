"""DeepNorm's depth-derived constants (survey §4.2.1, §4.2.2; Wang et al. 2022, DeepNet)."""

import dataclasses

from keras_xf.ops.checks import check_positive_int


@dataclasses.dataclass(frozen=True)
class DeepNorm:
    """The DeepNorm constants of one side of a model: `z^l = LNorm(α·z^{l-1} + F(z^{l-1}))`
    (the `"weighted"` residual with β = α, γ = 0), with the value, output and feedforward
    projections initialised by Xavier with gain β (the query and key projections with gain 1).

    Attributes:
        alpha: float α, the weight of the identity path inside the norm.
        beta: float β, the Xavier gain of the value, output and feedforward projections.
    """

    alpha: float
    beta: float

    def residual_arguments(self):
        """The `Residual` / `TransformerBlock` arguments of DeepNorm's residual:
        `norm_placement="weighted"`, `inner_weight=α`, `outer_weight=0`."""
        return {"norm_placement": "weighted", "inner_weight": self.alpha, "outer_weight": 0.0}

    def depth_initialization(self, distribution="normal"):
        """The `TransformerStack(depth_initialization=...)` value of DeepNorm's
        initialisation: Xavier with gain β (gain 1 for queries and keys), normal as in
        DeepNet by default."""
        return {"method": "deep_norm", "beta": self.beta, "distribution": distribution}


def deep_norm(encoder_layers=0, decoder_layers=0):
    """DeepNorm's α (residual weight) and β (initialisation gain) from the model's depth.

    With `N` encoder layers and `M` decoder layers (layers, not sub-layers):
    - encoder-only (`M = 0`): `α = (2N)^{1/4}`, `β = (8N)^{-1/4}`;
    - decoder-only (`N = 0`): `α = (2M)^{1/4}`, `β = (8M)^{-1/4}`;
    - encoder-decoder: encoder `α = 0.81·(N⁴M)^{1/16}`, `β = 0.87·(N⁴M)^{-1/16}`;
      decoder `α = (3M)^{1/4}`, `β = (12M)^{-1/4}`.

    Args:
        encoder_layers: int `N ≥ 0`.
        decoder_layers: int `M ≥ 0`; at least one of the two is positive.

    Returns:
        A dict with a `DeepNorm` for each side that has layers: `"encoder"`, `"decoder"`.

    Example:
    >>> constants = deep_norm(decoder_layers=24)["decoder"]
    >>> block = TransformerBlock(MultiHeadAttention(4), FeedForward(64),
    ...                          **constants.residual_arguments())
    >>> stack = TransformerStack(block, 24,
    ...                          depth_initialization=constants.depth_initialization())
    """
    n = check_positive_int("encoder_layers", encoder_layers, minimum=0)
    m = check_positive_int("decoder_layers", decoder_layers, minimum=0)
    if n == 0 and m == 0:
        raise ValueError(
            "deep_norm needs encoder_layers > 0 or decoder_layers > 0. Received: "
            "encoder_layers=0, decoder_layers=0"
        )
    if m == 0:
        return {"encoder": DeepNorm((2 * n) ** 0.25, (8 * n) ** -0.25)}
    if n == 0:
        return {"decoder": DeepNorm((2 * m) ** 0.25, (8 * m) ** -0.25)}
    depth = n**4 * m
    return {
        "encoder": DeepNorm(0.81 * depth ** (1 / 16), 0.87 * depth ** (-1 / 16)),
        "decoder": DeepNorm((3 * m) ** 0.25, (12 * m) ** -0.25),
    }
