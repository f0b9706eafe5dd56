"""The first `generate` call of a new process, compilation included, with and without the
compilation cache on disk, for a SmolLM2-135M-shaped Llama (`real_size.py`'s model).

    KERAS_BACKEND=jax python -m benchmarks.first_call [--prompt-lengths 100,512]
        [--new-tokens 128] [--batch 1] [--folder F] [--tiny]

Three fresh processes in turn, each loading the folder with `from_huggingface` and, per
prompt length, calling `generate` for 1 new token (the time to the first token) and then for
`--new-tokens`, each first call timed alone, then the 1-token call again (compiled):
- `no cache`: the backend's defaults;
- `cache, cold`: `keras_xf.generation.enable_compilation_cache` on an empty folder (the
  programs are compiled and written);
- `cache, warm`: the same folder again (the programs are read back).
The prompts are random ids (seeded), the same in every process. PyTorch has no cache on disk
(its rows say so). Prints a table and writes `benchmarks/results/first_call_<backend>.json`
(`--tiny`: `real_size.py`'s tiny model, 8 new tokens, prompts of 12 and 16 tokens unless
given, written to
`results/quick/`: a check that the benchmark runs, not a measurement). Never run by the test
suite's timing; the CPU is named in the output.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import measure  # noqa: E402
from benchmarks import real_size  # noqa: E402

MODES = ("no cache", "cache, cold", "cache, warm")
DEFAULT_LENGTHS = "100,512"


def child(folder, cache, prompt_lengths, new_tokens, batch):
    """One process's measurements: `{"load_s", "cache_enabled", "calls": {length: {...}}}`."""
    import keras_xf

    enabled = False
    if cache:
        enabled = keras_xf.generation.enable_compilation_cache(cache)
    start = time.perf_counter()
    model = real_size.load_keras_xf(folder, "float32")
    result = {"load_s": time.perf_counter() - start, "cache_enabled": enabled, "calls": {}}
    for length in prompt_lengths:
        # Ids under 512, within the tiny model's vocabulary too.
        ids = real_size.prompts(batch, length, 512)
        times = {}
        for name, count in (("first_token_s", 1), ("generate_s", new_tokens),
                            ("first_token_again_s", 1)):
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=count, stop_token_ids=None)
            times[name] = time.perf_counter() - start
        result["calls"][str(length)] = times
    return result


def run_child(arguments, cache):
    command = [sys.executable, "-m", "benchmarks.first_call", "--child", "--folder",
               arguments.folder, "--prompt-lengths", arguments.prompt_lengths,
               "--new-tokens", str(arguments.new_tokens), "--batch", str(arguments.batch)]
    if cache:
        command += ["--cache", cache]
    environment = dict(os.environ)
    environment.pop("TF_XLA_FLAGS", None)
    done = subprocess.run(command, env=environment, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results):
    lines = ["| mode | prompt | load s | first call, 1 token s | first call, "
             "generate s | 1 token again s |", "|---|---|---|---|---|---|"]
    for mode, result in results.items():
        for length, calls in result["calls"].items():
            lines.append(f"| {mode} | {length} | {result['load_s']:.2f} | "
                         f"{calls['first_token_s']:.2f} | {calls['generate_s']:.2f} | "
                         f"{calls['first_token_again_s']:.3f} |")
    return "\n".join(lines)


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-lengths", default=DEFAULT_LENGTHS)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--folder", help="the checkpoint folder (written when missing)")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    return parser.parse_args()


def main():
    arguments = parse_arguments()
    if arguments.child:
        lengths = [int(n) for n in arguments.prompt_lengths.split(",")]
        print(json.dumps(child(arguments.folder, arguments.cache, lengths,
                               arguments.new_tokens, arguments.batch)))
        return
    import keras

    if arguments.tiny:
        arguments.new_tokens = 8
        if arguments.prompt_lengths == DEFAULT_LENGTHS:
            arguments.prompt_lengths = "12,16"
    config = real_size.TINY_CONFIG if arguments.tiny else real_size.CONFIG
    scratch = tempfile.mkdtemp(prefix="first_call_")
    arguments.folder = arguments.folder or os.path.join(
        scratch, "tiny" if arguments.tiny else "smollm")
    real_size.write(arguments.folder, config)
    cache = os.path.join(scratch, "cache")
    results = {}
    for mode in MODES:
        results[mode] = run_child(arguments, None if mode == "no cache" else cache)
    backend = keras.config.backend()
    report = {"backend": backend, "cpu": measure.cpu_name(), "batch": arguments.batch,
              "new_tokens": arguments.new_tokens, "tiny": arguments.tiny, "results": results}
    print(f"backend={backend} cpu={report['cpu']!r} batch={arguments.batch} "
          f"new tokens={arguments.new_tokens}")
    print(table(results))
    results_folder = pathlib.Path(__file__).parent / "results"
    default = results_folder / ("quick" if arguments.tiny else "") / f"first_call_{backend}.json"
    output = pathlib.Path(arguments.output or default)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
