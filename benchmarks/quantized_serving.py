"""int8 against float32: size, accuracy and speed of a `CausalLM` after `model.quantize("int8")`.

    KERAS_BACKEND=jax python -m benchmarks.quantized_serving [--steps 300] [--note "..."]

A character-level `CausalLM` (2 layers, width 128, 4 heads, FFN 512, sinusoidal positions,
tied embeddings) is trained for `--steps` AdamW steps on Shakespeare (`load_text_corpus`,
windows of 64 characters; the last tenth of the text is held out), saved as `.keras`, reloaded
twice, and one copy is quantised with `model.quantize("int8")` (Keras quantises the `Dense` and
`EinsumDense` layers: attention projections and feedforward, weights and activations per
channel / per token; keras_xf's tied `TokenEmbedding` table, one scale per token). On held-out
windows:

- size: bytes of the weights in memory (every variable: int8 kernels and tables with their
  float32 scales, float32 norms and biases) and of each model's `.keras` file (no optimizer);
- the largest |logit difference| and its ratio to the largest |logit|;
- next-token accuracy of each model, and how often their argmax agrees;
- greedy `generate` of `--new-tokens` characters from held-out prompts: the fraction of
  generated tokens equal between the two models, and of rows equal throughout.

Speed, in one process with the calls of both models interleaved (after warm-up): forward
tokens/s of `predict_on_batch` on `[8, 64]`, and greedy `generate` tokens/s at batch 1 and 8;
on TensorFlow and JAX also the exported SavedModel's `generate` endpoint for both models.
Ratios are int8 / float32 (above 1: int8 faster). Writes
`benchmarks/results/quantized_serving_<backend>.json`. Never run by the test suite.
"""

import argparse
import json
import os
import pathlib
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

VOCAB_SIZE, LAYERS, WIDTH, HEADS, FFN, WINDOW = 128, 2, 128, 4, 512, 64


def windows(codes, count, rng):
    starts = rng.integers(0, len(codes) - WINDOW - 1, size=count)
    return np.stack([codes[s:s + WINDOW + 1] for s in starts])


def train(args, codes, rng):
    from keras_xf.models import CausalLM

    model = CausalLM(vocabulary_size=VOCAB_SIZE, num_layers=LAYERS, hidden_dim=WIDTH,
                     num_heads=HEADS, intermediate_dim=FFN,
                     max_sequence_length=WINDOW + args.new_tokens, norm_placement="pre")
    model.compile(optimizer=keras.optimizers.AdamW(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = windows(codes, args.steps * 16, rng)
    x = {"token_ids": data[:, :-1], "padding_mask": np.ones_like(data[:, :-1])}
    history = model.fit(x, data[:, 1:], batch_size=16, epochs=1, verbose=0)
    return model, float(history.history["loss"][-1])


def accuracy(models, codes, rng, args):
    data = windows(codes, 64, rng)
    x = {"token_ids": data[:, :-1], "padding_mask": np.ones_like(data[:, :-1])}
    logits = {name: np.asarray(m.predict(x, batch_size=16, verbose=0), "float32")
              for name, m in models.items()}
    labels = data[:, 1:]
    predictions = {name: value.argmax(-1) for name, value in logits.items()}
    difference = np.abs(logits["int8"] - logits["float32"])
    prompts = windows(codes, 8, rng)[:, :args.prompt]
    width = args.prompt + args.new_tokens
    ids = np.zeros((len(prompts), width), "int32")
    ids[:, :args.prompt] = prompts
    mask = np.zeros_like(ids)
    mask[:, :args.prompt] = 1
    generated = {name: np.asarray(m.generate({"token_ids": ids, "padding_mask": mask},
                                             stop_token_ids=None)["token_ids"])[:, args.prompt:]
                 for name, m in models.items()}
    equal = generated["int8"] == generated["float32"]
    return {
        "max_abs_logit_difference": float(difference.max()),
        "mean_abs_logit_difference": float(difference.mean()),
        "max_abs_logit": float(np.abs(logits["float32"]).max()),
        "next_token_accuracy_float32": float((predictions["float32"] == labels).mean()),
        "next_token_accuracy_int8": float((predictions["int8"] == labels).mean()),
        "argmax_agreement": float((predictions["int8"] == predictions["float32"]).mean()),
        "greedy_token_agreement": float(equal.mean()),
        "greedy_rows_equal": int(equal.all(axis=1).sum()),
        "greedy_rows": int(len(equal)),
    }


def size(models, folder):
    """Bytes of the weights in memory and of the `.keras` file, float32 and int8."""
    from benchmarks import measure

    results = {}
    for name, model in models.items():
        path = folder / f"lm_{name}.keras"
        model.save(str(path))
        results[f"weight_bytes_{name}"] = measure.weight_bytes(model)
        results[f"keras_file_bytes_{name}"] = os.path.getsize(path)
    for kind in ("weight_bytes", "keras_file_bytes"):
        results[f"{kind}_ratio_int8_over_float32"] = (
            results[f"{kind}_int8"] / results[f"{kind}_float32"])
    return results


def speed(models, codes, rng, args, folder):
    from benchmarks import measure

    results = {}
    x = windows(codes, 8, rng)[:, :-1]
    forward = {"token_ids": x, "padding_mask": np.ones_like(x)}
    calls = {f"forward_{name}": (lambda m=m: m.predict_on_batch(forward))
             for name, m in models.items()}
    tokens = {f"forward_{name}": x.size for name in models}
    served = {}
    if keras.config.backend() in ("tensorflow", "jax"):
        import tensorflow as tf

        for name, m in models.items():
            m.export(str(folder / name), verbose=False)
            served[name] = tf.saved_model.load(str(folder / name))
    for batch in (1, 8):
        prompts = windows(codes, batch, rng)[:, :args.prompt]
        width = args.prompt + args.new_tokens
        ids = np.zeros((batch, width), "int32")
        ids[:, :args.prompt] = prompts
        mask = np.zeros_like(ids)
        mask[:, :args.prompt] = 1
        inputs = {"token_ids": ids, "padding_mask": mask}
        for name, m in models.items():
            calls[f"generate_b{batch}_{name}"] = (
                lambda m=m, i=inputs: m.generate(dict(i), stop_token_ids=None))
            tokens[f"generate_b{batch}_{name}"] = batch * args.new_tokens
            if name in served:
                request = {"token_ids": tf.constant(prompts.astype("int32")),
                           "padding_mask": tf.ones(prompts.shape, tf.int32),
                           "max_length": tf.constant(width), "seed": tf.constant(0),
                           "stop_token_ids": tf.zeros([0], tf.int32)}
                calls[f"exported_generate_b{batch}_{name}"] = (
                    lambda s=served[name], r=request: s.generate(r))
                tokens[f"exported_generate_b{batch}_{name}"] = batch * args.new_tokens
    for call in calls.values():  # compile and warm up
        measure.sync(call())
        measure.sync(call())
    seconds = measure.interleaved_seconds(calls, repeats=args.repeats)
    for key in calls:
        results[f"{key}_tokens_per_s"] = tokens[key] / seconds[key]
        results[f"{key}_seconds_all"] = seconds[f"{key}_all"]
    for key in calls:
        if key.endswith("_int8"):
            base = key[: -len("_int8")]
            results[f"{base}_ratio_int8_over_float32"] = (
                results[f"{key}_tokens_per_s"] / results[f"{base}_float32_tokens_per_s"])
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    from benchmarks import measure
    from keras_xf.datasets.shakespeare import load_text_corpus

    backend = keras.config.backend()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    text, corpus = load_text_corpus()
    codes = np.minimum(np.frombuffer(text.encode("ascii", "replace"), np.uint8),
                       VOCAB_SIZE - 1).astype("int32")
    split = int(0.9 * len(codes))
    began = time.time()
    trained, loss = train(args, codes[:split], rng)
    train_seconds = time.time() - began
    folder = pathlib.Path(tempfile.mkdtemp(prefix="quantized_serving_"))
    trained.save(str(folder / "lm.keras"))
    # Loaded without the training optimizer (whose AdamW slots the `.keras` file would
    # otherwise carry), so the file sizes below are the models' own.
    models = {name: keras.saving.load_model(str(folder / "lm.keras"), compile=False)
              for name in ("float32", "int8")}
    for model in models.values():
        model.compile()
    models["int8"].quantize("int8")
    held_out = codes[split:]
    result = {"backend": backend, "cpu": measure.cpu_name(), "note": args.note,
              "corpus": corpus, "model": dict(vocabulary=VOCAB_SIZE, layers=LAYERS, width=WIDTH, heads=HEADS,
                            ffn=FFN, window=WINDOW),
              "training_steps": args.steps, "training_loss": loss,
              "training_seconds": train_seconds, "prompt": args.prompt,
              "new_tokens": args.new_tokens, "repeats": args.repeats,
              "size": size(models, folder),
              "accuracy": accuracy(models, held_out, rng, args),
              "speed": speed(models, held_out, rng, args, folder)}
    result["load_average_at_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=str)[:6000])
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" /
                          f"quantized_serving_{backend}.json")
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {output}")


if __name__ == "__main__":
    # Keras warns once per layer type without weights to quantise (norms, dropout, ...).
    warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
    main()
