"""Block-sparse local attention against full attention: time and peak memory of one
`MultiHeadAttention` forward pass at growing lengths (survey §5.1).

    KERAS_BACKEND=jax python -m benchmarks.sparse_attention [--lengths 1024,4096,16384]

Each (variant, length) runs in its own process, so that its peak resident memory is its own.
`block_sparse` is causal self-attention with `LocalPattern(window_left=WINDOW)` (computed by
`keras_xf.ops.block_sparse_attention`, memory O(n·w)); `full` is causal self-attention without
a pattern (the dense path, memory O(n²)). Prints a table and writes
`benchmarks/results/sparse_attention_<backend>.json`. Never run by the test suite.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

WINDOW, HEADS, HEAD_DIM, BATCH = 128, 2, 32, 1
LENGTHS = (1024, 4096, 16384)
VARIANTS = ("block_sparse", "full")
MEMORY_LIMIT_GB = 24.0


def full_attention_estimate_gb(length):
    """Float32 scores, their exponentials and the weights, each `[B, H, n, n]`."""
    return 3 * BATCH * HEADS * length * length * 4 / 2**30


def run_case(variant, length):
    """The measurement in this process: build, warm up, time the forward pass."""
    import keras
    import numpy as np

    from benchmarks.measure import median_seconds
    from benchmarks.measure import peak_rss_mb
    from keras_xf.layers import LocalPattern
    from keras_xf.layers import MultiHeadAttention

    pattern = LocalPattern(window_left=WINDOW) if variant == "block_sparse" else None
    layer = MultiHeadAttention(num_heads=HEADS, head_dim=HEAD_DIM, causal=True, pattern=pattern)
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.standard_normal((BATCH, length, HEADS * HEAD_DIM)).astype("float32"))
    layer.build(x.shape)
    baseline = peak_rss_mb()
    repeats = 5 if length <= 4096 else 2
    seconds = median_seconds(lambda: layer(x), warmup=1, repeats=repeats)
    return {"variant": variant, "length": length, "seconds": seconds,
            "baseline_rss_mb": baseline, "peak_rss_mb": peak_rss_mb(),
            "repeats": repeats}


def spawn(variant, length, backend):
    if variant == "full" and full_attention_estimate_gb(length) > MEMORY_LIMIT_GB:
        return {"variant": variant, "length": length, "skipped":
                f"full attention needs about {full_attention_estimate_gb(length):.1f} GiB "
                f"(> {MEMORY_LIMIT_GB} GiB) for its [B, H, n, n] float32 scores"}
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    start = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.sparse_attention", "--case", f"{variant}:{length}"],
        capture_output=True, text=True, env=environment,
        cwd=pathlib.Path(__file__).resolve().parents[1],
    )
    lines = [l for l in process.stdout.splitlines() if l.startswith("BENCHMARK_RESULT ")]
    if process.returncode or not lines:
        tail = (process.stdout[-1000:] + process.stderr[-2000:]).strip().splitlines()[-3:]
        return {"variant": variant, "length": length,
                "skipped": f"process failed (rc={process.returncode}): {' | '.join(tail)}"}
    result = json.loads(lines[-1][len("BENCHMARK_RESULT "):])
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def table(results):
    by_key = {(r["variant"], r["length"]): r for r in results}
    lengths = sorted({r["length"] for r in results})
    lines = ["| n | block-sparse ms | full ms | time full / sparse | block-sparse peak MB "
             "(Δ) | full peak MB (Δ) |", "|---|---|---|---|---|---|"]
    for n in lengths:
        sparse, full = by_key.get(("block_sparse", n), {}), by_key.get(("full", n), {})

        def ms(r):
            return f"{r['seconds'] * 1e3:,.1f}" if "seconds" in r else "skipped"

        def mb(r):
            if "peak_rss_mb" not in r:
                return "skipped"
            return f"{r['peak_rss_mb']:,.0f} ({r['peak_rss_mb'] - r['baseline_rss_mb']:+,.0f})"

        ratio = (f"{full['seconds'] / sparse['seconds']:.2f}"
                 if "seconds" in full and "seconds" in sparse else "—")
        lines.append(f"| {n:,} | {ms(sparse)} | {ms(full)} | {ratio} | {mb(sparse)} | {mb(full)} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help="variant:length, measured in this process")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    if args.case:
        variant, length = args.case.split(":")
        print("BENCHMARK_RESULT " + json.dumps(run_case(variant, int(length))), flush=True)
        return
    import keras

    backend = keras.config.backend()
    results = []
    for length in map(int, args.lengths.split(",")):
        for variant in VARIANTS:
            result = spawn(variant, length, backend)
            status = result.get("skipped") or "{:.3f} s".format(result["seconds"])
            print(f"  {variant} n={length}: {status}", flush=True)
            results.append(result)
    text = table(results)
    print(f"\nbackend {backend}, window {WINDOW}, {HEADS} heads of {HEAD_DIM}, batch {BATCH}, "
          "causal, one forward pass (median)\n" + text)
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" /
                          f"sparse_attention_{backend}.json")
    output.write_text(json.dumps({"backend": backend, "window": WINDOW, "heads": HEADS,
                                  "head_dim": HEAD_DIM, "batch": BATCH, "results": results,
                                  "table": text}, indent=2) + "\n")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
