"""Where the time goes on JAX: one training step of keras_xf's `CausalLM` (with the loss on its
logits and with `ChunkedCrossEntropy`) and of keras-hub's `GPT2CausalLM`, and greedy decoding
at batch 1, side by side, from `jax.profiler` traces and the compiled HLO.

    KERAS_BACKEND=jax python -m benchmarks.profile_jax [--phases train,generate] [--steps 3]

The models, sizes and inputs are those of `make bench` (`benchmarks/config.py`,
`benchmarks/models.py`, `benchmarks/cases.py`). XLA dumps every module it compiles as optimised
HLO text (`--xla_dump_to`); each op event of the trace (an XLA thunk: a fusion, a dot, a copy)
is named by its HLO instruction, whose metadata gives the JAX primitive it came from and
whether it is in the forward pass (`fwd`, under `jvp`), the backward pass (`bwd`, under
`transpose`) or neither (`other`: the optimizer's update, the decoding loop). Each model is
warmed up, then `--steps` calls of each are traced, the models alternating call by call. The
table sums the op time by (pass, primitive), in milliseconds per training step or per decoded
token (the median over the calls), and its share of the model's total; "ynn_fusion" ops
(matmuls and reductions that XLA hands to YNNPACK) are thereby named by their primitive,
`dot_general` or `reduce_*`.
"""

import argparse
import collections
import glob
import os
import re
import tempfile
import time

DUMP = tempfile.mkdtemp(prefix="xf_jax_hlo_")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text").strip()

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import cases  # noqa: E402
from benchmarks import config as c  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import profiling  # noqa: E402
from benchmarks.profiling import trace_events  # noqa: E402
from benchmarks.report import interleaved  # noqa: E402
from benchmarks.report import op_table  # noqa: E402

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\w+\[[\d,]*\])\S* ([\w\-]+)\(")
_OP_NAME = re.compile(r"op_name=\"([^\"]*)\"")


def _hlo_labels(paths):
    """(module name, instruction name) → "pass primitive" (or "opcode shape" for an
    instruction that XLA made itself, without metadata), from optimised HLO dumps."""
    labels = {}
    for path in paths:
        with open(path) as handle:
            text = handle.read()
        module = re.search(r"^HloModule (\S+?),", text, re.M).group(1)
        for line in text.splitlines():
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            name, shape, opcode = match.groups()
            op_name = _OP_NAME.search(line)
            if op_name is None:  # made by XLA itself: named by its opcode and shape
                labels[(module, name)] = f"{opcode} {shape}"
                continue
            op_name = op_name.group(1).split(";")[0]
            stage = ("bwd" if "transpose(" in op_name else
                     "fwd" if "jvp(" in op_name else "other")
            primitive = re.sub(r"\[.*", "", op_name.rsplit("/", 1)[-1])
            labels[(module, name)] = f"{stage} {primitive}"
    return labels


def _compiled_files():
    return set(glob.glob(os.path.join(DUMP, "*after_optimizations.txt")))


def _profile(function, labels):
    """label → (ms, events) of one call of `function`, from the trace's XLA op events
    (executor wrappers left out), and the call's wall-clock ms (traced)."""
    directory = tempfile.mkdtemp(prefix="xf_jax_profile_")
    with jax.profiler.trace(directory):
        start = time.perf_counter()
        function()
        wall = 1e3 * (time.perf_counter() - start)
    totals, counts = collections.Counter(), collections.Counter()
    for name, event, stat_names in trace_events(directory):
        if name.startswith("ThunkExecutor") or " " in name:
            continue
        module = None
        for stat in event.stats:
            if stat_names.get(stat.metadata_id) == "hlo_module":
                module = stat.str_value or stat_names.get(stat.ref_value)
        if module is None:
            continue
        label = labels.get((module.split("(")[0], name), re.sub(r"\.\d+$", "", name))
        totals[label] += event.duration_ps / 1e9
        counts[label] += 1
    return {label: (ms, counts[label]) for label, ms in totals.items()}, wall


def _interleaved(calls, steps, warmup, per_call=1):
    """`report.interleaved` of `calls`, each call's times divided by `per_call`; each model's
    warm-up records the HLO it compiles, which names its op events."""
    labels = {}
    for name, call in calls.items():
        before = _compiled_files()
        for _ in range(warmup):
            call()
        labels[name] = _hlo_labels(_compiled_files() - before)

    def profile(name, call):
        ops, wall = _profile(call, labels[name])
        return {k: (ms / per_call, n / per_call) for k, (ms, n) in ops.items()}, wall / per_call

    return interleaved(calls, steps, profile)


def training(steps):
    profiles, walls = _interleaved(profiling.training_calls(), steps, warmup=3)
    print(op_table(f"training step ({c.BATCH} x {c.SEQUENCE} tokens), XLA op time per step",
                   profiles, top=22, wall=walls))


def generation(steps):
    inputs = cases._generation_inputs(1)
    keras.utils.set_random_seed(c.SEED)
    contenders = {"keras_xf": models.xf_causal_lm(), "keras-hub": models.hub_causal_lm()}
    calls = {name: (lambda m=model: np.asarray(
        m.generate(dict(inputs), stop_token_ids=None)["token_ids"]))
        for name, model in contenders.items()}
    profiles, walls = _interleaved(calls, steps, warmup=2, per_call=c.NEW_TOKENS)
    print(op_table(f"greedy decoding, batch 1, XLA op time per token ({c.PROMPT}-token prompt, "
                f"{c.NEW_TOKENS} new tokens a call)", profiles, top=22, wall=walls))


PHASES = {"train": training, "generate": generation}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="train,generate")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    for phase in args.phases.split(","):
        PHASES[phase](args.steps)


if __name__ == "__main__":
    main()
