"""Transformer-XL's memory, and a compressive long-term memory behind it, on a
character-level language model of Shakespeare (survey §5.2.1, §5.2.2).

Models of the same size are trained for the same number of epochs over the same
characters, and compared by validation perplexity:
- **memory**: chunks of `--chunk-length` characters, each layer attending to its chunk and to
  a memory of the `--memory-length` positions before it (`MemoryAttention`), the text laid out
  as a stream (`stream_examples`) and the memory carried from batch to batch;
- **compressive**: the memory model with, behind its memory, a long-term memory of
  `--compressed-length` slots into which the positions the memory lets go are averaged in
  groups of `--compression-rate` (`CompressiveMemoryAttention`);
- **no memory**: the same chunks, each read on its own (shuffled);
- **stream order**: the same chunks read on their own, in the memory model's batch order
  (not shuffled), the control for that order;
- **window**: windows of `chunk_length + memory_length` characters read on their own, so each
  token's attention covers as many keys on average as in the memory model, at the same
  attention cost per token (`T·(M + T)` scores per `T` tokens against `(M + T)²` per
  `M + T`).

Then each model with a memory reads the validation stream once more, and the time and
resident memory of each chunk are reported for the first and the last quarter of the stream:
fixed-size memories keep both flat however long the stream.

    KERAS_BACKEND=jax python examples/memory_lm.py
    KERAS_BACKEND=torch python examples/memory_lm.py --train-characters 20000 --epochs 1
"""

import argparse
import json
import os
import time

import keras
import numpy as np

import keras_xf
from keras_xf import layers as xf
from keras_xf.training import StreamMemory
from keras_xf.training import language_model_examples
from keras_xf.training import stream_examples


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-characters", type=int, default=1_000_000)
    parser.add_argument("--valid-characters", type=int, default=100_000)
    parser.add_argument("--chunk-length", type=int, default=64)
    parser.add_argument("--memory-length", type=int, default=64)
    parser.add_argument("--compressed-length", type=int, default=32)
    parser.add_argument("--compression-rate", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--position", choices=["rotary", "alibi"], default="rotary",
                        help="relative positions in the attention (each window restarts at 0)")
    parser.add_argument("--models",
                        default="memory,compressive,stream order,no memory,window")
    parser.add_argument("--output", default=None, help="a JSON file for the results")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def encode(text):
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype("int32")


STREAMED = ("memory", "compressive", "stream order")  # read in stream order, not shuffled


def build(args, name):
    if args.position == "rotary":
        attention = xf.MultiHeadAttention(num_heads=args.num_heads,
                                          position=xf.RotaryEmbedding())
    else:
        attention = xf.MultiHeadAttention(num_heads=args.num_heads, biases=[xf.AlibiBias()])
    mixer = attention
    if name == "memory":
        mixer = xf.MemoryAttention(attention, memory_length=args.memory_length, stateful=True,
                                   batch_size=args.batch_size)
    elif name == "compressive":
        mixer = xf.CompressiveMemoryAttention(
            attention, memory_length=args.memory_length,
            compressed_length=args.compressed_length, compression_rate=args.compression_rate,
            stateful=True, batch_size=args.batch_size)
    block = xf.TransformerBlock(mixer, xf.FeedForward(4 * args.hidden_dim, activation="gelu"),
                                norm_placement="pre")
    model = keras_xf.models.CausalLM(
        vocabulary_size=256, num_layers=args.num_layers, hidden_dim=args.hidden_dim,
        block=block, position="none",
        max_sequence_length=args.chunk_length + args.memory_length + args.compressed_length)
    import keras_hub

    model.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01, clipnorm=1.0),
        weighted_metrics=[keras_hub.metrics.Perplexity(from_logits=True, name="perplexity")])
    return model


def data(args, name, ids):
    if name in STREAMED:
        x, y, _ = stream_examples(ids, args.batch_size, args.chunk_length)
        return x, y
    length = args.chunk_length + (args.memory_length if name == "window" else 0)
    x, y, _ = language_model_examples(ids, length)
    usable = len(y) // args.batch_size * args.batch_size  # whole batches, as the stream's
    return {k: v[:usable] for k, v in x.items()}, y[:usable]


def train_and_evaluate(args, name, train_ids, valid_ids):
    keras.utils.set_random_seed(args.seed)
    model = build(args, name)
    x, y = data(args, name, train_ids)
    valid_x, valid_y = data(args, name, valid_ids)
    callbacks = [StreamMemory()] if name in ("memory", "compressive") else []
    start = time.perf_counter()
    model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
              shuffle=name not in STREAMED,
              callbacks=callbacks, verbose=0)
    seconds = time.perf_counter() - start
    result = model.evaluate(valid_x, valid_y, batch_size=args.batch_size, verbose=0,
                            callbacks=callbacks, return_dict=True)
    early, late = perplexity_by_position(args, model, valid_x, valid_y)
    print(f"{name:<12} validation perplexity {result['perplexity']:.3f} (first "
          f"{args.chunk_length // 4} positions of each sequence {early:.3f}, the others "
          f"{late:.3f}; {len(y) * y.shape[1]:,} training characters an epoch, {args.epochs} "
          f"epochs, {seconds:.0f} s)", flush=True)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    return model, {"perplexity": result["perplexity"], "first_positions_perplexity": early,
                   "other_positions_perplexity": late, "train_seconds": seconds,
                   "trainable_parameters": trainable}


def perplexity_by_position(args, model, x, y):
    """Perplexity over the first quarter of a chunk's positions of every sequence (where a
    model without memory has the least context) and over the others."""
    keras_xf.layers.memory.reset_memories(model)
    logits = model.predict(x, batch_size=args.batch_size, verbose=0).astype("float64")
    logits -= logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    losses = -np.take_along_axis(log_probs, y[..., None], axis=-1)[..., 0]
    split = args.chunk_length // 4
    return float(np.exp(losses[:, :split].mean())), float(np.exp(losses[:, split:].mean()))


def resident_mb():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def flat_over_the_stream(args, name, model, valid_ids):
    """Reads the validation stream batch by batch (each call carrying the memory to the next,
    its outputs dropped) and reports the time and resident memory of the calls in the first
    and the last quarter of the stream."""
    x, _ = data(args, "memory", valid_ids)
    keras_xf.layers.memory.reset_memories(model)
    times, memory = [], []
    for start in range(0, len(x["token_ids"]), args.batch_size):
        batch = {k: v[start:start + args.batch_size] for k, v in x.items()}
        begin = time.perf_counter()
        keras.ops.convert_to_numpy(model(batch, training=False))
        times.append(time.perf_counter() - begin)
        memory.append(resident_mb())
    quarter = max(1, len(times) // 4)
    first, last = slice(1, quarter + 1), slice(-quarter, None)  # the first call compiles
    report = {"chunks": len(times),
              "first_quarter_ms": 1000 * float(np.median(times[first])),
              "last_quarter_ms": 1000 * float(np.median(times[last])),
              "first_quarter_rss_mb": float(np.median(memory[first])),
              "last_quarter_rss_mb": float(np.median(memory[last]))}
    print(f"{name} model over the validation stream ({report['chunks']} batches): "
          f"{report['first_quarter_ms']:.1f} ms a batch in the first quarter, "
          f"{report['last_quarter_ms']:.1f} ms in the last; resident "
          f"{report['first_quarter_rss_mb']:.0f} MB, then {report['last_quarter_rss_mb']:.0f} MB")
    return report


def main():
    args = parse_args()
    start = time.perf_counter()
    text, corpus = keras_xf.datasets.load_text_corpus()
    ids = encode(text[: args.train_characters + args.valid_characters])
    train_ids, valid_ids = ids[: args.train_characters], ids[args.train_characters:]
    print(f"backend: {keras.config.backend()}; corpus: {corpus}; chunks of "
          f"{args.chunk_length}, memory of {args.memory_length}", flush=True)
    results, stateful = {}, {}
    for name in args.models.split(","):
        model, results[name] = train_and_evaluate(args, name, train_ids, valid_ids)
        if name in ("memory", "compressive"):
            stateful[name] = model
    for name, model in stateful.items():
        results[f"flat {name}"] = flat_over_the_stream(args, name, model, valid_ids)
    if args.output:
        with open(args.output, "w") as file:
            json.dump({"backend": keras.config.backend(), "arguments": vars(args),
                       "results": results}, file, indent=1)
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
