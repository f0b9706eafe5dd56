"""`make bench`: every benchmark case on the current backend (`KERAS_BACKEND`), each in its own
process, then one table of ratios against the keras-hub anchors, also written as JSON to
`benchmarks/results/<backend>.json`.

    KERAS_BACKEND=jax python -m benchmarks.run [--cases train_xf,train_hub] [--output FILE]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

from benchmarks.cases import CASES

TARGETS = {  # the ratios keras_xf must reach, per backend
    "training": {"tensorflow": 1.2, "jax": 1.2, "torch": 1.2},
    "generation": {"tensorflow": 3.0, "jax": 1.5, "torch": 10.0},
    "encoder": {"tensorflow": 1.2, "jax": 1.2, "torch": 1.2},
}


ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_case(name, backend, tree=ROOT):
    """One case in its own process, importing `keras_xf` and `benchmarks` from the checkout
    at `tree` (this one by default)."""
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=str(tree))
    start = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.cases", name],
        capture_output=True, text=True, env=environment, cwd=tree,
    )
    lines = [l for l in process.stdout.splitlines() if l.startswith("BENCHMARK_RESULT ")]
    if process.returncode or not lines:
        sys.stderr.write(process.stdout[-3000:] + process.stderr[-5000:])
        raise SystemExit(f"benchmark case {name} failed on {backend}")
    result = json.loads(lines[-1][len("BENCHMARK_RESULT "):])
    result["wall_s"] = round(time.perf_counter() - start, 1)
    print(f"  {name}: done in {result['wall_s']} s", flush=True)
    return result


def rows(results, backend):
    """(measure, keras_xf, anchor, ratio, target) rows of the table."""
    table = []

    def add(measure, ours, anchor, kind=None, higher_is_better=True):
        ratio = ours / anchor if higher_is_better else anchor / ours
        target = TARGETS[kind][backend] if kind else None
        table.append((measure, ours, anchor, ratio, target))

    if "train_xf" in results and "train_hub" in results:
        xf, hub = results["train_xf"], results["train_hub"]
        add("training tokens/s (float32)", xf["tokens_per_s"], hub["tokens_per_s"], "training")
        add("peak training memory MB (hub/xf)", xf["peak_rss_mb"], hub["peak_rss_mb"],
            higher_is_better=False)
        if "peak_matmul" in results:
            peak = results["peak_matmul"]["flops_per_s"]
            table.append(("model FLOP utilisation", xf["flops_per_s"] / peak,
                          hub["flops_per_s"] / peak, None, None))
    if "train_interleaved" in results:
        pair = results["train_interleaved"]
        add("training tokens/s, both in one process, alternating", pair["xf_tokens_per_s"],
            pair["hub_tokens_per_s"], "training")
    if "train_xf_chunked" in results and "train_xf" in results:
        chunked, plain = results["train_xf_chunked"], results["train_xf"]
        table.append(("training tokens/s, ChunkedCrossEntropy vs plain loss",
                      chunked["tokens_per_s"], plain["tokens_per_s"],
                      chunked["tokens_per_s"] / plain["tokens_per_s"], None))
        table.append(("peak training memory MB, plain loss / ChunkedCrossEntropy",
                      chunked["peak_rss_mb"], plain["peak_rss_mb"],
                      plain["peak_rss_mb"] / chunked["peak_rss_mb"], None))
    if "train_chunked_interleaved" in results:
        pair = results["train_chunked_interleaved"]
        table.append(("training tokens/s, ChunkedCrossEntropy vs plain, alternating",
                      pair["chunked_tokens_per_s"], pair["plain_tokens_per_s"],
                      pair["chunked_tokens_per_s"] / pair["plain_tokens_per_s"], None))
    if "train_xf_bf16" in results and "train_xf" in results:
        table.append(("training tokens/s, mixed_bfloat16 vs float32",
                      results["train_xf_bf16"]["tokens_per_s"],
                      results["train_xf"]["tokens_per_s"],
                      results["train_xf_bf16"]["tokens_per_s"] / results["train_xf"]["tokens_per_s"],
                      None))
    if "generate_xf" in results and "generate_hub" in results:
        for key in sorted(results["generate_xf"]):
            if key.endswith("tokens_per_s"):
                add(f"greedy generation {key.replace('_', ' ').replace('tokens per s', 'tokens/s')}",
                    results["generate_xf"][key], results["generate_hub"][key], "generation")
    if "encode_xf" in results and "encode_hub" in results:
        add("encoder sequences/s", results["encode_xf"]["sequences_per_s"],
            results["encode_hub"]["sequences_per_s"], "encoder")
    return table


def format_table(table, backend, results):
    lines = [f"keras_xf vs keras-hub on {backend} (ratio: keras_xf over keras-hub, higher is better)",
             f"{'measure':52} {'keras_xf':>12} {'anchor':>12} {'ratio':>7} {'target':>7}"]
    for measure, ours, anchor, ratio, target in table:
        ratio_text = "" if ratio is None else f"{ratio:7.2f}"
        target_text = "" if target is None else f"{target:7.1f}" + (" ok" if ratio >= target else " SHORT")
        lines.append(f"{measure:52} {ours:12.4g} {anchor:12.4g} {ratio_text:>7} {target_text}")
    if "peak_matmul" in results:
        lines.append(f"peak float32 matmul: {results['peak_matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s")
    if "train_interleaved" in results:
        spread = results["train_interleaved"]["round_ratios"]
        lines.append(f"interleaved training ratio per round: min {min(spread):.2f}, "
                     f"max {max(spread):.2f} over {len(spread)} rounds")
    if "train_chunked_interleaved" in results:
        spread = results["train_chunked_interleaved"]["round_ratios"]
        lines.append(f"chunked over plain loss, training ratio per round: min {min(spread):.2f}, "
                     f"max {max(spread):.2f} over {len(spread)} rounds")
    if "bf16_curves" in results:
        curves = results["bf16_curves"]
        lines.append(
            f"bf16 vs float32 loss over {curves['steps']} steps (sequences of "
            f"{curves['sequence_length']}): first {curves['float32_first_loss']:.3f}, last "
            f"(20-step mean) {curves['bf16_last_loss']:.4f} vs {curves['float32_last_loss']:.4f}, "
            f"largest relative difference of the 20-step means {curves['max_relative_difference']:.2e}"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--output", default=None)
    parser.add_argument("--update", action="store_true",
                        help="keep the other cases' results already in the output file")
    args = parser.parse_args()
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    names = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {sorted(CASES)}")
    print(f"Running {len(names)} benchmark cases on {backend}", flush=True)
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" / f"{backend}.json")
    results = {}
    if args.update and output.exists():
        results = json.loads(output.read_text())["results"]
    results.update({name: run_case(name, backend) for name in names})
    table = rows(results, backend)
    print(format_table(table, backend, results))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(
        {"backend": backend, "results": results,
         "table": [dict(zip(("measure", "keras_xf", "anchor", "ratio", "target"), r)) for r in table]},
        indent=1))
    print(f"written: {output}")


if __name__ == "__main__":
    main()
