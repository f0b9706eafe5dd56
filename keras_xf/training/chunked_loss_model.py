"""Training and evaluating a language model with a `ChunkedCrossEntropy`: the forward pass of
`fit` and `evaluate` stops at the final hidden states, and the loss forms the logits chunk by
chunk (survey §2.7, §5.4)."""

import contextlib

from keras import ops

from keras_xf.training.chunked_cross_entropy import ChunkedCrossEntropy


class ChunkedLossModel:
    """A Keras model whose logits are `z = float32(h · Eᵀ)`, its final hidden states `h`
    times an output table `E`, and nothing more; compiled with a `ChunkedCrossEntropy`, it
    trains and evaluates without forming its `[B, T, V]` logits.

    Mixed in before the model's base class (`class CausalLM(ChunkedLossModel,
    GenerativeTask)`); the class declares
    - `final_hidden_states(inputs, training=None)`: `h` `[B, T, d]`;
    - `output_table()`: `E` `[V, d]` in the compute dtype.

    In a `train_step` or `test_step` of the model compiled with a `ChunkedCrossEntropy`,
    `call` returns `h` and `compute_loss` gives `loss.from_hidden(y, h, E)` plus the
    model's added losses; `predict`, `generate` and plain calls are not affected. The
    switch is a count of the steps being traced or run, read in Python while tracing: a
    count rather than a flag, since TensorFlow's distribution strategies trace one replica
    per thread and the replicas' steps interleave.
    """

    # Train or test steps of this model under way with a `ChunkedCrossEntropy`.
    _chunked_loss_steps = 0

    @contextlib.contextmanager
    def _chunked_loss_step(self):
        if not isinstance(self.loss, ChunkedCrossEntropy):
            yield
            return
        self._chunked_loss_steps += 1
        try:
            yield
        finally:
            self._chunked_loss_steps -= 1

    def train_step(self, *args, **kwargs):
        with self._chunked_loss_step():
            return super().train_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        with self._chunked_loss_step():
            return super().test_step(*args, **kwargs)

    def call(self, inputs, training=None, mask=None, **kwargs):
        if self._chunked_loss_steps:
            return self.final_hidden_states(inputs, training=training)
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' `compute_loss`; in a `ChunkedCrossEntropy` step `y_pred` holds the hidden
        states, and the loss (its gradient formed with it when `training`) comes from them
        and the output table, plus the model's added losses as Keras adds them."""
        if not self._chunked_loss_steps:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        losses = [self.loss.from_hidden(y, y_pred, self.output_table(), sample_weight,
                                        with_gradient=bool(training))]
        losses.extend(self._aggregate_additional_loss(loss) for loss in self.losses)
        return losses[0] if len(losses) == 1 else ops.sum(ops.stack(losses))


def chunked_loss_metrics(model, weighted_metrics, metrics=None, loss_weights=None, **kwargs):
    """The `weighted_metrics` of `model.compile(loss=ChunkedCrossEntropy(...), ...)`
    (`"auto"`: none), after checking that `model` is a `ChunkedLossModel` and that no other
    metric or loss weight is given: training never forms the logits that metrics read.

    Raises:
        ValueError: naming the task, or the argument that cannot be used.
    """
    if not isinstance(model, ChunkedLossModel):
        raise ValueError(
            "loss=ChunkedCrossEntropy needs a task whose logits are its output embedding "
            "reversed (CausalLM). Received: loss=ChunkedCrossEntropy for "
            f"{type(model).__name__}"
        )
    if isinstance(weighted_metrics, str) and weighted_metrics == "auto":
        weighted_metrics = None
    for name, value in (("metrics", metrics), ("weighted_metrics", weighted_metrics),
                        ("loss_weights", loss_weights)):
        if value is not None and not (isinstance(value, (list, tuple, dict)) and not value):
            raise ValueError(
                f"{name} cannot be used with loss=ChunkedCrossEntropy: training never forms "
                "the logits that metrics read. Leave it out (fit reports the loss), or "
                f"compile with a plain loss to compute metrics. Received: {name}={value!r}"
            )
    return weighted_metrics
