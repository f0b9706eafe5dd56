"""Sequence compression in a causal language model: loss against speed (survey §5.8).

What it shows: byte-level language models on Shakespeare with the same layers, where a
`CompressedStack` runs the middle layers on a sequence shortened by a strided convolution
(`Downsample`, stride `s`) and brings it back (`Upsample`, plus the full-length states), against
the plain `TransformerStack` that runs every layer at full length. The template's causal
attention makes the compressed stack causal (states shifted right by `k − 1` before
downsampling, as in the Hourglass Transformer), so it trains as a next-byte model. Each model
trains for the same steps on the same batches; printed: held-out loss (bits per byte), accuracy,
and forward and training-step throughput measured side by side (indicative: on a shared machine
they move with the load), written to a JSON file.

Results with the defaults on JAX (`benchmarks/results/sequence_compression_lm_jax.json`: 4
pre-norm layers of width 128, sequence 256, `CompressedStack((1, 2, 1))` at stride 2 and 4, 600
steps): the compressed models train 1.27× and 1.53× as many tokens a second and run forward
1.31× and 1.39× as fast as the plain stack, and at this short training reach a lower held-out
loss (2.93 and 3.11 bits per byte against 3.47). The convolution adds a local mixing step and
4–8 % weights, so the loss comparison says the compression costs nothing here, not that it
helps in general.

    KERAS_BACKEND=jax python examples/sequence_compression_lm.py
    python examples/sequence_compression_lm.py --strides 2 --steps 2 --batch-size 4 \\
        --sequence-length 16 --hidden-dim 16 --num-heads 2 --eval-examples 8 \\
        --max-characters 20000 --timing-repeats 1 --results /tmp/c.json
"""

import argparse
import json
import math
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
from keras_xf.layers import CompressedStack  # noqa: E402
from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import TokenAndPositionEmbedding  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.layers import TransformerStack  # noqa: E402
from keras_xf.training import language_model_examples  # noqa: E402
from train_lm import encode  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strides", type=int, nargs="+", default=[2, 4],
                        help="one compressed model per stride s (kernel size s)")
    parser.add_argument("--num-layers", type=int, nargs=3, default=[1, 2, 1],
                        help="layers before downsampling, compressed, after upsampling; the "
                             "plain model has their sum")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=256)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--max-characters", type=int, default=2_000_000)
    parser.add_argument("--timing-repeats", type=int, default=10,
                        help="timed calls per model (the fastest counts)")
    parser.add_argument("--results", default=None,
                        help="JSON file (default benchmarks/results/"
                             "sequence_compression_lm_<backend>.json)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_model(args, stride=None):
    """Bytes → learned positions → stack → tied output; `stride` `None` is the plain stack."""
    keras.utils.set_random_seed(args.seed)
    block = TransformerBlock(MultiHeadAttention(args.num_heads, causal=True),
                             FeedForward(4 * args.hidden_dim, activation="gelu"),
                             norm_placement="pre")
    if stride is None:
        stack = TransformerStack(block, sum(args.num_layers), name="stack")
    else:
        stack = CompressedStack(block, args.num_layers, stride=stride, name="stack")
    ids = keras.Input((args.sequence_length,), dtype="int32", name="token_ids")
    embedding = TokenAndPositionEmbedding(256, args.hidden_dim, position="learned",
                                          max_sequence_length=args.sequence_length,
                                          name="embeddings")
    logits = embedding(stack(embedding(ids)), reverse=True)
    model = keras.Model(ids, logits)
    model.compile(
        optimizer=keras.optimizers.AdamW(keras.optimizers.schedules.CosineDecay(
            0.0, args.steps, alpha=0.1, warmup_target=args.learning_rate,
            warmup_steps=max(1, args.steps // 10)), weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model


def main():
    args = parse_args()
    start = time.time()
    text, corpus = keras_xf.datasets.load_text_corpus()
    ids = encode(text[:args.max_characters])
    split = int(len(ids) * 0.95)
    x, y, _ = language_model_examples(ids[:split], args.sequence_length,
                                      stride=args.sequence_length // 2)
    valid_x, valid_y, _ = language_model_examples(ids[split:], args.sequence_length)
    valid_x, valid_y = valid_x["token_ids"][:args.eval_examples], valid_y[:args.eval_examples]
    order = np.resize(np.random.default_rng(args.seed).permutation(len(y)),
                      args.steps * args.batch_size)  # the same batches for every model
    x, y = x["token_ids"][order], y[order]
    print(f"{corpus}: {len(ids):,} bytes; {args.steps} steps of {args.batch_size} x "
          f"{args.sequence_length}; layers {args.num_layers}; {len(valid_y)} held-out windows")

    runs = []
    for stride in [None, *args.strides]:
        model = build_model(args, stride)
        begin = time.perf_counter()
        model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0)
        seconds = time.perf_counter() - begin
        loss, accuracy = model.evaluate(valid_x, valid_y, batch_size=args.batch_size,
                                        verbose=0)
        runs.append({"stride": stride, "model": model, "weights": model.count_params(),
                     "train_seconds": seconds, "loss": float(loss),
                     "bits_per_byte": float(loss) / math.log(2), "accuracy": float(accuracy)})

    batch_x, batch_y = valid_x[:args.batch_size], valid_y[:args.batch_size]
    tokens = batch_x.size
    forward = fastest_seconds([partial(run["model"].predict_on_batch, batch_x)
                               for run in runs], args.timing_repeats)
    training = fastest_seconds([partial(run["model"].train_on_batch, batch_x, batch_y)
                                for run in runs], args.timing_repeats)
    print(f"\n{'model':>14s} {'weights':>8s} {'bits/byte':>9s} {'accuracy':>8s} "
          f"{'forward tok/s':>13s} {'speed-up':>8s} {'train tok/s':>11s} {'speed-up':>8s}")
    for run, f, t in zip(runs, forward, training):
        run.update(forward_tokens_per_second=tokens / f, train_tokens_per_second=tokens / t,
                   forward_speedup=forward[0] / f, train_speedup=training[0] / t)
        name = "plain" if run["stride"] is None else f"stride {run['stride']}"
        print(f"{name:>14s} {run['weights']:8d} {run['bits_per_byte']:9.3f} "
              f"{run['accuracy']:8.3f} {run['forward_tokens_per_second']:13.0f} "
              f"{run['forward_speedup']:7.2f}x {run['train_tokens_per_second']:11.0f} "
              f"{run['train_speedup']:7.2f}x")

    path = args.results or os.path.join(
        "benchmarks", "results", f"sequence_compression_lm_{keras.backend.backend()}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as file:
        json.dump({"backend": keras.backend.backend(), "corpus": corpus,
                   "arguments": {k: v for k, v in vars(args).items() if k != "results"},
                   "timing_note": "tokens per second of the fastest of timing_repeats calls "
                                  "at the training batch, the models alternating: indicative",
                   "runs": [{k: v for k, v in run.items() if k != "model"} for run in runs]},
                  file, indent=1)
    print(f"wrote {path}")
    print(f"time: {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
