"""Train a character-level CausalLM on Shakespeare, then generate, save, reload and export.

This is `make demo`. It trains for three minutes (`--minutes`) with Keras's progress
bar, reports validation perplexity next to a unigram model's, samples text from a prompt,
saves a `.keras` file, reloads it (checking identical outputs) and exports a SavedModel
(TensorFlow and JAX backends; ONNX on PyTorch, see docs/export.md).

    KERAS_BACKEND=jax python examples/train_lm.py            # three minutes of training
    KERAS_BACKEND=torch python examples/train_lm.py --minutes 0.2 --output /tmp/lm
    KERAS_BACKEND=jax python examples/train_lm.py --experts 8   # MoE feedforwards
"""

import argparse
import os
import time

import keras
import numpy as np

import keras_xf
from keras_xf.training import TimeLimit
from keras_xf.training import language_model_examples


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="training time budget")
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--experts", type=int, default=0,
                        help="M > 0: a top-2 mixture of M experts (capacity factor 1.25) in "
                             "place of each feedforward, with the drop rate and expert load "
                             "reported after training")
    parser.add_argument("--max-characters", type=int, default=None,
                        help="use only the first N characters of the corpus")
    parser.add_argument("--sample-length", type=int, default=200)
    parser.add_argument("--prompt", default="ROMEO\n")
    parser.add_argument("--output", default="build/demo", help="where to save and export")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def encode(text):
    """UTF-8 bytes as ids (the mapping of keras-hub's ByteTokenizer; vocabulary 256)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype("int32")


def decode(ids):
    import keras_hub

    return keras_hub.tokenizers.ByteTokenizer().detokenize(np.asarray(ids, "int32"))


def unigram_perplexity(train_ids, valid_ids):
    counts = np.bincount(train_ids, minlength=256).astype("float64") + 1.0
    log_probs = np.log(counts / counts.sum())
    return float(np.exp(-log_probs[valid_ids].mean()))


def main():
    args = parse_args()
    keras.utils.set_random_seed(args.seed)
    text, corpus = keras_xf.datasets.load_text_corpus()
    if args.max_characters:
        text = text[: args.max_characters]
    ids = encode(text)
    split = int(len(ids) * 0.95)
    train_ids, valid_ids = ids[:split], ids[split:]
    print(f"backend: {keras.config.backend()}; corpus: {corpus}, {len(ids):,} characters")

    length = args.sequence_length
    x, y, _ = language_model_examples(train_ids, length, stride=length // 2)
    valid_x, valid_y, _ = language_model_examples(valid_ids, length)
    valid_x = {k: v[:64] for k, v in valid_x.items()}
    valid_y = valid_y[:64]

    block = keras_xf.layers.TransformerBlock(
        mixer=keras_xf.layers.MultiHeadAttention(num_heads=args.num_heads),
        feedforward=(
            keras_xf.layers.MixtureOfExperts(args.experts, 2 * args.hidden_dim, top_k=2,
                                             activation="gelu", capacity_factor=1.25)
            if args.experts else keras_xf.layers.FeedForward(4 * args.hidden_dim, activation="gelu")
        ),
        norm_placement="pre",
    )
    model = keras_xf.models.CausalLM(
        vocabulary_size=256,
        num_layers=args.num_layers,
        hidden_dim=args.hidden_dim,
        block=block,
        max_sequence_length=length + args.sample_length + 16,
        position="rotary",
    )
    import keras_hub

    model.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01, clipnorm=1.0),
        weighted_metrics=[keras_hub.metrics.Perplexity(from_logits=True, name="perplexity")],
    )
    print(f"model: {model.count_params():,} parameters")

    budget = args.minutes * 60
    steps_per_epoch = max(1, min(200, len(y) // args.batch_size))
    start = time.perf_counter()
    history = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=10_000,
        steps_per_epoch=steps_per_epoch,
        callbacks=[TimeLimit(budget)],
        verbose=1,
    )
    train_seconds = time.perf_counter() - start

    results = model.evaluate(valid_x, valid_y, batch_size=args.batch_size, verbose=0,
                             return_dict=True)
    baseline = unigram_perplexity(train_ids, valid_ids)
    print(f"trained for {train_seconds:.0f} s")
    print(f"validation perplexity: {results['perplexity']:.2f} (unigram model: {baseline:.2f})")
    if args.experts:
        # The routers' statistics over the last training epoch, one entry per layer.
        for key in sorted(k for k in history.history if k.endswith("/drop_rate")):
            loads = [history.history[key.replace("drop_rate", f"load_{i}")][-1]
                     for i in range(args.experts)]
            print(f"{key.rsplit('/', 1)[0]}: drop rate {history.history[key][-1]:.4f} at "
                  f"capacity factor 1.25, expert load {min(loads):.3f}..{max(loads):.3f}")

    prompt = encode(args.prompt)
    sample = model.generate(prompt, max_length=len(prompt) + args.sample_length,
                            sampler=keras_hub.samplers.TopKSampler(k=5, seed=args.seed))
    print("sample:\n" + decode(sample))

    os.makedirs(args.output, exist_ok=True)
    path = os.path.join(args.output, "causal_lm.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    difference = np.abs(reloaded.predict(valid_x, verbose=0) - model.predict(valid_x, verbose=0)).max()
    print(f"saved {path}; reloaded outputs differ by {difference:.2e}")

    from keras_xf import export

    if args.experts:
        # A mixture of experts sizes its expert buffers from the number of tokens
        # (C = ceil(1.25 * 2 * N / M)), which an export for any batch and length leaves symbolic.
        print("not exported: the mixture of experts needs a fixed batch and length to export")
    elif keras.config.backend() == "torch":
        # Keras cannot write a SavedModel from PyTorch (docs/export.md): export ONNX instead.
        onnx_path = os.path.join(args.output, "causal_lm.onnx")
        export.export_onnx(model, onnx_path)
        print(f"exported ONNX to {onnx_path}")
    else:
        export_path = os.path.join(args.output, f"saved_model_{keras.config.backend()}")
        export.export_saved_model(model, export_path)
        print(f"exported SavedModel to {export_path}")


if __name__ == "__main__":
    main()
