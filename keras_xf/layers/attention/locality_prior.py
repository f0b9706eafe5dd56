"""Locality priors on the attention scores (survey §4.1.1, "Priors for Local Modeling")."""

import math

import keras
from keras import ops

from keras_xf.layers.attention.score_bias import ScoreBias
from keras_xf.layers.attention.score_multiplier import ScoreMultiplier
from keras_xf.ops.attention import masked_softmax
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import get_initializer

FORMS = ("additive", "mixture", "multiplicative")
DISTANCES = ("absolute", "gaussian", "predicted")
# The penalty `γ·G` is capped at this value: `exp(-1e4)` is zero in float32 already, and the
# cap keeps the bias finite when it is cast to float16 (largest finite value 65504).
MAX_PENALTY = 1e4
# A floor on the predicted standard deviation `σ_i`, so that `(μ_i − j)² / (2σ_i²)` is finite.
MIN_SIGMA = 1e-3


def _is_real(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@keras.saving.register_keras_serializable(package="keras_xf")
class LocalityPrior(ScoreBias, ScoreMultiplier):
    """A locality prior `G` that discourages attention between distant positions.

    Survey §4.1.1. The penalty matrix `G` has one of three definitions (`distance`):
    - `"absolute"`: `G(i, j) = |i − j|`;
    - `"gaussian"`: `G(i, j) = (i − j)² / (2σ²)`, with a fixed `σ = sigma`;
    - `"predicted"` (cross-attention): `G(i, j) = (μ_i − j)² / (2σ_i²)`, where the centre and
      width are predicted from the projected query `q_i` of each head (Yang et al. 2018):
      `h_i = tanh(q_i W)`, `μ_i = (S − 1)·sigmoid(h_i·u_μ)`, `D_i = S·sigmoid(h_i·u_σ)`,
      `σ_i = max(D_i / 2, 10⁻³)`, with `S` the key (source) length, key positions `0 … S−1`
      and `W`, `u_μ`, `u_σ` shared by the heads. With padded sources `S` is the padded length.
    Positions `i`, `j` are absolute (query positions start at the cache index when decoding),
    so the self-attention forms give the same result token by token with a KV cache. The
    `"predicted"` distance scales `μ_i` by the key length, so it is meant for cross-attention
    (whose cache holds exactly the source); in self-attention with a cache of length `L` it
    would scale by `L`.

    The penalty `P = min(γ·G, 10⁴)` (capped so that it stays finite in float16) enters the
    attention in one of three ways (`form`):
    - `"additive"`: `α = Softmax(q·kᵀ/√d − γ·G)`. Plug in as
      `MultiHeadAttention(biases=[LocalityPrior(...)])`; `call` returns `−P`.
    - `"mixture"`: `α = (1 − β)·Softmax(q·kᵀ/√d) + β·Softmax(−γ·G)`, with `β ∈ [0, 1]` fixed or
      predicted by a gate `β_i = sigmoid(q_i·w_β + b_β)` per query and head (`beta="gated"`).
      Plug in as `MultiHeadAttention(biases=[LocalityPrior(form="mixture", ...)])`: the layer
      sets `mixes_weights = True`, so attention calls `mix_weights` on the softmax weights
      instead of adding a bias. The prior's softmax uses the attention's mask (padding,
      causal, cache); fully masked rows give zeros.
    - `"multiplicative"`: `α = Softmax(q·kᵀ/√d ⊙ G′)` with `G′(i, j) = exp(−(P(i, j) −
      min_j P(i, j)))`, i.e. `Softmax_j(−γ·G)` normalised so that its row maximum is 1: it is
      1 at the nearest position (`j = i` in self-attention) and decays with distance. Plug
      in as `MultiHeadAttention(multiplier=LocalityPrior(form="multiplicative", ...))`.

    `γ` is a fixed float, or with `trainable_gamma=True` a learned non-negative weight per head
    (initialised to `gamma`), so that heads can choose different degrees of locality.

    Args:
        form: `"additive"`, `"mixture"` or `"multiplicative"`.
        distance: `"absolute"`, `"gaussian"` or `"predicted"`.
        gamma: positive float, the weight `γ` of the penalty (the initial value when trained).
        trainable_gamma: bool, learn one `γ ≥ 0` per head.
        sigma: positive float, `σ` of `distance="gaussian"` (required there, not allowed
            otherwise).
        beta: float in [0, 1] or `"gated"`, the mixture coefficient of `form="mixture"`
            (required there, not allowed otherwise).
        predictor_units: positive int, width of the `μ_i, σ_i` predictor's hidden layer for
            `distance="predicted"`; defaults to the head width.
        kernel_initializer: initializer of the predictor and gate weights.
        **kwargs: base `Layer` arguments.

    Call arguments (`call`, the additive bias or the multiplier):
        query: projected queries `[B, T, H, Dh]`.
        key: projected keys `[B, S, Hkv, Dh]`.
        query_positions: int32 `[T]`.
        key_positions: int32 `[S]`.

    Returns:
        float32, broadcastable to `[B, H, T, S]`: `−P` (`"additive"`, `"mixture"`) or `G′`
        (`"multiplicative"`). `mix_weights(weights, query, key, query_positions,
        key_positions, mask)` returns the mixed float32 weights `[B, H, T, S]`.

    Example:
    >>> prior = LocalityPrior(distance="gaussian", sigma=2.0, trainable_gamma=True)
    >>> mha = MultiHeadAttention(num_heads=2, biases=[prior])
    >>> y = mha(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    """

    def __init__(
        self,
        form="additive",
        distance="absolute",
        gamma=1.0,
        trainable_gamma=False,
        sigma=None,
        beta=None,
        predictor_units=None,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}. Received: form={form!r}")
        if distance not in DISTANCES:
            raise ValueError(
                f"distance must be one of {DISTANCES}. Received: distance={distance!r}"
            )
        if not _is_real(gamma) or gamma <= 0:
            raise ValueError(f"gamma must be a positive float. Received: gamma={gamma!r}")
        check_bool("trainable_gamma", trainable_gamma)
        if distance == "gaussian":
            if not _is_real(sigma) or sigma <= 0:
                raise ValueError(
                    "sigma must be a positive float when distance='gaussian'. "
                    f"Received: sigma={sigma!r}"
                )
            sigma = float(sigma)
        elif sigma is not None:
            raise ValueError(
                "sigma is used only with distance='gaussian'. "
                f"Received: sigma={sigma!r}, distance={distance!r}"
            )
        if form == "mixture":
            if beta != "gated" and (not _is_real(beta) or not 0 <= beta <= 1):
                raise ValueError(
                    "beta must be a float in [0, 1] or 'gated' when form='mixture'. "
                    f"Received: beta={beta!r}"
                )
            beta = beta if beta == "gated" else float(beta)
        elif beta is not None:
            raise ValueError(
                f"beta is used only with form='mixture'. Received: beta={beta!r}, form={form!r}"
            )
        if predictor_units is not None:
            if distance != "predicted":
                raise ValueError(
                    "predictor_units is used only with distance='predicted'. Received: "
                    f"predictor_units={predictor_units!r}, distance={distance!r}"
                )
            if isinstance(predictor_units, bool) or not isinstance(predictor_units, int) or (
                predictor_units <= 0
            ):
                raise ValueError(
                    "predictor_units must be a positive int. "
                    f"Received: predictor_units={predictor_units!r}"
                )
        self.form = form
        self.distance = distance
        self.gamma = float(gamma)
        self.trainable_gamma = trainable_gamma
        self.sigma = sigma
        self.beta = beta
        self.predictor_units = predictor_units
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.mixes_weights = form == "mixture"

    def build(self, query_shape, *args, **kwargs):
        if len(query_shape) != 4 or query_shape[2] is None or query_shape[3] is None:
            raise ValueError(
                "LocalityPrior expects projected queries [batch, length, heads, head_dim]. "
                f"Received: query_shape={tuple(query_shape)}"
            )
        heads, head_dim = query_shape[2], query_shape[3]
        if self.trainable_gamma:
            self.gamma_weight = self.add_weight(
                name="gamma",
                shape=(heads,),
                initializer=keras.initializers.Constant(self.gamma),
                constraint=keras.constraints.NonNeg(),
            )
        if self.distance == "predicted":
            units = self.predictor_units or head_dim
            self.predictor_kernel = self.add_weight(
                name="predictor_kernel",
                shape=(head_dim, units),
                initializer=self._initializer(),
            )
            self.predictor_output = self.add_weight(
                name="predictor_output",
                shape=(units, 2),
                initializer=self._initializer(),
            )
        if self.beta == "gated":
            self.gate_kernel = self.add_weight(
                name="gate_kernel", shape=(head_dim, 1), initializer=self._initializer()
            )
            self.gate_bias = self.add_weight(name="gate_bias", shape=(1,), initializer="zeros")
        self.built = True

    def _initializer(self):
        return self.kernel_initializer.__class__.from_config(self.kernel_initializer.get_config())

    def _distance(self, query, key, query_positions, key_positions):
        """`G` in float32, `[1, 1, T, S]` or (predicted) `[B, H, T, S]`."""
        if self.distance != "predicted":
            offset = ops.cast(query_positions[:, None] - key_positions[None, :], "float32")
            if self.distance == "absolute":
                distance = ops.abs(offset)
            else:
                distance = ops.square(offset) / (2.0 * self.sigma**2)
            return distance[None, None]
        q = ops.cast(query, "float32")
        kernel = ops.cast(self.predictor_kernel, "float32")
        hidden = ops.tanh(ops.einsum("bthd,du->bthu", q, kernel))
        output = ops.cast(self.predictor_output, "float32")
        logits = ops.einsum("bthu,uk->bhtk", hidden, output)  # [B, H, T, 2]
        source_length = ops.cast(ops.shape(key)[1], "float32")
        mu = (source_length - 1.0) * ops.sigmoid(logits[..., 0:1])
        sigma = ops.maximum(source_length * ops.sigmoid(logits[..., 1:2]) / 2.0, MIN_SIGMA)
        j = ops.cast(key_positions, "float32")[None, None, None, :]
        return ops.square(mu - j) / (2.0 * ops.square(sigma))

    def penalty(self, query, key, query_positions, key_positions):
        """`P = min(γ·G, 10⁴)` in float32, broadcastable to `[B, H, T, S]`."""
        distance = self._distance(query, key, query_positions, key_positions)
        if self.trainable_gamma:
            gamma = ops.cast(self.gamma_weight, "float32")[None, :, None, None]
        else:
            gamma = self.gamma
        return ops.minimum(gamma * distance, MAX_PENALTY)

    def call(self, query, key, query_positions, key_positions):
        penalty = self.penalty(query, key, query_positions, key_positions)
        if self.form == "multiplicative":
            return ops.exp(ops.min(penalty, axis=-1, keepdims=True) - penalty)
        return -penalty

    def mix_weights(self, weights, query, key, query_positions, key_positions, mask=None):
        """`(1 − β)·weights + β·Softmax(−γ·G)`, the prior's softmax masked by `mask`."""
        penalty = self.penalty(query, key, query_positions, key_positions)
        prior = masked_softmax(-penalty, mask)
        if self.beta == "gated":
            q = ops.cast(query, "float32")
            gate = ops.einsum("bthd,dk->bhtk", q, ops.cast(self.gate_kernel, "float32"))
            beta = ops.sigmoid(gate + ops.cast(self.gate_bias, "float32"))  # [B, H, T, 1]
        else:
            beta = self.beta
        return (1.0 - beta) * ops.cast(weights, "float32") + beta * prior

    def compute_output_shape(self, query_shape, key_shape, *args):
        batch = query_shape[0] if self.distance == "predicted" else 1
        heads = query_shape[2] if self.distance == "predicted" or self.trainable_gamma else 1
        return (batch, heads, query_shape[1], key_shape[1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "form": self.form,
                "distance": self.distance,
                "gamma": self.gamma,
                "trainable_gamma": self.trainable_gamma,
                "sigma": self.sigma,
                "beta": self.beta,
                "predictor_units": self.predictor_units,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
