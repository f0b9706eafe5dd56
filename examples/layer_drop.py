"""Layer drop in training, then half the layers removed at inference (survey §4.2.4).

Trains the same character-level CausalLM on Shakespeare twice, from the same initial
weights and batches: once with layer drop (each layer skipped with probability `p` per
example in training; the survey's rescaling by `ρ = 1 − p` at inference) and once without.
Then every other layer is removed (`keras_xf.surgery.prune_layers`) and the validation loss
(cross-entropy in nats per character) is reported for all four models.

    KERAS_BACKEND=jax python examples/layer_drop.py                 # 8 layers, 400 steps
    KERAS_BACKEND=jax python examples/layer_drop.py --steps 20 --num-layers 2
"""

import argparse
import time

import keras
import numpy as np

import keras_xf
from keras_xf.training import language_model_examples


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer-drop", type=float, default=0.2)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--max-characters", type=int, default=2_000_000)
    parser.add_argument("--eval-examples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=0)
    return parser.parse_args()


def encode(text):
    """UTF-8 bytes as ids (vocabulary 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype("int32")


def build_model(args, layer_drop):
    keras.utils.set_random_seed(args.seed)  # equal initial weights for both models
    block = keras_xf.layers.TransformerBlock(
        mixer=keras_xf.layers.MultiHeadAttention(num_heads=args.num_heads),
        feedforward=keras_xf.layers.FeedForward(4 * args.hidden_dim, activation="gelu"),
        norm_placement="pre",
    )
    options = {"layer_drop": layer_drop, "layer_drop_seed": args.seed} if layer_drop else None
    return keras_xf.models.CausalLM(
        vocabulary_size=256, num_layers=args.num_layers, hidden_dim=args.hidden_dim,
        block=block, max_sequence_length=args.sequence_length, position="rotary",
        stack_options=options,
    )


def compile_model(model, args):
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01,
                                                   clipnorm=1.0),
                  weighted_metrics=[])


def main():
    args = parse_args()
    start = time.perf_counter()
    text, corpus = keras_xf.datasets.load_text_corpus()
    ids = encode(text[: args.max_characters])
    split = int(len(ids) * 0.9)
    x, y, _ = language_model_examples(ids[:split], args.sequence_length,
                                      stride=args.sequence_length // 2)
    valid_x, valid_y, _ = language_model_examples(ids[split:], args.sequence_length)
    valid_x = {k: v[: args.eval_examples] for k, v in valid_x.items()}
    valid_y = valid_y[: args.eval_examples]
    order = np.random.default_rng(args.seed).permutation(len(y))
    order = np.resize(order, args.steps * args.batch_size)  # equal batches for both models
    x = {k: v[order] for k, v in x.items()}
    y = y[order]
    print(f"backend: {keras.config.backend()}; corpus: {corpus}; {args.num_layers} layers, "
          f"width {args.hidden_dim}, {args.steps} steps of {args.batch_size} x "
          f"{args.sequence_length} characters")

    kept = list(range(0, args.num_layers, 2))
    results = {}
    for name, rate in (("layer drop %.2f" % args.layer_drop, args.layer_drop),
                       ("no layer drop", 0.0)):
        model = build_model(args, rate)
        compile_model(model, args)
        model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False,
                  verbose=args.verbose)
        full = model.evaluate(valid_x, valid_y, batch_size=args.batch_size, verbose=0)
        pruned = keras_xf.surgery.prune_layers(model, kept)
        compile_model(pruned, args)
        half = pruned.evaluate(valid_x, valid_y, batch_size=args.batch_size, verbose=0)
        results[name] = (full, half)
    print(f"validation loss (nats/char), all {args.num_layers} layers | layers {kept} only:")
    for name, (full, half) in results.items():
        print(f"  {name:>16}: {full:.4f} | {half:.4f}")
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
