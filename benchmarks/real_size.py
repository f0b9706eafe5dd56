"""Decoding a model of real size against `transformers` in one process: time to the first
token and greedy tokens/s of a SmolLM2-135M-shaped Llama, beside the memory-bandwidth bound.

    KERAS_BACKEND=jax python -m benchmarks.real_size [--dtypes float32,bfloat16,int8]
        [--batches 1,8] [--prompt-length 512] [--new-tokens 128] [--rounds 3] [--tiny]

A Llama of SmolLM2-135M's shape (30 layers, width 576, FFN 1536, 9 query and 3 key-value
heads, vocabulary 49,152, tied embeddings, rope theta 100,000, 2,048 positions) with random
weights is written once as a Hugging Face folder (`--folder`, in the temporary directory by
default) and loaded, per dtype, by keras_xf (`from_huggingface`) and by `transformers`
(`AutoModelForCausalLM.from_pretrained`) in this process. int8: keras_xf loads float32 and
calls `model.quantize("int8")`; `transformers` gets PyTorch's dynamic quantisation of its
`nn.Linear` layers (`torch.ao.quantization.quantize_dynamic`), or is left out where this
PyTorch has no quantised engine (the output says which).

For each dtype and batch, both libraries greedily continue the same random prompts of
`--prompt-length` tokens: `prefill` asks for one new token (the time to the first token),
`generate` for `--new-tokens` (no stop id: every row gets them all). The first call of each
is timed alone ("first call", compilation included), a second call warms up, then the calls
are timed in alternating rounds (keras_xf, transformers, keras_xf, ...;
`measure.interleaved_seconds`). Per round, decoding is the generate time less the prefill
time, over the tokens after the first. Figures are medians with their [min–max] over the
rounds; ratios are keras_xf's rate over `transformers'` (`report.pair_summary`).

The bandwidth bound (batch 1): a decoding step reads every weight once, so it cannot run
faster than the read bandwidth (`measure.memory_bandwidth_gb_s`, probed in this process)
over the bytes of keras_xf's weights in that dtype; each decoding rate is given as a fraction
of it. Memory: the resident memory each library adds by loading and by its first calls at
every batch (`/proc/self/statm`), and the process's peak at the end; the peak of one library
alone needs a process of its own (`checkpoint_load.py` measures loading that way).

Prints a table and writes `benchmarks/results/real_size_<backend>.json` (`--tiny`: a 2-layer
model of width 64 and vocabulary 512, prompt 16, 8 new tokens, 1 round, written to
`results/quick/`: a check that the benchmark runs, not a measurement). Never run by the test
suite.
"""

import argparse
import gc
import json
import os
import pathlib
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import measure  # noqa: E402
from benchmarks import report  # noqa: E402

# SmolLM2-135M's shape.
CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
              num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
              rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
              bos_token_id=0, eos_token_id=0)
TINY_CONFIG = dict(CONFIG, vocab_size=512, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# Command-line defaults, full size and `--tiny`.
DEFAULTS = dict(prompt_length=512, new_tokens=128, rounds=3, probe_mb=1024)
TINY_DEFAULTS = dict(prompt_length=16, new_tokens=8, rounds=1, probe_mb=256)
DTYPES = ("float32", "bfloat16", "int8")
BATCHES = (1, 8)
LIBRARIES = ("keras_xf", "transformers")


def write(folder, config):
    """Writes a Llama with random weights (seeded) as a Hugging Face folder, unless the folder
    already holds one."""
    import torch
    import transformers

    if os.path.exists(os.path.join(folder, "config.json")):
        return
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    model.save_pretrained(folder)


def load_keras_xf(folder, dtype):
    """keras_xf's `CausalLM` of the folder in `dtype`; int8: loaded in float32, then
    `quantize("int8")`."""
    from keras_xf.checkpoints import from_huggingface

    model = from_huggingface(folder, dtype="float32" if dtype == "int8" else dtype,
                             progress=False)
    if dtype == "int8":
        with warnings.catch_warnings():
            # Keras warns once per layer type without weights to quantise (norms, ...).
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
            model.quantize("int8")
    return model


def transformers_int8_method():
    """How `transformers` runs int8 here: PyTorch's dynamic quantisation where this PyTorch
    has a quantised engine, else None."""
    import torch

    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    if not engines:
        return None
    return ("torch.ao.quantization.quantize_dynamic on nn.Linear "
            f"({torch.backends.quantized.engine} engine: int8 weights, activations quantised "
            "per call)")


def load_transformers(folder, dtype):
    """`transformers`' model of the folder in `dtype`; int8: loaded in float32, then its
    `nn.Linear` layers dynamically quantised."""
    import torch
    import transformers

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype).eval()
    if dtype != "int8":
        return model
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantiz.*")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)


def prompts(batch, length, vocabulary):
    """Random prompt ids `[batch, length]` in `[1, vocabulary)`, the same for both libraries."""
    rng = np.random.default_rng(batch)
    return rng.integers(1, vocabulary, size=(batch, length)).astype("int32")


def keras_xf_calls(model, ids, new_tokens):
    """`{"prefill", "generate"}`: keras_xf's greedy `generate` of 1 and of `new_tokens` new
    tokens; each returns the number of new tokens it gave."""
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}

    def generate(count):
        output = model.generate(dict(inputs), max_new_tokens=count, stop_token_ids=None)
        return int(np.asarray(output["padding_mask"])[:, ids.shape[1]:].sum())

    return {"prefill": lambda: generate(1), "generate": lambda: generate(new_tokens)}


def transformers_calls(model, ids, new_tokens):
    """`{"prefill", "generate"}`: `transformers`' greedy `generate` of exactly 1 and
    `new_tokens` new tokens; each returns the number of new tokens it gave."""
    import torch

    tokens = torch.from_numpy(ids.astype("int64"))
    mask = torch.ones_like(tokens)

    def generate(count):
        with torch.no_grad():
            output = model.generate(tokens, attention_mask=mask, do_sample=False,
                                    max_new_tokens=count, min_new_tokens=count, pad_token_id=0)
        return int((output.shape[1] - ids.shape[1]) * output.shape[0])

    return {"prefill": lambda: generate(1), "generate": lambda: generate(new_tokens)}


def first_calls(calls, batch, new_tokens):
    """Times the first call of each (compilation included) and checks that every row got
    all its new tokens; then warms each up once more."""
    seconds = {}
    for name, call in calls.items():
        start = time.perf_counter()
        given = call()
        seconds[name] = time.perf_counter() - start
        expected = batch * (1 if name == "prefill" else new_tokens)
        if given != expected:
            raise RuntimeError(f"{name}: expected {expected} new tokens, got {given}")
    for call in calls.values():
        call()
    return seconds


def prepare(library, folder, dtype, inputs, new_tokens):
    """Loads `library`'s model in `dtype` and makes its first calls at every batch of
    `inputs` (`{batch: prompt ids}`). Returns the model, its calls per batch, the first-call
    times per batch and the resident memory that loading and those calls added (MB)."""
    before = measure.current_rss_mb()
    load, make = ((load_keras_xf, keras_xf_calls) if library == "keras_xf"
                  else (load_transformers, transformers_calls))
    model = load(folder, dtype)
    calls = {batch: make(model, ids, new_tokens) for batch, ids in inputs.items()}
    firsts = {batch: first_calls(calls[batch], batch, new_tokens) for batch in calls}
    return {"model": model, "calls": calls, "first_call_s": firsts,
            "added_rss_mb": measure.current_rss_mb() - before}


def decode_seconds(generate, prefill):
    """Per round, the time of the tokens after the first: generate's time less prefill's, or
    None where that is not positive (a slow prefill beside a short decoding)."""
    return [g - p if g > p else None for g, p in zip(generate, prefill)]


def spread(values):
    """`{"median", "min", "max"}` of a list of numbers (None left out); None when none is
    left."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def rates(work, seconds):
    """`work / t` for each time (None stays None)."""
    return [None if t is None else work / t for t in seconds]


def library_summary(times, batch, args, bound):
    """One library's figures from its per-round times `{"prefill": [...], "generate": [...]}`:
    time to the first token (s), generate and decoding rates (tokens/s), and at batch 1 the
    median decoding rate as a fraction of the bandwidth bound."""
    decode = decode_seconds(times["generate"], times["prefill"])
    summary = {
        "ttft_s": spread(times["prefill"]),
        "generate_tokens_per_s": spread(rates(batch * args.new_tokens, times["generate"])),
        "decode_tokens_per_s": spread(rates(batch * (args.new_tokens - 1), decode)),
        "rounds_s": times,
    }
    if batch == 1 and summary["decode_tokens_per_s"]:
        summary["fraction_of_bound"] = summary["decode_tokens_per_s"]["median"] / bound
    return summary


def ratio(xf_seconds, hf_seconds, work):
    """keras_xf's rate over `transformers'` over the rounds where both times are known: the
    median of the rounds' ratios with their min and max (above 1: keras_xf faster)."""
    pairs = [(x, h) for x, h in zip(xf_seconds, hf_seconds) if x is not None and h is not None]
    if not pairs:
        return None
    summary = report.pair_summary(*zip(*pairs), work=work)
    return {key: summary[key] for key in ("ratio", "min", "max", "round_ratios")}


def ratios(times, batch, args):
    """keras_xf over `transformers` for the time to the first token, generate and decoding."""
    xf, hf = times["keras_xf"], times["transformers"]
    return {"ttft": ratio(xf["prefill"], hf["prefill"], batch),
            "generate": ratio(xf["generate"], hf["generate"], batch * args.new_tokens),
            "decode": ratio(decode_seconds(xf["generate"], xf["prefill"]),
                            decode_seconds(hf["generate"], hf["prefill"]),
                            batch * (args.new_tokens - 1))}


def measure_batch(prepared, batch, args, bound):
    """Alternating rounds of every library's prefill and generate at `batch`; each library's
    figures and, with `transformers` present, the ratios."""
    calls = {f"{library} {name}": call for library, run in prepared.items()
             for name, call in run["calls"][batch].items()}
    seconds = measure.interleaved_seconds(calls, args.rounds)
    times = {library: {name: seconds[f"{library} {name}_all"] for name in ("prefill", "generate")}
             for library in prepared}
    result = {"batch": batch, "libraries": {}}
    for library, run in prepared.items():
        result["libraries"][library] = dict(
            library_summary(times[library], batch, args, bound),
            first_call_s=run["first_call_s"][batch], added_rss_mb=run["added_rss_mb"])
    if len(prepared) == 2:
        result["keras_xf_over_transformers"] = ratios(times, batch, args)
    return result


def measure_dtype(dtype, folder, args, bandwidth, int8_method):
    """Both libraries in `dtype` (keras_xf alone for int8 where `transformers` has no int8
    path), every batch; the models are released at the end."""
    inputs = {b: prompts(b, args.prompt_length, args.config["vocab_size"]) for b in args.batches}
    libraries = [l for l in LIBRARIES if l == "keras_xf" or dtype != "int8" or int8_method]
    prepared = {library: prepare(library, folder, dtype, inputs, args.new_tokens)
                for library in libraries}
    weights = measure.weight_bytes(prepared["keras_xf"]["model"])
    bound = bandwidth * 1e9 / weights
    results = [dict(measure_batch(prepared, batch, args, bound), dtype=dtype,
                    weight_bytes=weights, bound_tokens_per_s=bound) for batch in args.batches]
    for row in results:
        print(table_rows(row, header=False), flush=True)
    del prepared
    gc.collect()
    return results


def _range(figures, digits):
    if figures is None:
        return "—"
    return (f"{figures['median']:,.{digits}f} [{figures['min']:,.{digits}f}–"
            f"{figures['max']:,.{digits}f}]")


def table_rows(result, header=True):
    """The Markdown rows of one dtype and batch (one per library), with the header when
    `header`."""
    lines = []
    if header:
        lines += ["| dtype | batch | library | first call s, prefill / generate | time to first "
                  "token s | generate tokens/s | decoding tokens/s | ÷ transformers, decoding | "
                  "fraction of the bound | resident MB added |", "|---" * 10 + "|"]
    decode = result.get("keras_xf_over_transformers", {}).get("decode")
    for library, figures in result["libraries"].items():
        first = figures["first_call_s"]
        versus = (f"{decode['ratio']:.2f} [{decode['min']:.2f}–{decode['max']:.2f}]"
                  if decode and library == "keras_xf" else "—")
        fraction = (f"{figures['fraction_of_bound']:.2f}" if "fraction_of_bound" in figures
                    else "—")
        lines.append(
            f"| {result['dtype']} | {result['batch']} | {library} | {first['prefill']:.2f} / "
            f"{first['generate']:.2f} | {_range(figures['ttft_s'], 3)} | "
            f"{_range(figures['generate_tokens_per_s'], 1)} | "
            f"{_range(figures['decode_tokens_per_s'], 1)} | {versus} | {fraction} | "
            f"{figures['added_rss_mb']:,.0f} |")
    return "\n".join(lines)


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--prompt-length", type=int, help=f"default {DEFAULTS['prompt_length']}")
    parser.add_argument("--new-tokens", type=int, help=f"default {DEFAULTS['new_tokens']}")
    parser.add_argument("--rounds", type=int, help=f"default {DEFAULTS['rounds']}")
    parser.add_argument("--probe-mb", type=int, help="MiB of the bandwidth probe's array "
                                                     f"(default {DEFAULTS['probe_mb']})")
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer model of width 64 and small settings: checks that the "
                             "benchmark runs (results/quick/), not a measurement")
    parser.add_argument("--folder", help="the checkpoint folder (written when missing)")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    for key, value in (TINY_DEFAULTS if args.tiny else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.config = TINY_CONFIG if args.tiny else CONFIG
    args.dtypes = args.dtypes.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.folder = args.folder or os.path.join(
        tempfile.gettempdir(), "keras_xf_smollm2_tiny" if args.tiny else "keras_xf_smollm2_135m")
    unknown = sorted(set(args.dtypes) - set(DTYPES))
    if unknown:
        parser.error(f"unknown dtypes {unknown}; choose from {list(DTYPES)}")
    if args.new_tokens < 2 or args.rounds < 1:
        parser.error("--new-tokens must be at least 2 and --rounds at least 1")
    if args.prompt_length + args.new_tokens > args.config["max_position_embeddings"]:
        parser.error(f"--prompt-length + --new-tokens exceeds the model's "
                     f"{args.config['max_position_embeddings']} positions")
    return args


def main():
    args = parse_arguments()
    backend = keras.config.backend()
    write(args.folder, args.config)
    bandwidth = measure.memory_bandwidth_gb_s(args.probe_mb)
    int8_method = transformers_int8_method()
    print(f"bandwidth probe: {bandwidth:.1f} GB/s; transformers int8: "
          f"{int8_method or 'left out (no quantised engine in this PyTorch)'}", flush=True)
    results = []
    for dtype in args.dtypes:
        results += measure_dtype(dtype, args.folder, args, bandwidth, int8_method)
    text = "\n".join(table_rows(r, header=i == 0) for i, r in enumerate(results))
    cpu, load = measure.cpu_name(), os.getloadavg()
    bounds = ", ".join(f"{r['dtype']} {r['weight_bytes'] / 1e6:,.1f} MB → "
                       f"{r['bound_tokens_per_s']:,.1f} tokens/s"
                       for r in results if r["batch"] == results[0]["batch"])
    print(f"\nbackend {backend}, {cpu}; {'TINY model, ' if args.tiny else ''}prompt "
          f"{args.prompt_length}, {args.new_tokens} new tokens, {args.rounds} round(s); "
          f"bandwidth {bandwidth:.1f} GB/s, bound (keras_xf's weights) {bounds}; "
          f"transformers int8: {int8_method or 'left out'}; process peak "
          f"{measure.peak_rss_mb():,.0f} MB; load average {load[0]:.1f}\n{text}")
    folder = pathlib.Path(__file__).parent / "results" / ("quick" if args.tiny else "")
    output = pathlib.Path(args.output or folder / f"real_size_{backend}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "backend": backend, "cpu": cpu, "device": measure.device_name(), "note": args.note,
        "tiny": args.tiny, "config": args.config, "prompt_length": args.prompt_length,
        "new_tokens": args.new_tokens, "rounds": args.rounds, "bandwidth_gb_s": bandwidth,
        "transformers_int8": int8_method, "peak_rss_mb": measure.peak_rss_mb(),
        "load_average_at_end": load, "results": results, "table": text}, indent=1) + "\n")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
