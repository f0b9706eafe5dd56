"""RK2 and RK4 sub-layers (survey §4.3) against the plain pre-norm residual at equal parameter
count: character-level language models on the Shakespeare corpus (issue 25).

Every model is a `CausalLM` with the same embedding, width, depth, mixer and feedforward; the
RK blocks share their weights across stages (the survey's form), so all three have exactly
the same parameters and differ only in how many times each sub-layer's function is evaluated
(1, 2 or 4) and how the evaluations combine. Each trains the same number of steps on the same
batches (same seed) and reports its validation loss (nats per character) and its training time
relative to the plain model, measured in this process after the first (compiling) step.

    KERAS_BACKEND=jax python -m benchmarks.runge_kutta_lm [--steps 300]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import keras_xf
from benchmarks import measure
from keras_xf.training import language_model_examples

METHODS = ("plain", "rk2", "rk4")


def encode(text):
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype("int32")


class StepTimer(keras.callbacks.Callback):
    """Seconds from the end of the first step (which compiles) to the end of training."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def make_model(method, args):
    mixer = keras_xf.layers.MultiHeadAttention(args.heads)
    feedforward = keras_xf.layers.FeedForward(4 * args.width, activation="gelu")
    if method == "plain":
        block = keras_xf.layers.TransformerBlock(mixer, feedforward, norm_placement="pre")
    else:
        block = keras_xf.layers.RungeKuttaBlock(mixer, feedforward, method=method)
    return keras_xf.models.CausalLM(vocabulary_size=256, num_layers=args.layers,
                                    hidden_dim=args.width, block=block,
                                    max_sequence_length=args.length, position="rotary")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()

    text, corpus = keras_xf.datasets.load_text_corpus()
    ids = encode(text[:2_000_000])
    split = int(len(ids) * 0.95)
    x, y, _ = language_model_examples(ids[:split], args.length)
    valid_x, valid_y, _ = language_model_examples(ids[split:], args.length)
    valid_x = {k: v[:256] for k, v in valid_x.items()}
    valid_y = valid_y[:256]
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))[: args.steps * args.batch]
    x = {k: v[order] for k, v in x.items()}
    y = y[order]
    print(f"backend {keras.config.backend()}, CPU {measure.cpu_name()}; corpus {corpus}; "
          f"{args.layers} layers, width {args.width}, {args.steps} steps of {args.batch} x "
          f"{args.length} characters")

    results = {}
    for method in args.methods.split(","):
        keras.utils.set_random_seed(0)
        model = make_model(method, args)
        model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01,
                                                       clipnorm=1.0))
        timer = StepTimer()
        history = model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                            callbacks=[timer])
        seconds = timer.seconds
        valid = model.evaluate(valid_x, valid_y, batch_size=64, verbose=0)
        results[method] = (model.count_params(), history.history["loss"][-1], valid, seconds)

    plain_seconds = results.get("plain", next(iter(results.values())))[3]
    for method, (params, train_loss, valid_loss, seconds) in results.items():
        print(f"{method:>5}: {params:,} parameters, train loss {train_loss:.3f} (epoch mean), "
              f"validation loss {float(np.ravel(valid_loss)[0]):.3f} nats/char, time x"
              f"{seconds / plain_seconds:.2f} of plain")


if __name__ == "__main__":
    main()
