"""Linear-time sequence mixers against full causal attention: forward + backward time and peak
memory of one mixer at growing lengths (survey §5.5).

    KERAS_BACKEND=jax python -m benchmarks.mixers [--lengths 1024,4096,16384] [--mixers a,b]

Each (mixer, length) runs in its own process, so that its peak resident memory is its own;
"Δ MB" is the peak minus the resident memory after building the layer (compilation and the
first pass included). On an accelerator it is the device allocator's peak minus what was in
use after building (`measure.device_memory_mb`), and the device's name is recorded. One timed
step is the loss `Σ y²` of `y = mixer(x)` and its gradient with respect to the inputs and
every trainable weight: `jax.grad` under `jax.jit` on JAX, `tf.GradientTape` under
`tf.function(jit_compile=True)` on TensorFlow, `.backward()` (eager) on PyTorch. Batch 1,
width 256. Mixers come from `MIXERS` (`name -> factory`). Prints a table with the ratios
t(16k)/t(1k) and m(16k)/m(4k) and writes `benchmarks/results/mixers_<backend>.json` after
every case (a run stopped early keeps what it measured). `--memory-limit-gb` raises the size
at which full attention is skipped (an accelerator's memory); `--timing-seconds` shortens the
timing of each case. Each result also records the minor page faults per timed step.

Two options change the machine's side of a CPU run, never the mixers: `--malloc-hugepages`
starts every case with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, so that glibc's `malloc`
asks for transparent huge pages (`madvise`) on what it maps. On a CPU, XLA allocates each
executable's temporary buffers per call; at 16k they exceed what a thread's heap can hold,
so glibc maps them fresh and unmaps them at every step, and the pass touches them in 4 KiB
page faults (about 64,000 a step for the `FeedForward` anchor). With huge pages the same
bytes fault in 2 MiB pieces. `--no-xla` runs TensorFlow's step as a plain `tf.function`,
which is what Keras's `fit` uses on a CPU-only TensorFlow (`jit_compile="auto"`).
Never run by the test suite.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

BATCH, WIDTH, HEADS, STATE = 1, 256, 4, 16
LENGTHS = (1024, 4096, 16384)
MEMORY_LIMIT_GB = 6.0


def _attention():
    from keras_xf.layers import MultiHeadAttention

    return MultiHeadAttention(num_heads=HEADS, causal=True)


def _linear(decay):
    def make():
        from keras_xf.layers import LinearAttention

        return LinearAttention(HEADS, feature_map="elu", decay=decay, causal=True, chunk_size=64)

    return make


def _ssm(selective):
    def make():
        from keras_xf.layers import StateSpaceMixer

        return StateSpaceMixer(STATE, selective=selective, chunk_size=64)

    return make


def _layer(name, *args, **kwargs):
    def make():
        import keras_xf.layers

        return getattr(keras_xf.layers, name)(*args, **kwargs)

    return make


# name -> factory of a causal mixer taking [B, n, WIDTH]. One line per mixer.
MIXERS = {
    "attention": _attention,
    "linear": _linear(None),
    "gated_linear": _linear("gated"),
    "ssm": _ssm(False),
    "selective_ssm": _ssm(True),
    "depthwise_conv": _layer("DepthwiseConvolution", 4, causal=True),
    "lightweight_conv": _layer("LightweightConvolution", 31, HEADS, causal=True),
    "dynamic_conv": _layer("DynamicConvolution", 31, HEADS, causal=True),
    "conformer_conv": _layer("ConformerConvolution", 31, causal=True, normalization="layer_norm"),
    "lstm": _layer("RecurrentMixer", "lstm"),
    # Keras's generic step loop; on PyTorch's CPU the default fused loop has a quadratic backward.
    "lstm_generic": _layer("RecurrentMixer", "lstm", use_cudnn=False),
    "average_attention": _layer("AverageAttention"),
    # The anchor: token-wise, exactly linear in n; its t(16k)/t(1k) is what the machine's
    # memory hierarchy alone adds (a 1k pass stays in cache, a 16k one does not).
    "feedforward": _layer("FeedForward", 4 * WIDTH),
}


def attention_estimate_gb(length):
    """Float32 `[B, H, n, n]` buffers held by a dense forward + backward pass: scores, their
    exponentials and the weights forward, two more for their gradients."""
    return 5 * BATCH * HEADS * length * length * 4 / 2**30


def gradient_step(layer, x, xla=True):
    """A compiled (where the backend compiles) function returning the loss and the gradients
    with respect to `x` and the layer's trainable weights. `xla=False`: TensorFlow's graph
    without XLA."""
    import keras

    backend = keras.config.backend()
    if backend == "jax":
        import jax

        def loss(trainable, non_trainable, inputs):
            y, _ = layer.stateless_call(trainable, non_trainable, inputs)
            return keras.ops.sum(keras.ops.square(keras.ops.cast(y, "float32")))

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 2)))
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        return lambda: step(trainable, non_trainable, x)
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=xla)
        def step(inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                y = layer(inputs)
                value = tf.reduce_sum(tf.square(tf.cast(y, "float32")))
            return value, tape.gradient(value, [inputs] + layer.trainable_variables)

        return lambda: step(x)

    def step():
        inputs = x.detach().requires_grad_(True)
        value = (layer(inputs).float() ** 2).sum()
        value.backward()
        grads = [inputs.grad] + [v.value.grad for v in layer.trainable_variables]
        for v in layer.trainable_variables:
            v.value.grad = None
        return value.detach(), grads

    return step


def run_case(mixer, length, timing_seconds=3.0, xla=True):
    """The measurement in this process: build, warm up (compile), time forward + backward."""
    import resource

    import keras
    import numpy as np

    from benchmarks.measure import device_memory_mb
    from benchmarks.measure import median_seconds
    from benchmarks.measure import peak_rss_mb

    layer = MIXERS[mixer]()
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.standard_normal((BATCH, length, WIDTH)).astype("float32"))
    layer.build(x.shape)
    baseline = peak_rss_mb()
    device_baseline = device_memory_mb()
    step = gradient_step(layer, x, xla)
    # Enough repeats for about `timing_seconds` of timing (3 to 50): the short cases are the
    # denominators of t(16k)/t(1k), and a few repeats of them are noisy.
    first = median_seconds(step, warmup=1, repeats=1)
    repeats = max(3, min(50, int(timing_seconds / max(first, 1e-3))))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = median_seconds(step, warmup=0, repeats=repeats)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / repeats
    result = {"mixer": mixer, "length": length, "seconds": seconds,
              "page_faults_per_step": round(faults),
              "baseline_rss_mb": baseline, "peak_rss_mb": peak_rss_mb(), "repeats": repeats,
              "parameters": layer.count_params()}
    if device_baseline is not None:
        # On an accelerator the pass's memory is the device's: its allocator's peak over the
        # timed steps minus what was in use after building (the layer's weights and `x`).
        result["baseline_rss_mb"], result["peak_rss_mb"] = device_baseline[0], device_memory_mb()[1]
        result["memory"] = "device"
    return result


def spawn(mixer, length, backend, timeout, memory_limit_gb=MEMORY_LIMIT_GB, timing_seconds=3.0,
          malloc_hugepages=False, xla=True):
    if mixer == "attention" and attention_estimate_gb(length) > memory_limit_gb:
        return {"mixer": mixer, "length": length, "skipped":
                f"skipped (memory): about {attention_estimate_gb(length):.0f} GiB of "
                f"[B, H, n, n] float32 buffers (> {memory_limit_gb:g} GiB)"}
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if malloc_hugepages:
        tunables = [t for t in environment.get("GLIBC_TUNABLES", "").split(":") if t]
        environment["GLIBC_TUNABLES"] = ":".join(tunables + ["glibc.malloc.hugetlb=1"])
    start = time.perf_counter()
    try:
        process = subprocess.run(
            [sys.executable, "-m", "benchmarks.mixers", "--case", f"{mixer}:{length}",
             "--timing-seconds", str(timing_seconds)] + ([] if xla else ["--no-xla"]),
            capture_output=True, text=True, env=environment, timeout=timeout,
            cwd=pathlib.Path(__file__).resolve().parents[1],
        )
    except subprocess.TimeoutExpired:
        return {"mixer": mixer, "length": length, "skipped": f"skipped (timeout {timeout:g} s)"}
    lines = [l for l in process.stdout.splitlines() if l.startswith("BENCHMARK_RESULT ")]
    if process.returncode or not lines:
        tail = (process.stdout[-1000:] + process.stderr[-2000:]).strip().splitlines()[-3:]
        return {"mixer": mixer, "length": length,
                "skipped": f"process failed (rc={process.returncode}): {' | '.join(tail)}"}
    result = json.loads(lines[-1][len("BENCHMARK_RESULT "):])
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def ratios(results, lengths):
    """t(n_max)/t(n_min) and Δm(n_max)/Δm(n_mid) per mixer, where measured."""
    by_key = {(r["mixer"], r["length"]): r for r in results}
    low, high = lengths[0], lengths[-1]
    mid = lengths[-2] if len(lengths) > 1 else low
    out = {}
    for mixer in dict.fromkeys(r["mixer"] for r in results):
        a, b, c = (by_key.get((mixer, n), {}) for n in (low, mid, high))
        time_ratio = c["seconds"] / a["seconds"] if "seconds" in a and "seconds" in c else None
        memory_ratio = None
        if "peak_rss_mb" in b and "peak_rss_mb" in c:
            delta_b = b["peak_rss_mb"] - b["baseline_rss_mb"]
            delta_c = c["peak_rss_mb"] - c["baseline_rss_mb"]
            memory_ratio = delta_c / delta_b if delta_b > 0 else None
        out[mixer] = {"time": time_ratio, "memory": memory_ratio}
    return out


def table(results, lengths):
    by_key = {(r["mixer"], r["length"]): r for r in results}
    mixers = list(dict.fromkeys(r["mixer"] for r in results))
    head = " | ".join(f"{n:,}: ms / Δ MB" for n in lengths)
    lines = [f"| mixer | {head} | t({lengths[-1]:,})/t({lengths[0]:,}) | "
             f"Δm({lengths[-1]:,})/Δm({lengths[-2] if len(lengths) > 1 else lengths[0]:,}) |",
             "|---" * (len(lengths) + 3) + "|"]
    summary = ratios(results, lengths)
    for mixer in mixers:
        cells = []
        for n in lengths:
            r = by_key.get((mixer, n), {})
            if "seconds" in r:
                cells.append(f"{r['seconds'] * 1e3:,.1f} / {r['peak_rss_mb'] - r['baseline_rss_mb']:+,.0f}")
            else:
                cells.append(r.get("skipped", "—").split(":")[0])
        t, m = summary[mixer]["time"], summary[mixer]["memory"]
        lines.append(f"| {mixer} | " + " | ".join(cells) +
                     f" | {'—' if t is None else f'{t:.1f}'} | {'—' if m is None else f'{m:.1f}'} |")
    return "\n".join(lines)


def write(output, backend, device, note, results, lengths, settings=None):
    """Writes the results so far and their table to `output`; returns the table. `settings`:
    the run's options (malloc huge pages, XLA), recorded with it."""
    text = table(results, lengths)
    output.write_text(json.dumps({
        "backend": backend, "device": device, "batch": BATCH, "width": WIDTH, "heads": HEADS,
        "state": STATE, "load_average_at_end": os.getloadavg(), "note": note,
        "settings": settings or {},
        "results": results, "ratios": ratios(results, lengths), "table": text}, indent=2) + "\n")
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help="mixer:length, measured in this process")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--memory-limit-gb", type=float, default=MEMORY_LIMIT_GB,
                        help="skip full attention where its [B, H, n, n] buffers exceed this")
    parser.add_argument("--timing-seconds", type=float, default=3.0,
                        help="about how long each case is timed (3 to 50 repeats)")
    parser.add_argument("--malloc-hugepages", action="store_true",
                        help="start each case with GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
    parser.add_argument("--no-xla", action="store_true",
                        help="TensorFlow: tf.function without XLA (Keras fit's CPU default)")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    if args.case:
        mixer, length = args.case.split(":")
        print("BENCHMARK_RESULT " + json.dumps(run_case(mixer, int(length), args.timing_seconds,
                                                       not args.no_xla)),
              flush=True)
        return
    import keras

    from benchmarks.measure import device_name

    backend = keras.config.backend()
    device = device_name()
    lengths = [int(n) for n in args.lengths.split(",")]
    unknown = [m for m in args.mixers.split(",") if m not in MIXERS]
    if unknown:
        parser.error(f"unknown mixers {unknown}; choose from {list(MIXERS)}")
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" /
                          f"mixers_{backend}.json")
    if args.no_xla and backend != "tensorflow":
        parser.error(f"--no-xla is for TensorFlow's step only. Received: KERAS_BACKEND={backend}")
    # JAX's step is always `jax.jit`; PyTorch's is eager.
    settings = {"malloc_hugepages": args.malloc_hugepages,
                "xla": {"jax": True, "torch": None}.get(backend, not args.no_xla)}
    results = []
    for mixer in args.mixers.split(","):
        for length in lengths:
            result = spawn(mixer, length, backend, args.timeout, args.memory_limit_gb,
                           args.timing_seconds, args.malloc_hugepages, not args.no_xla)
            status = result.get("skipped") or "{:.3f} s".format(result["seconds"])
            print(f"  {mixer} n={length}: {status}", flush=True)
            results.append(result)
            # Written after every case, so that a run stopped early keeps what it measured.
            write(output, backend, device, args.note, results, lengths, settings)
    text = write(output, backend, device, args.note, results, lengths, settings)
    load = os.getloadavg()
    print(f"\nbackend {backend} on {device}, batch {BATCH}, width {WIDTH}, {HEADS} heads, "
          f"state {STATE}, forward + backward (median); load average {load[0]:.1f}\n" + text)
    print(f"written to {output}")


if __name__ == "__main__":
    main()
