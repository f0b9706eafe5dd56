"""Where the time goes on PyTorch: one training step of keras_xf's `CausalLM` (with the loss on
its logits and with `ChunkedCrossEntropy`) and of keras-hub's `GPT2CausalLM`, and one encoder
batch of `TextEncoder` and `BertBackbone`, and greedy generation of both causal models, side by
side, from `torch.profiler`.

    KERAS_BACKEND=torch python -m benchmarks.profile_torch [--phases train,encode,generate] [--steps 3]

The models, sizes and inputs are those of `make bench` (`benchmarks/config.py`,
`benchmarks/models.py`, `benchmarks/cases.py`). Each model is warmed up, then `--steps` calls
of each are profiled, the models alternating call by call; the table gives the median over
those calls of the self CPU time of each aten op type in milliseconds per call and its share
of the model's total, the largest op types of either model first, then each model's op count
per call (PyTorch runs eagerly, so the count is its dispatch work). On a shared machine the
shares and the op counts are the figures to read; the milliseconds move with the load.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import torch  # noqa: E402

from benchmarks import cases  # noqa: E402
from benchmarks import config as c  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import profiling  # noqa: E402
from benchmarks.report import interleaved  # noqa: E402
from benchmarks.report import op_table  # noqa: E402

TOP = 16


def _profile(name, function):
    """aten op name → (self CPU ms, calls) of one call of `function`, and the call's
    wall-clock ms (under the profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        function()
        wall = 1e3 * (time.perf_counter() - start)
    return {event.key: (event.self_cpu_time_total / 1e3, event.count)
            for event in profiler.key_averages()}, wall


def training(steps):
    profiles, walls = interleaved(profiling.training_calls(), steps, _profile, warmup=3)
    print(op_table(f"training step ({c.BATCH} x {c.SEQUENCE} tokens), self CPU time per step",
                   profiles, wall=walls))


def encoding(steps):
    profiles, walls = interleaved(profiling.encoder_calls(), steps, _profile, warmup=2)
    print(op_table(f"encoder batch ({c.ENCODER_BATCH} x {c.ENCODER_SEQUENCE}), self CPU time "
                   "per batch", profiles, wall=walls))


def generation(steps):
    """Greedy generation (`PROMPT` prompt tokens, `NEW_TOKENS` new ones, no stop token) at
    each batch of `GENERATION_BATCHES`; the table's milliseconds are per call."""
    keras.utils.set_random_seed(c.SEED)
    contenders = {"keras_xf": models.xf_causal_lm(), "keras-hub": models.hub_causal_lm()}
    for batch in c.GENERATION_BATCHES:
        inputs = cases._generation_inputs(batch)
        calls = {name: (lambda m=model: m.generate(dict(inputs), stop_token_ids=None))
                 for name, model in contenders.items()}
        profiles, walls = interleaved(calls, steps, _profile, warmup=2)
        print(op_table(f"greedy generation, batch {batch} ({c.NEW_TOKENS} new tokens), self "
                       "CPU time per call", profiles, wall=walls))


PHASES = {"train": training, "encode": encoding, "generate": generation}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="train,encode")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_grad_enabled(True)
    for phase in args.phases.split(","):
        PHASES[phase](args.steps)


if __name__ == "__main__":
    main()
