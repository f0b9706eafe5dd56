"""`make bench`: keras_xf against keras-hub on the current backend (`KERAS_BACKEND`). Each A/B
pair (training tokens/s, greedy generation tokens/s at batch 1 and 8, encoder sequences/s) runs
both models in one process, timed in `ROUNDS` alternating rounds; each case in its own process.
Prints the CPU and its vector extensions, the median ratio of the rounds with its [min, max],
and the model FLOP utilisation against a matmul probe run in the training pair's process; writes
the JSON to `benchmarks/results/<backend>.json`.

    KERAS_BACKEND=jax python -m benchmarks.run [--quick] [--rounds 5] [--dropout 0.0]
        [--cases train_interleaved,...] [--output FILE] [--update]
        [--policy mixed_bfloat16] [--flash-attention] [--set BATCH=32 --set SEQUENCE=1024]
    python -m benchmarks.run --markdown   # the README table from results/{tensorflow,jax,torch}.json
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before `measure` imports Keras

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import time

from benchmarks import config
from benchmarks import measure
from benchmarks import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = pathlib.Path(__file__).parent / "results"

# `make bench`: the A/B pairs; the other cases of `benchmarks.cases` run with --cases
DEFAULT_CASES = ("train_interleaved", "generate_interleaved", "encode_interleaved")


def run_case(name, backend, tree=ROOT, overrides=None):
    """One case in its own process, importing `keras_xf` and `benchmarks` from the checkout
    at `tree` (this one by default), with the settings of `config.py` named in `overrides`."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=path)
    start = time.perf_counter()
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.cases", name, json.dumps(overrides or {})],
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


def _parse_settings(pairs):
    """`["BATCH=32", ...]` as `{"BATCH": 32, ...}`; a value that is not JSON stays a string."""
    settings = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"--set takes NAME=VALUE; received {pair!r}")
        try:
            settings[name] = json.loads(value)
        except json.JSONDecodeError:
            settings[name] = value
    return settings


def _device_name(backend):
    """The accelerator the cases run on, asked in a child process (so that this one imports
    no framework), or "cpu"."""
    process = subprocess.run(
        [sys.executable, "-c", "from benchmarks import measure; print(measure.device_name())"],
        capture_output=True, text=True, cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                 PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])),
    )
    lines = process.stdout.strip().splitlines()
    return lines[-1] if process.returncode == 0 and lines else "cpu"


def _print_markdown(folder):
    runs = {}
    for backend in ("tensorflow", "jax", "torch"):
        path = folder / f"{backend}.json"
        if path.exists():
            run = json.loads(path.read_text())
            if any("pairs" in r for r in run["results"].values()):
                runs[backend] = run
    if not runs:
        raise SystemExit(f"no results with A/B pairs in {folder}; run `make bench` first")
    print(report.markdown_table(runs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES))
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"alternating rounds per A/B pair (default {config.ROUNDS}, "
                             "at least 3)")
    parser.add_argument("--dropout", type=float, default=config.DROPOUT,
                        help="dropout of both models (default: the issue's protocol, "
                             f"{config.DROPOUT})")
    parser.add_argument("--quick", action="store_true",
                        help="a few small steps of every case: checks that the harness runs "
                             "(results/quick/<backend>.json, not a measurement)")
    parser.add_argument("--policy", default=config.POLICY,
                        help="Keras dtype policy of both models, e.g. mixed_bfloat16 "
                             f"(default {config.POLICY})")
    parser.add_argument("--flash-attention", action="store_true",
                        help="turn on Keras's flash-attention switch for both models")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting of benchmarks/config.py (a JSON value), "
                             "e.g. --set BATCH=32")
    parser.add_argument("--output", default=None)
    parser.add_argument("--update", action="store_true",
                        help="keep the other cases' results already in the output file")
    parser.add_argument("--markdown", action="store_true",
                        help="print the README table from results/<backend>.json (with "
                             "--quick: results/quick/) and exit")
    args = parser.parse_args()
    if args.markdown:
        _print_markdown(RESULTS / "quick" if args.quick else RESULTS)
        return
    from benchmarks.cases import CASES

    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    names = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {sorted(CASES)}")
    overrides = dict(config.QUICK) if args.quick else {}
    if args.rounds is not None:
        if args.rounds < 3:
            raise SystemExit(f"--rounds must be at least 3; received {args.rounds}")
        overrides["ROUNDS"] = args.rounds
    overrides["DROPOUT"] = args.dropout
    overrides.update(POLICY=args.policy, FLASH_ATTENTION=args.flash_attention)
    overrides.update(_parse_settings(args.set))
    rounds = overrides.get("ROUNDS", config.ROUNDS)
    machine = measure.cpu_name()
    device = _device_name(backend)
    if device != "cpu":
        machine = f"{device}; host {machine}"
    load = os.getloadavg()
    print(f"Running {len(names)} benchmark cases on {backend}{' (quick)' if args.quick else ''}"
          f", {rounds} rounds, dropout {args.dropout}", flush=True)
    print(f"machine: {machine}; load average {load[0]:.2f}", flush=True)
    default_output = RESULTS / ("quick" if args.quick else "") / f"{backend}.json"
    output = pathlib.Path(args.output or default_output)
    results = {}
    if args.update and output.exists():
        results = json.loads(output.read_text())["results"]
    results.update({name: run_case(name, backend, overrides=overrides) for name in names})
    table = report.rows(results, backend)
    peak = results.get("train_interleaved", {}).get("peak_matmul_flops_per_s")
    probe_dtype = results.get("train_interleaved", {}).get("matmul_probe_dtype", "float32")
    print(report.format_table(table, backend, machine, peak, probe_dtype))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(
        {"backend": backend, "machine": machine, "date": datetime.date.today().isoformat(),
         "load_average": list(load), "load_average_after": list(os.getloadavg()),
         "device": device, "policy": args.policy, "flash_attention": args.flash_attention,
         "quick": args.quick, "rounds": rounds, "dropout": args.dropout,
         "overrides": overrides, "results": results,
         "table": [dict(zip(("measure", "keras_xf", "keras_hub", "ratio", "min", "max", "target"),
                            r)) for r in table]},
        indent=1))
    print(f"written: {output}")


if __name__ == "__main__":
    main()
