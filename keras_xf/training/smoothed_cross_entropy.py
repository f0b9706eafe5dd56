"""Label-smoothed sparse cross-entropy that ignores padding (survey §2.7)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_token_mask
from keras_xf.ops.checks import token_sample_weight


@keras.saving.register_keras_serializable(package="keras_xf")
class SmoothedSparseCrossEntropy(keras.losses.Loss):
    """`L = Σ_t m_t [(1−ε)(−log p_t(y_t)) + ε · (−(1/V) Σ_v log p_t(v))] / Σ_t m_t`.

    Token-level cross-entropy with label smoothing `ε`, averaged over real tokens only:
    `m_t = 0` where `y_t == pad_token_id` (and where a given `sample_weight` is 0). Computed
    in float32 whatever the logits' dtype.

    Args:
        label_smoothing: float in [0, 1).
        pad_token_id: int or `None` (no padding to ignore).
        from_logits: bool; `False` means `y_pred` are probabilities.
        name: loss name.

    Example:
    >>> model.compile("adam", loss=SmoothedSparseCrossEntropy(0.1, pad_token_id=0))
    """

    def __init__(self, label_smoothing=0.0, pad_token_id=0, from_logits=True,
                 name="smoothed_sparse_cross_entropy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        check_rate("label_smoothing", label_smoothing)
        if pad_token_id is not None and (
            isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)
        ):
            raise ValueError(
                f"pad_token_id must be an int or None. Received: pad_token_id={pad_token_id!r}"
            )
        self.label_smoothing = float(label_smoothing)
        self.pad_token_id = pad_token_id
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        """Per-token losses `[B, T]` (zero at padding)."""
        y_pred = ops.cast(y_pred, "float32")
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            log_probs = ops.log(ops.clip(y_pred, 1e-7, 1.0))
        y_true = ops.cast(y_true, "int32")
        nll = -ops.squeeze(ops.take_along_axis(log_probs, y_true[..., None], axis=-1), axis=-1)
        smooth = -ops.mean(log_probs, axis=-1)
        losses = (1.0 - self.label_smoothing) * nll + self.label_smoothing * smooth
        return losses * self._token_mask(y_true)

    def _token_mask(self, y_true):
        if self.pad_token_id is None:
            return ops.ones_like(y_true, dtype="float32")
        return ops.cast(ops.not_equal(y_true, self.pad_token_id), "float32")

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_true = ops.convert_to_tensor(y_true)
        # Labels [B, T] for logits [B, T, V]: one more label axis would broadcast silently.
        check_token_mask(y_true, y_pred, "y_true", "y_pred")
        if sample_weight is not None:
            sample_weight = token_sample_weight(sample_weight, y_true.shape)
        losses = self.call(y_true, y_pred)
        weights = self._token_mask(ops.cast(y_true, "int32"))
        if sample_weight is not None:
            weights = weights * sample_weight
        return ops.sum(losses * weights) / ops.maximum(ops.sum(weights), 1.0)

    def get_config(self):
        return {
            "name": self.name,
            "label_smoothing": self.label_smoothing,
            "pad_token_id": self.pad_token_id,
            "from_logits": self.from_logits,
        }
