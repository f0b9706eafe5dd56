"""Sparse cross-entropy that a language model computes from its hidden states, chunk by chunk
(survey §2.7, §5.4)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_token_mask
from keras_xf.ops.checks import token_sample_weight
from keras_xf.ops.cross_entropy import chunked_cross_entropy
from keras_xf.ops.keras_internals import scale_loss_for_distribution

REDUCTIONS = ("sum_over_batch_size", "mean", "sum", "mean_with_sample_weight")


@keras.saving.register_keras_serializable(package="keras_xf")
class ChunkedCrossEntropy(keras.losses.Loss):
    """`L = Σ_t c_t ℓ_t`, `ℓ_t = −log softmax(z_t)[y_t]` (label-smoothed:
    `(1−ε)(−log p_t(y_t)) + ε · (−(1/V) Σ_v log p_t(v))`), without the `[tokens, V]` logits.

    Given to `CausalLM.compile(loss=...)` (or as `loss="chunked_cross_entropy"`), training
    and evaluation stop the forward pass at the final hidden states `h_t`, and this loss
    forms the logits `z_t = h_t Eᵀ` of the tied output embedding `E` in chunks of
    `chunk_size` tokens (`keras_xf.ops.chunked_cross_entropy`): one `[chunk_size, V]` float32
    block exists at a time, in the forward and the backward pass. `predict`, `generate`
    and calling the model still return the logits. Compiled metrics are refused (they would
    need the logits); `fit` reports the loss.

    The value equals `keras.losses.SparseCategoricalCrossentropy(from_logits=True,
    ignore_class=..., reduction=...)` on the materialised float32 logits (with `ε = 0`): the
    coefficients `c_t` are the sample weights `s_t` (per token `[B, T]`, or per sequence
    `[B]`, which weighs each of its tokens alike), zero where `y_t == ignore_class`, divided by the token count
    (`"sum_over_batch_size"`, `"mean"`), by the count of tokens not ignored when
    `ignore_class` is set, by `Σ_t s_t m_t` (`"mean_with_sample_weight"`), or not at all
    (`"sum"`). With `ignore_class` equal to the padding id and no sample weights it equals
    `SmoothedSparseCrossEntropy(ε, pad_token_id)`.

    Applied to logits (`loss(y_true, logits)`, e.g. by a model that is not a `CausalLM`)
    it computes the same value the plain way.

    Args:
        chunk_size: int, tokens per chunk: the largest logits block is
            `[chunk_size, V]` float32.
        label_smoothing: float `ε` in [0, 1).
        ignore_class: int or `None`: targets with this id (e.g. padding) count for nothing.
        reduction: `"sum_over_batch_size"` (default), `"mean"`, `"sum"` or
            `"mean_with_sample_weight"`; per-token losses (`"none"`) are not formed.
        name: loss name.

    Example:
    >>> lm.compile(loss=ChunkedCrossEntropy(chunk_size=512, ignore_class=0))
    >>> lm.fit(x, y)
    """

    def __init__(self, chunk_size=1024, label_smoothing=0.0, ignore_class=None,
                 reduction="sum_over_batch_size", name="chunked_cross_entropy", dtype=None):
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"reduction must be one of {REDUCTIONS} (the chunked loss forms no per-token "
                f"losses). Received: reduction={reduction!r}"
            )
        if ignore_class is not None and (
            isinstance(ignore_class, bool) or not isinstance(ignore_class, int)
        ):
            raise ValueError(
                f"ignore_class must be an int or None. Received: ignore_class={ignore_class!r}"
            )
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.label_smoothing = float(check_rate("label_smoothing", label_smoothing))
        self.ignore_class = ignore_class

    def from_hidden(self, y_true, hidden, table, sample_weight=None, with_gradient=True):
        """The loss of hidden states `[B, T, d]` under the output embedding `table` `[V, d]`
        (logits `hidden · tableᵀ`), chunk by chunk; float32 scalar. `with_gradient=False`
        skips forming the gradient (evaluation)."""
        labels, weights = self._labels_and_weights(y_true, hidden, sample_weight, "hidden")
        return chunked_cross_entropy(hidden, table, labels, weights, chunk_size=self.chunk_size,
                                     label_smoothing=self.label_smoothing,
                                     with_gradient=with_gradient)

    def call(self, y_true, y_pred):
        """Per-token losses `ℓ_t` `[B, T]` of logits `y_pred` `[B, T, V]` (the plain form)."""
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        labels = ops.cast(y_true, "int32")
        losses = -ops.squeeze(ops.take_along_axis(log_probs, labels[..., None], axis=-1), axis=-1)
        if self.label_smoothing:
            epsilon = self.label_smoothing
            losses = (1.0 - epsilon) * losses - epsilon * ops.mean(log_probs, axis=-1)
        return losses

    def __call__(self, y_true, y_pred, sample_weight=None):
        labels, weights = self._labels_and_weights(y_true, y_pred, sample_weight, "y_pred")
        return ops.sum(self.call(labels, y_pred) * weights)

    def _labels_and_weights(self, y_true, y_pred, sample_weight, pred_name):
        """Labels (ignored ones replaced by 0, a valid id) and the coefficients `c_t`."""
        y_true = ops.convert_to_tensor(y_true)
        # Labels [B, T] for [B, T, ·] predictions: one more label axis would broadcast.
        check_token_mask(y_true, y_pred, "y_true", pred_name)
        labels = ops.cast(y_true, "int32")
        weights = ops.ones(ops.shape(labels), "float32")
        if sample_weight is not None:
            weights = weights * token_sample_weight(sample_weight, labels.shape)
        count = ops.cast(ops.size(labels), "float32")
        if self.ignore_class is not None:
            valid = ops.not_equal(labels, self.ignore_class)
            labels = ops.where(valid, labels, 0)
            mask = ops.cast(valid, "float32")
            weights = weights * mask
            count = ops.sum(mask)
        if self.reduction == "sum":
            return labels, weights
        if self.reduction == "mean_with_sample_weight" and (
            sample_weight is not None or self.ignore_class is not None
        ):
            count = ops.sum(weights)
        return labels, scale_loss_for_distribution(ops.divide_no_nan(weights, count))

    def get_config(self):
        return {
            "name": self.name,
            "reduction": self.reduction,
            "chunk_size": self.chunk_size,
            "label_smoothing": self.label_smoothing,
            "ignore_class": self.ignore_class,
        }
