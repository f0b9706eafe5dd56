"""The arithmetic and the tables of `make bench`, without timing and without Keras: ratios over
alternating rounds, the CPU's vector extensions, model FLOP utilisation, the text table of one
run and the Markdown table of `benchmarks/README.md` (one column per backend)."""

import statistics

TARGETS = {  # the ratios keras_xf must reach, per backend (performance issue)
    "training": {"tensorflow": 1.2, "jax": 1.2, "torch": 1.2},
    "generation": {"tensorflow": 3.0, "jax": 1.5, "torch": 10.0},
    "encoder": {"tensorflow": 1.2, "jax": 1.2, "torch": 1.2},
}

# /proc/cpuinfo flag -> the name printed, in the order printed
VECTOR_FLAGS = (
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_vnni", "AVX512-VNNI"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_tile", "AMX"),
    ("amx_bf16", "AMX-BF16"),
    ("amx_int8", "AMX-INT8"),
)

BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}


def parse_cpuinfo(text):
    """`(model name, vector extensions)` of the first processor listed in the text of
    /proc/cpuinfo; the extensions are the names of `VECTOR_FLAGS` whose flag it reports."""
    model, flags = None, None
    for line in text.splitlines():
        key, separator, value = line.partition(":")
        if not separator:
            continue
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and flags is None:
            flags = set(value.split())
    flags = flags or set()
    return model or "unknown CPU", [name for flag, name in VECTOR_FLAGS if flag in flags]


def describe_cpu(model, extensions, cores):
    """One line naming the CPU: model, core count, vector extensions."""
    return f"{model}, {cores} cores, " + ("/".join(extensions) or "no AVX2 or AVX-512")


def pair_summary(xf_seconds, hub_seconds, work):
    """One A/B pair timed in alternating rounds (round i: `xf_seconds[i]`, `hub_seconds[i]`),
    each timed call doing `work` units (tokens, sequences). Each round's ratio is keras-hub's
    time over keras_xf's, i.e. keras_xf's rate over keras-hub's (higher is better for
    keras_xf); the summary is the median of those ratios and their min and max."""
    if not xf_seconds or len(xf_seconds) != len(hub_seconds):
        raise ValueError(
            "xf_seconds and hub_seconds must be non-empty lists of the same length (one time "
            f"per round); received {len(xf_seconds)} and {len(hub_seconds)} times"
        )
    ratios = [hub / xf for xf, hub in zip(xf_seconds, hub_seconds)]
    return {
        "xf_per_s": work / statistics.median(xf_seconds),
        "hub_per_s": work / statistics.median(hub_seconds),
        "ratio": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "round_ratios": ratios,
    }


def model_flop_utilisation(units_per_s, flops_per_unit, peak_flops_per_s):
    """MFU = achieved FLOP/s (units/s × FLOPs per unit) over the matmul probe's FLOP/s."""
    return units_per_s * flops_per_unit / peak_flops_per_s


# (case, pair) -> (measure as printed, the target's kind)
PAIRS = {
    ("train_interleaved", "training"): ("training tokens/s", "training"),
    ("train_interleaved", "training_chunked_loss"): (
        "training tokens/s, keras_xf with ChunkedCrossEntropy", "training"),
    ("generate_interleaved", "batch_1"): ("greedy generation tokens/s, batch 1", "generation"),
    ("generate_interleaved", "batch_8"): ("greedy generation tokens/s, batch 8", "generation"),
    ("encode_interleaved", "encoder"): ("encoder sequences/s", "encoder"),
}


def _pair_measure(case, pair):
    if (case, pair) in PAIRS:
        return PAIRS[(case, pair)]
    return f"{case} {pair}", None


def rows(results, backend):
    """Rows `(measure, keras_xf, keras-hub, ratio, min, max, target)` of one backend's table:
    every A/B pair of the interleaved cases, then the single-model cases when they ran
    (peak memory: keras-hub's over keras_xf's; `mixed_bfloat16` over float32)."""
    table = []
    for case, result in results.items():
        for pair, summary in result.get("pairs", {}).items():
            measure, kind = _pair_measure(case, pair)
            target = TARGETS[kind][backend] if kind else None
            table.append((measure, summary["xf_per_s"], summary["hub_per_s"], summary["ratio"],
                          summary["min"], summary["max"], target))
        if "mfu" in result:
            mfu = result["mfu"]
            table.append(("model FLOP utilisation (training)", mfu["xf"], mfu["hub"],
                          mfu["xf"] / mfu["hub"], None, None, None))
    if "train_xf" in results and "train_hub" in results:
        xf, hub = results["train_xf"]["peak_rss_mb"], results["train_hub"]["peak_rss_mb"]
        table.append(("peak training memory MB (ratio hub/xf)", xf, hub, hub / xf,
                      None, None, None))
    if "train_xf_bf16" in results and "train_xf" in results:
        bf16, fp32 = (results["train_xf_bf16"]["tokens_per_s"],
                      results["train_xf"]["tokens_per_s"])
        table.append(("training tokens/s, mixed_bfloat16 (anchor: float32)", bf16, fp32,
                      bf16 / fp32, None, None, None))
    return table


def _meets(ratio, target):
    return " ok" if ratio >= target else " SHORT"


def format_table(table, backend, machine=None, peak_flops_per_s=None, probe_dtype="float32"):
    """The text table that `make bench` prints for one backend."""
    lines = [f"keras_xf vs keras-hub on {backend} (ratio: keras_xf over keras-hub, median of "
             "alternating rounds [min, max]; higher is better)"]
    if machine:
        lines.append(f"machine: {machine}")
    lines.append(f"{'measure':44} {'keras_xf':>10} {'keras-hub':>10} {'ratio':>6} "
                 f"{'[min, max]':>13} {'target':>6}")
    for measure, ours, anchor, ratio, low, high, target in table:
        spread = "" if low is None else f"[{low:.2f}, {high:.2f}]"
        target_text = "" if target is None else f"{target:6.1f}" + _meets(ratio, target)
        lines.append(f"{measure:44} {ours:10.4g} {anchor:10.4g} {ratio:6.2f} {spread:>13} "
                     f"{target_text}")
    if peak_flops_per_s:
        lines.append(f"matmul probe (same process as training): "
                     f"{peak_flops_per_s / 1e9:.1f} GFLOP/s {probe_dtype}")
    return "\n".join(lines)


def markdown_table(runs):
    """One Markdown table of the A/B pairs with a column per backend, from `runs`: backend ->
    the JSON that `benchmarks.run` wrote (`results`, `machine`, `rounds`, `dropout`, `date`,
    `load_average`). Each cell is the median ratio [min–max] and the target's verdict; an MFU
    row gives keras_xf's / keras-hub's utilisation of the same-process matmul probe. The
    caption names the machine of each run (one line if all ran on the same)."""
    backends = [b for b in ("tensorflow", "jax", "torch") if b in runs]
    measures, cells = [], {}
    for backend in backends:
        for case, result in runs[backend]["results"].items():
            for pair, summary in result.get("pairs", {}).items():
                measure, kind = _pair_measure(case, pair)
                if measure not in measures:
                    measures.append(measure)
                target = TARGETS[kind][backend] if kind else None
                verdict = "" if target is None else (
                    f" (≥ {target:g} {'ok' if summary['ratio'] >= target else 'short'})")
                cells[(measure, backend)] = (f"{summary['ratio']:.2f} "
                                             f"[{summary['min']:.2f}–{summary['max']:.2f}]{verdict}")
            if "mfu" in result:
                measure = "training MFU, keras_xf / keras-hub (matmul probe GFLOP/s)"
                if measure not in measures:
                    measures.append(measure)
                cells[(measure, backend)] = (f"{result['mfu']['xf']:.2f} / {result['mfu']['hub']:.2f}"
                                             f" ({result['peak_matmul_flops_per_s'] / 1e9:.0f})")
    machines = sorted({runs[b].get("machine", "unknown machine") for b in backends})
    caption = []
    for backend in backends:
        run = runs[backend]
        load = run.get("load_average")
        load_text = f", load average {load[0]:.1f} at start" if load else ""
        caption.append(f"{BACKEND_NAMES[backend]}: {run.get('date', 'undated')}, "
                       f"{run.get('rounds', '?')} rounds, dropout {run.get('dropout', '?')}"
                       f"{'' if len(machines) == 1 else ', ' + run.get('machine', '?')}"
                       f"{load_text}{', QUICK (smoke test, not a measurement)' if run.get('quick') else ''}")
    lines = [f"Machine: {machines[0]}." if len(machines) == 1 else "Machines differ per column.",
             "Runs: " + "; ".join(caption) + ".", "",
             "| keras_xf / keras-hub | " + " | ".join(BACKEND_NAMES[b] for b in backends) + " |",
             "|---|" + "---|" * len(backends)]
    for measure in measures:
        lines.append(f"| {measure} | "
                     + " | ".join(cells.get((measure, b), "—") for b in backends) + " |")
    return "\n".join(lines)


def op_table(title, profiles, top=16, wall=None):
    """Text table of profiles side by side (`benchmarks.profile_torch`, `profile_jax`):
    `profiles` maps a model's name to {op type: (ms per call, ops per call)}; the rows are the
    `top` op types by their largest time in any model, each with its ms and its share of the
    model's total, then the totals, the op counts per call and, given `wall` (name → ms),
    the wall-clock time per call (op time that exceeds it ran on several threads at once)."""
    names = list(profiles)
    totals = {n: sum(ms for ms, _ in profiles[n].values()) for n in names}
    largest = {}
    for n in names:
        for op, (ms, _) in profiles[n].items():
            largest[op] = max(largest.get(op, 0.0), ms)
    order = sorted(largest, key=lambda op: -largest[op])[:top]
    lines = [title, f"  {'op':<40}" + "".join(f"{n:>24}" for n in names)]
    for op in order:
        cells = []
        for n in names:
            ms = profiles[n].get(op, (0.0, 0))[0]
            cells.append(f"{ms:10.2f} ms {100 * ms / (totals[n] or 1):5.1f} %")
        lines.append(f"  {op[:40]:<40}" + "".join(f"{cell:>24}" for cell in cells))
    lines.append(f"  {'total':<40}" + "".join(f"{totals[n]:10.2f} ms {100:5.1f} %".rjust(24)
                                              for n in names))
    lines.append(f"  {'ops per call':<40}" + "".join(
        f"{sum(k for _, k in profiles[n].values()):20.0f} ops" for n in names))
    if wall is not None:
        lines.append(f"  {'wall time per call':<40}" + "".join(
            f"{wall[n]:10.2f} ms".rjust(24) for n in names))
    return "\n".join(lines)


def median_wall(times):
    """name → median of its list of wall-clock milliseconds."""
    return {name: statistics.median(values) for name, values in times.items()}


def median_profile(profiles):
    """One profile from several of the same call ({op: (ms, count)} each, as `op_table`
    takes): the median ms of each op over them (an op missing from one counts 0 there), so
    that a burst of other load during one call does not skew the table."""
    ops_seen = {op for profile in profiles for op in profile}
    return {op: (statistics.median(p.get(op, (0.0, 0))[0] for p in profiles),
                 statistics.median(p.get(op, (0.0, 0))[1] for p in profiles))
            for op in ops_seen}


def interleaved(calls, rounds, profile, warmup=0):
    """Profiles of the models of `calls` (name → a function making one call) side by side:
    each called `warmup` times, then `rounds` rounds of one call of each, the models
    alternating call by call. `profile(name, call)` profiles one call and gives
    `({op: (ms, count)}, wall-clock ms)`. Returns name → the median profile
    (`median_profile`) and name → the median wall-clock ms, as `op_table` takes them."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    profiles = {name: [] for name in calls}
    walls = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            one, wall = profile(name, call)
            profiles[name].append(one)
            walls[name].append(wall)
    return {name: median_profile(p) for name, p in profiles.items()}, median_wall(walls)
