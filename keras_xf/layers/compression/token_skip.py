"""Learned token skipping: a per-token skip decision around one encoder layer (survey §5.6)."""

import keras
from keras import ops

from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import with_dtype_policy
from keras_xf.layers.compression.token_pruning import check_keep_ratio
from keras_xf.layers.compression.token_pruning import gather_tokens
from keras_xf.layers.compression.token_pruning import score_weights
from keras_xf.layers.compression.token_pruning import select_tokens
from keras_xf.layers.compression.token_pruning import static_kept_count
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_probability
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.gates import GATES
from keras_xf.ops.gates import gated_update


def position_slots(indices, length):
    """The slot `j` with `indices[b, j] = i` for each position `i`, `-1` where there is none,
    int32 `[B, n]` (`indices` `[B, k]` distinct): only `[B, k, n]` integers are compared, so
    writing rows back is a gather, not a `[B, k, n, d]` product."""
    keep = indices.shape[1]
    hits = ops.equal(indices[:, :, None], ops.arange(length, dtype="int32")[None, None, :])
    numbers = ops.arange(1, keep + 1, dtype="int32")[None, :, None]
    return ops.sum(ops.cast(hits, "int32") * numbers, axis=1) - 1


def scatter_rows(values, rows, slots):
    """`values` `[B, n, ...]` with position `i` replaced by `rows[b, slots[b, i]]` where
    `slots[b, i] ≥ 0` (`position_slots`)."""
    taken = gather_tokens(rows, ops.maximum(slots, 0))
    present = slots >= 0
    if len(values.shape) == 3:
        present = present[:, :, None]
    return ops.where(present, taken, values)


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenSkip(keras.layers.Layer):
    """Runs a layer on the tokens that a learned classifier does not skip; skipped tokens pass
    through unchanged.

    Survey §5.6 (learning to skip, in the encoding stage where every token is given): a model
    `Pr(c | h_i)`, `c ∈ {skip, nonskip}`, decides for each token whether the layer may skip it.
    Here `Pr(nonskip | h_i) = p_i = σ(s_i)`, `s_i = h_i w + b` (a `Dense` to a scalar, in
    float32), and a token is skipped when `Pr(skip | h_i) = 1 − p_i > τ` (`threshold`; the
    default `τ = 0.5` is the survey's `Pr(skip) > Pr(nonskip)`, and a margin `θ` as in
    `Pr(skip) ≥ Pr(nonskip) + θ` is `τ = (1 + θ)/2`; `τ = 1` never skips).

    Static shapes (Mixture-of-Depths style): the layer runs on `k = ⌈c·n⌉` tokens only
    (`capacity` `c`, static `n`), the `k` real tokens of highest score gathered in their
    original order by `top_k` (padded tokens rank last and are never processed); the other
    `n − k` are skipped whatever their score. Among the `k`, the tokens skipped by the
    threshold are marked padding for the layer, so the processed tokens attend only among
    themselves (a skipped token is neither a query whose output is used nor a key). With
    `P` the processed set (gathered, real, not skipped) and `f` the layer applied to the
    gathered tokens under the mask `P`:

        h′_i = f(h)_i  if i ∈ P,   h′_i = h_i  otherwise.

    Training (the selection by `top_k` has no gradient; the scorer learns through a gate
    `g_i` in `h′_i = h_i + g_i · (f(h)_i − h_i)` on the gathered real tokens):
    - `gate="straight_through"` (default): `g_i = 1[i ∈ P] + p_i − sg(p_i)`, `sg` the
      stop-gradient: the outputs are those of inference exactly, and
      `∂L/∂s_i = σ′(s_i) · ⟨∂L/∂h′_i, f(h)_i − h_i⟩` reaches every gathered real token,
      including the ones the threshold skipped (their `f(h)_i` is computed anyway).
    - `gate="multiply"`: `g_i = p_i`, a soft decision: the threshold is not applied in
      training (every gathered real token is processed and mixed by its probability); at
      inference the hard rule above.

    Auxiliary loss (`target_rate = ρ*`): `λ · (mean_i p_i − ρ*)²` over the real tokens of the
    batch (`add_loss`, float32), which pushes the expected fraction of tokens the classifier
    processes towards `ρ*` (`capacity` bounds the fraction actually processed).

    Positions: the layer sees the processed tokens as a shorter sequence in their original
    order, so a position hook inside it (RoPE, relative biases) reads slot indices, not the
    original positions; give the model absolute position embeddings at its input. Use it in
    an encoder (a causal layer would still see the processed tokens in order, but a decoder's
    cache is not handled).

    Args:
        block: the wrapped layer (a `TransformerBlock`, or its serialised config), called as
            `block(x, padding_mask=..., training=...)` on `[B, k, d]` and returning
            `[B, k, d]`.
        capacity: float `c` in `(0, 1]`, the fraction of positions the layer may process.
        threshold: float `τ` in `[0, 1]`, skip when `Pr(skip | h_i) > τ`.
        gate: `"straight_through"` (default) or `"multiply"`.
        target_rate: optional float `ρ*` in `[0, 1]`, the target of the auxiliary loss.
        rate_loss_weight: float `λ ≥ 0`, the auxiliary loss's weight.
        kernel_initializer: initializer of the scorer's `w` (`b` starts at zero).
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, n, d]`, `n` static.
        padding_mask: optional boolean `[B, n]`; padded tokens are never processed and pass
            through unchanged (the mask of the outputs is the same).
        training: bool.
        return_processed: bool, also return the boolean mask `[B, n]` of processed tokens.

    Returns:
        `[B, n, d]`, or `{"outputs": [B, n, d], "processed": bool [B, n]}` with
        `return_processed=True`.

    In a model: the layer needs a static length, so an encoder is composed functionally
    (`TransformerBackbone` takes inputs of any length) with one `TokenSkip` per layer:

        ids = keras.Input((16,), dtype="int32")
        mask = keras.Input((16,), dtype="bool")
        h = TokenAndPositionEmbedding(100, 32, max_sequence_length=16)(ids)
        for _ in range(2):
            block = TransformerBlock(MultiHeadAttention(4), FeedForward(64))
            h = TokenSkip(block, capacity=0.5, target_rate=0.5)(h, padding_mask=mask)
        logits = ClassificationHead(3)(Pooling("mean")(h, padding_mask=mask))
        model = keras.Model([ids, mask], logits)  # trains with fit, saves as .keras

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(2), FeedForward(16))
    >>> skip = TokenSkip(block, capacity=0.5, target_rate=0.5)
    >>> y = skip(keras.random.normal((2, 6, 8)), padding_mask=np.arange(6) < np.array([[6], [3]]))
    """

    def __init__(self, block, capacity=1.0, threshold=0.5, gate="straight_through",
                 target_rate=None, rate_loss_weight=1.0, kernel_initializer="glorot_uniform",
                 **kwargs):
        super().__init__(**kwargs)
        block = as_layer(block, "block")
        # A dtype given to this layer reaches the (unbuilt) block it was given.
        policy = self.dtype_policy if kwargs.get("dtype") is not None else None
        self.block = with_dtype_policy(block, policy)
        self.capacity = check_keep_ratio("capacity", capacity)
        self.threshold = check_probability("threshold", threshold)
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}. Received: gate={gate!r}")
        self.gate = gate
        self.target_rate = None if target_rate is None else check_probability(
            "target_rate", target_rate)
        self.rate_loss_weight = float(check_positive_number(
            "rate_loss_weight", rate_loss_weight, allow_zero=True))
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.width = None

    def build(self, inputs_shape, padding_mask_shape=None):
        inputs_shape = tuple(inputs_shape)
        width = inputs_shape[-1]
        if len(inputs_shape) != 3 or not isinstance(width, int):
            raise ValueError(f"inputs must have shape [batch, length, dim] with a known dim. "
                             f"Received: inputs.shape={inputs_shape}")
        self.width = width
        self.kernel, self.bias = score_weights(self, width)
        length = inputs_shape[1]
        keep = None
        if isinstance(length, int):
            keep = static_kept_count(keras.KerasTensor(inputs_shape), self.capacity, "capacity")
        if not self.block.built:
            self.block.build((inputs_shape[0], keep, width))

    def call(self, inputs, padding_mask=None, training=None, return_processed=False):
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        keep = static_kept_count(inputs, self.capacity, "capacity")
        selection = select_tokens(inputs, padding_mask, self.kernel, self.bias, keep)
        indices, gathered, real = selection.indices, selection.tokens, selection.real
        nonskip = selection.probabilities  # Pr(nonskip | h_i), float32 [B, k]
        soft = bool(training) and self.gate == "multiply"
        processed = real
        if not soft:
            skip = ops.greater(1.0 - nonskip, self.threshold)
            processed = ops.logical_and(real, ops.logical_not(skip))
        updated = self.block(gathered, padding_mask=processed, training=training)
        if not (ops.is_tensor(updated) or isinstance(updated, keras.KerasTensor)):
            raise ValueError("block must return one tensor [batch, length, dim]. Received: "
                             f"block returned a {type(updated).__name__}")
        # h′ = h + g·(f(h) − h): g = p (soft), or 1[processed] + p − sg(p).
        rows = gated_update(gathered, updated, nonskip[:, :, None], processed[:, :, None],
                            real[:, :, None], self.gate, bool(training))
        slots = position_slots(indices, inputs.shape[1])
        outputs = scatter_rows(inputs, rows, slots)
        self._add_rate_loss(selection.scores, selection.valid)
        if not return_processed:
            return outputs
        processed = scatter_rows(ops.zeros_like(selection.valid, "int32"),
                                 ops.cast(processed, "int32"), slots)
        return {"outputs": outputs, "processed": ops.cast(processed, "bool")}

    def _add_rate_loss(self, scores, valid):
        """`λ · (mean p − ρ*)²` over the real tokens."""
        if self.target_rate is None or self.rate_loss_weight == 0:
            return
        weights = ops.cast(valid, "float32")
        rate = ops.sum(ops.sigmoid(scores) * weights) / ops.maximum(ops.sum(weights), 1.0)
        self.add_loss(self.rate_loss_weight * ops.square(rate - self.target_rate))

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, padding_mask=None, training=None,
                            return_processed=False):
        check_sequence_width(inputs, self.width)
        check_padding_mask(padding_mask, inputs)
        static_kept_count(inputs, self.capacity, "capacity")
        outputs = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if not return_processed:
            return outputs
        return {"outputs": outputs,
                "processed": keras.KerasTensor(inputs.shape[:2], dtype="bool")}

    def get_config(self):
        config = super().get_config()
        config.update({
            "block": keras.saving.serialize_keras_object(self.block),
            "capacity": self.capacity,
            "threshold": self.threshold,
            "gate": self.gate,
            "target_rate": self.target_rate,
            "rate_loss_weight": self.rate_loss_weight,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        })
        return config
