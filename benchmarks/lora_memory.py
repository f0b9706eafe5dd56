"""Peak training memory of LoRA over a float32, an int8 and an int4 base (issue 39). A
benchmark, never a test.

    python -m benchmarks.lora_memory [--backends tensorflow,jax,torch] [--modes float32,int8,int4]
                                     [--steps 3] [--env KEY=VALUE] [--out FILE] [--quick]

Each backend and mode runs in a fresh process: a Llama-shaped `CausalLM` with random weights
(vocabulary 32,000, width 768, 12 layers, 12 query heads over 4 key-value heads, RoPE, a
SwiGLU feedforward of 2,048, RMSNorm, an untied output head: 124.7 M parameters) is built in
float32; for `int8` and `int4`, `model.quantize(mode)` quantises its base (Keras' `Dense` and
`EinsumDense`: the attention projections and the feedforward; keras_xf's `TokenEmbedding`:
the token table and the output head, one scale per token); then `enable_lora(8)` adds float32
adapters to the query and value projections (the library's order: quantise, then LoRA), and
`fit` runs `--steps` AdamW steps of sparse cross-entropy on one batch of 4 × 128 random
tokens, the same batch each step (the loss falls as the adapters fit it).

Recorded per run: the parameters of the float32 model and the trainable ones; the bytes of the
model's variables after quantisation (int8 and packed int4 kernels and tables with their
float32 scales, float32 norms and adapters); the resident memory before the model is built
(the process with its imports and the backend started), the peak while building, quantising
and compiling, the resident memory before `fit`, the peak of the first step (tracing and, on
JAX, XLA's compilation included) and of the later steps (the high-water mark is reset around
each step, `measure.reset_peak_rss`), and the peak of `fit` and of its later steps above the
memory before the build; the first step's time and the median of the later steps'; the loss
of the first and the last step.

TensorFlow on a CPU runs `fit` as a graph without XLA, PyTorch eagerly. glibc is told to serve
blocks of 64 KiB and more from mmap (`MALLOC_MMAP_THRESHOLD_`), so that freed tensors leave
the resident memory rather than the heap; allocators of the backends' own may keep them
(`--env KEY=VALUE` sets more variables for the runs, `TF_ENABLE_ONEDNN_OPTS=0` for one).
Writes `benchmarks/results/lora_memory.json` (`--quick`, a toy model that checks the harness,
writes nothing unless `--out` is given).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BACKENDS = ("tensorflow", "jax", "torch")
MODES = ("float32", "int8", "int4")
# Llama-shaped, about 125 M parameters (the issue asks for at least 100 M).
CONFIG = dict(vocabulary_size=32000, hidden_dim=768, num_layers=12, num_heads=12,
              num_key_value_heads=4, intermediate_dim=2048)
QUICK_CONFIG = dict(vocabulary_size=512, hidden_dim=64, num_layers=2, num_heads=4,
                    num_key_value_heads=2, intermediate_dim=128)


def build(config, length):
    """The Llama layout as keras_xf's Llama loader builds it: pre-norm RMSNorm blocks of
    grouped-query rotary attention and a SwiGLU feedforward, no biases, an untied head."""
    from keras_xf.layers import FeedForward
    from keras_xf.layers import MultiHeadAttention
    from keras_xf.layers import RotaryEmbedding
    from keras_xf.layers import TransformerBlock
    from keras_xf.models import CausalLM

    attention = MultiHeadAttention(
        config["num_heads"], head_dim=config["hidden_dim"] // config["num_heads"],
        num_key_value_heads=config["num_key_value_heads"], use_bias=False,
        position=RotaryEmbedding())
    block = TransformerBlock(
        attention, FeedForward(config["intermediate_dim"], activation="swiglu", use_bias=False),
        normalization="rms_norm", norm_placement="pre", epsilon=1e-6)
    return CausalLM(vocabulary_size=config["vocabulary_size"], num_layers=config["num_layers"],
                    hidden_dim=config["hidden_dim"], block=block, position="none",
                    max_sequence_length=max(length, 2048), tie_embeddings=False)


def weight_bytes(model):
    """Bytes of the model's variables in memory."""
    import keras
    import numpy as np

    return sum(int(np.prod(v.shape)) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
               for v in model.weights)


def run_case(mode, args):
    import gc

    import keras
    import numpy as np

    from benchmarks import measure

    config = QUICK_CONFIG if args.quick else CONFIG
    keras.utils.set_random_seed(0)
    keras.ops.convert_to_numpy(keras.ops.ones((2, 2)) @ keras.ops.ones((2, 2)))  # backend up
    gc.collect()
    before_build = measure.current_rss_mb()
    measure.reset_peak_rss()
    model = build(config, args.length)
    parameters = int(model.count_params())
    if mode != "float32":
        model.quantize(mode)
    model.enable_lora(args.rank, targets=args.targets.split(","))
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=[])
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, config["vocabulary_size"], size=(args.batch, args.length + 1))
    x = {"token_ids": tokens[:, :-1].astype("int32"),
         "padding_mask": np.ones((args.batch, args.length), "int32")}
    y = tokens[:, 1:].astype("int32")
    gc.collect()
    setup_peak = measure.phase_peak_rss_mb()
    before_fit = measure.current_rss_mb()

    class Steps(keras.callbacks.Callback):
        """The time, loss and peak resident memory of each training step (one step an
        epoch: `fit`'s loss of an epoch is then its step's)."""

        seconds, losses, peaks = [], [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))
            self.seconds.append(time.perf_counter() - self.start)
            self.peaks.append(measure.phase_peak_rss_mb())
            measure.reset_peak_rss()

    measure.reset_peak_rss()
    model.fit(x, y, batch_size=args.batch, epochs=args.steps, verbose=0, callbacks=[Steps()])
    fit_peak = max(Steps.peaks + [measure.phase_peak_rss_mb()])
    later_peak = max(Steps.peaks[1:] or Steps.peaks)
    dtypes = {}
    for variable in model.weights:
        dtype = keras.backend.standardize_dtype(variable.dtype)
        dtypes[dtype] = dtypes.get(dtype, 0) + int(np.prod(variable.shape))
    return {
        "backend": keras.config.backend(),
        "mode": mode,
        "parameters": parameters,
        "trainable_parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
        "weight_mb": weight_bytes(model) / 2**20,
        "elements_by_dtype": dtypes,
        "rss_before_build_mb": before_build,
        "setup_peak_mb": setup_peak,
        "rss_before_fit_mb": before_fit,
        "fit_peak_mb": fit_peak,
        "fit_peak_above_start_mb": fit_peak - before_build,
        "first_step_peak_mb": Steps.peaks[0],
        "later_steps_peak_mb": later_peak,
        "later_steps_peak_above_start_mb": later_peak - before_build,
        "step_peaks_mb": Steps.peaks,
        "process_peak_mb": measure.peak_rss_mb(),
        "seconds_first_step": Steps.seconds[0],
        "seconds_per_step": statistics.median(Steps.seconds[1:] or Steps.seconds),
        "step_seconds": Steps.seconds,
        "losses": Steps.losses,
    }


# Set for every run: freed blocks of 64 KiB and more leave the resident memory.
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def _environment(args):
    """`ENVIRONMENT` and the `--env` settings (`KEY=VALUE`) of the runs."""
    pairs = [item.split("=", 1) for item in args.env]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"--env takes KEY=VALUE. Received: {args.env}")
    return dict(ENVIRONMENT, **dict(pairs))


def _run(backend, mode, args):
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                       **_environment(args))
    command = [sys.executable, "-m", "benchmarks.lora_memory", "--case", mode] + [
        f"--{k.replace('_', '-')}={getattr(args, k)}"
        for k in ("steps", "batch", "length", "rank", "targets", "learning_rate")
    ] + ["--quick"] * args.quick
    process = subprocess.run(command, capture_output=True, text=True, env=environment)
    lines = [l for l in process.stdout.splitlines() if l.startswith("BENCHMARK_RESULT ")]
    if process.returncode or not lines:
        sys.stderr.write(process.stdout[-2000:] + process.stderr[-4000:])
        raise SystemExit(f"{mode} on {backend} failed")
    return json.loads(lines[-1][len("BENCHMARK_RESULT "):])


# The printed columns: heading, unit, and the result's value formatted.
COLUMNS = (
    ("backend", "", lambda r: r["backend"]),
    ("base", "", lambda r: r["mode"]),
    ("params", "(M)", lambda r: f"{r['parameters'] / 1e6:7.1f}"),
    ("trained", "(K)", lambda r: f"{r['trainable_parameters'] / 1e3:7.1f}"),
    ("weights", "(MB)", lambda r: f"{r['weight_mb']:7.0f}"),
    ("start", "(MB)", lambda r: f"{r['rss_before_build_mb']:6.0f}"),
    ("set-up", "peak", lambda r: f"{r['setup_peak_mb']:6.0f}"),
    ("pre-fit", "(MB)", lambda r: f"{r['rss_before_fit_mb']:7.0f}"),
    ("step 1", "peak", lambda r: f"{r['first_step_peak_mb']:6.0f}"),
    ("later", "peak", lambda r: f"{r['later_steps_peak_mb']:6.0f}"),
    ("Δ fit", "peak", lambda r: f"{r['fit_peak_above_start_mb']:6.0f}"),
    ("Δ later", "peak", lambda r: f"{r['later_steps_peak_above_start_mb']:6.0f}"),
    ("s/step", "", lambda r: f"{r['seconds_per_step']:6.2f}"),
    ("loss", "first → last", lambda r: f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f}"),
)


def table(results):
    """The printed table: one row a run, then each quantised base against float32."""
    rows = [[format_value(r) for _, _, format_value in COLUMNS] for r in results]
    widths = [max([len(heading), len(unit)] + [len(row[i]) for row in rows])
              for i, (heading, unit, _) in enumerate(COLUMNS)]
    lines = [" ".join(f"{text:{'<' if i < 2 else '>'}{width}}"
                      for i, (text, width) in enumerate(zip(texts, widths)))
             for texts in ([c[0] for c in COLUMNS], [c[1] for c in COLUMNS], *rows)]
    floats = {r["backend"]: r for r in results if r["mode"] == "float32"}
    ratios = (("weights", "weight_mb"), ("Δ fit peak", "fit_peak_above_start_mb"),
              ("Δ later peak", "later_steps_peak_above_start_mb"),
              ("time a step", "seconds_per_step"))
    for r in results:
        base = floats.get(r["backend"])
        if r["mode"] != "float32" and base:
            lines.append(f"{r['backend']} {r['mode']} / float32: " + ", ".join(
                f"{name} {r[key] / base[key]:.2f}" for name, key in ratios))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="query,value")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--quick", action="store_true", help="a toy model: checks the harness")
    parser.add_argument("--out", default=None, help="the JSON file (default: "
                        "benchmarks/results/lora_memory.json; none with --quick)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the runs (repeatable), such as "
                        "TF_ENABLE_ONEDNN_OPTS=0")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print("BENCHMARK_RESULT " + json.dumps(run_case(args.case, args)), flush=True)
        return
    from benchmarks import measure
    from benchmarks.run import ROOT

    cpu = measure.cpu_name()
    config = QUICK_CONFIG if args.quick else CONFIG
    print(f"{cpu}; batch {args.batch} × {args.length} tokens, {args.steps} steps, LoRA rank "
          f"{args.rank} on {args.targets}, AdamW {args.learning_rate:g}; environment "
          f"{_environment(args)}", flush=True)
    results = []
    for backend in args.backends.split(","):
        for mode in args.modes.split(","):
            result = _run(backend, mode, args)
            results.append(result)
            print(f"  {backend} {mode}: fit peak {result['fit_peak_mb']:.0f} MB, "
                  f"{result['seconds_per_step']:.2f} s a step", flush=True)
    print(table(results))
    out = args.out or (None if args.quick else
                       ROOT / "benchmarks" / "results" / "lora_memory.json")
    if out:
        settings = {k: getattr(args, k) for k in ("steps", "batch", "length", "rank", "targets",
                                                  "learning_rate")}
        with open(out, "w") as file:
            json.dump({"cpu": cpu, "config": config, "settings": settings,
                       "environment": _environment(args),
                       "results": results}, file, indent=1)


if __name__ == "__main__":
    main()
