"""Loading a checkpoint of real size: peak memory and time of `from_huggingface`, beside
`transformers`' own load of the same folder. A benchmark, never a test.

    python -m benchmarks.checkpoint_load [--folder DIR] [--backends tensorflow,jax,torch]

writes (once) a Llama-shaped checkpoint of about 1 GB with random float32 weights into
`--folder`, and a tiny one of the same family beside it; then loads the large one in a fresh
process per backend and once with `transformers`, and prints, per run: the load time, the
resident memory the load added at its peak, the model's own weights, and the margin that the
loader may use: 30% of the checkpoint's size. `transformers` maps the files and reads each
page when something first touches it, so its load alone reads almost nothing; two more times
count the reading for both libraries: "weights read", the load and then one sum over every
weight, and "first logits", the load and then one eager forward pass over 8 tokens (which
also pays for the backend's first calls of each operation). Each library runs twice: "first load" in a
process that has loaded nothing yet (the load also pays for the modules and code paths it
starts), and "warm" after loading the tiny checkpoint, which leaves only what loading the
large one costs. Results go to `benchmarks/results/checkpoint_load.json`.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks import measure
from benchmarks.run import ROOT

# About 272 M parameters: 1.09 GB in float32.
CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
              tie_word_embeddings=False)


def _checkpoint_mb(folder):
    return sum(p.stat().st_size for p in pathlib.Path(folder).glob("*.safetensors")) / 2**20


# The same family at toy size, loaded first by the "warm" runs.
WARMUP_CONFIG = dict(CONFIG, vocab_size=64, hidden_size=16, intermediate_size=32,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _warmup_folder(folder):
    return os.path.join(folder, "warmup")


def write(folder):
    import torch
    import transformers

    torch.manual_seed(0)
    if not os.path.exists(os.path.join(folder, "config.json")):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
        model.save_pretrained(folder, max_shard_size="400MB")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**WARMUP_CONFIG)).save_pretrained(
        _warmup_folder(folder))


def load_keras_xf(folder, warm):
    import keras

    from keras_xf.checkpoints import from_huggingface

    if warm:
        _first_logits_keras_xf(from_huggingface(_warmup_folder(folder), progress=False))
    # Keras' serialisation imports TensorFlow where it is installed (its TensorShape
    # checks); on the other backends a first load pays for that import.
    imported_tensorflow = "tensorflow" not in sys.modules
    before = measure.current_rss_mb()
    start = time.perf_counter()
    model = from_huggingface(folder, progress=False)
    seconds = time.perf_counter() - start
    for variable in model.weights:
        keras.ops.convert_to_numpy(keras.ops.sum(variable))
    read = time.perf_counter() - start
    _first_logits_keras_xf(model)
    ready = time.perf_counter() - start
    weights = measure.weight_bytes(model) / 2**20
    return {"library": f"keras_xf ({keras.config.backend()})", "warm": warm, "seconds": seconds,
            "read_seconds": read, "ready_seconds": ready,
            "imported_tensorflow": imported_tensorflow and "tensorflow" in sys.modules,
            "added_peak_mb": measure.peak_rss_mb() - before,
            "weights_mb": weights}


def _first_logits_keras_xf(model):
    import keras
    import numpy as np

    ids = np.arange(1, 9, dtype="int32")[None]
    keras.ops.convert_to_numpy(model({"token_ids": ids, "padding_mask": np.ones_like(ids)}))


def _first_logits_transformers(model):
    import torch

    with torch.no_grad():
        model(torch.arange(1, 9)[None]).logits.numpy()


def load_transformers(folder, warm):
    import torch
    import transformers

    if warm:
        _first_logits_transformers(transformers.AutoModelForCausalLM.from_pretrained(
            _warmup_folder(folder), dtype=torch.float32))
    before = measure.current_rss_mb()
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sum().item()
    read = time.perf_counter() - start
    _first_logits_transformers(model)
    ready = time.perf_counter() - start
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return {"library": "transformers (torch)", "warm": warm, "seconds": seconds,
            "read_seconds": read, "ready_seconds": ready, "imported_tensorflow": False, "added_peak_mb": measure.peak_rss_mb() - before,
            "weights_mb": weights}


def _run(kind, folder, warm, backend="torch"):
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.run(
        [sys.executable, "-m", "benchmarks.checkpoint_load", "--run", kind, "--folder", folder]
        + ["--warm"] * warm,
        capture_output=True, text=True, env=environment, cwd=ROOT,
    )
    lines = [l for l in process.stdout.splitlines() if l.startswith("BENCHMARK_RESULT ")]
    if process.returncode or not lines:
        sys.stderr.write(process.stdout[-2000:] + process.stderr[-4000:])
        raise SystemExit(f"{kind} on {backend} failed")
    return json.loads(lines[-1][len("BENCHMARK_RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(),
                                                         "keras_xf_llama_1gb"))
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--run", choices=["keras_xf", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        load = load_keras_xf if args.run == "keras_xf" else load_transformers
        print("BENCHMARK_RESULT " + json.dumps(load(args.folder, args.warm)), flush=True)
        return
    if not os.path.exists(os.path.join(_warmup_folder(args.folder), "config.json")):
        write(args.folder)
    size = _checkpoint_mb(args.folder)
    results = []
    for warm in (False, True):
        results.append(_run("transformers", args.folder, warm))
        results += [_run("keras_xf", args.folder, warm, b) for b in args.backends.split(",")]
    reference = {r["warm"]: r for r in results if r["library"].startswith("trans")}
    print(f"checkpoint {size:.0f} MB; allowed added peak = weights + {0.3 * size:.0f} MB; "
          f"on {measure.cpu_name()}")
    for r in results:
        r["checkpoint_mb"] = size
        r["within_limit"] = r["added_peak_mb"] <= r["weights_mb"] + 0.3 * size
        r["time_vs_transformers"] = r["seconds"] / reference[r["warm"]]["seconds"]
        for key in ("read", "ready"):
            r[f"{key}_vs_transformers"] = (r[f"{key}_seconds"]
                                           / reference[r["warm"]][f"{key}_seconds"])
        print(f"  {r['library']:<22} {'warm' if r['warm'] else 'first load':<10} "
              f"load {r['seconds']:5.2f} s ({r['time_vs_transformers']:5.2f}x)  "
              f"weights read {r['read_seconds']:5.2f} s ({r['read_vs_transformers']:4.2f}x)  "
              f"first logits {r['ready_seconds']:5.2f} s ({r['ready_vs_transformers']:4.2f}x)  "
              f"added peak {r['added_peak_mb']:5.0f} MB  weights {r['weights_mb']:4.0f} MB  "
              f"{'within' if r['within_limit'] else 'OVER'} the limit"
              + ("  (TensorFlow imported during the load)" if r["imported_tensorflow"] else ""))
    out = ROOT / "benchmarks" / "results" / "checkpoint_load.json"
    out.write_text(json.dumps({"config": CONFIG, "cpu": measure.cpu_name(),
                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
