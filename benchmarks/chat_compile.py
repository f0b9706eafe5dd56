"""Compiles and time of a chat: 20 prompts of varied lengths through `CausalLM.generate`.

    KERAS_BACKEND=jax python -m benchmarks.chat_compile

A small `CausalLM` (2 layers, width 64, 4 heads, FFN 128, vocabulary 300,
max_sequence_length 128), batch 1, greedy search. The 20 prompts have 3 to 40 tokens and ask
for 4 to 24 new tokens each (fixed by a seeded generator), so the output lengths vary from call
to call as in a conversation. Each call asks for `max_length = len(prompt) + new`.

Printed: the number of compiled generation programs (distinct compiled function × input
shapes, counted here by wrapping the compiling function, so the count means the same before
and after a change; on PyTorch also the number of TorchScript traces), the model's own count
(`generate_compile_count`) where it has one, the first call's time, the total time and the
time of the calls that compiled nothing. Never run by the test suite; the CPU is shared, so
times are noisy and the counts are what matter.
"""

import os
import platform
import time

import numpy as np

PROMPTS, LOW, HIGH, NEW_LOW, NEW_HIGH = 20, 3, 40, 4, 24
SIZES = dict(vocabulary_size=300, num_layers=2, hidden_dim=64, num_heads=4,
             intermediate_dim=128, max_sequence_length=128)


def chat(seed=0):
    """The 20 (prompt, new tokens) pairs of the chat."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(LOW, HIGH + 1, size=PROMPTS)
    lengths[:2] = (LOW, HIGH)  # both ends of the range are in every chat
    news = rng.integers(NEW_LOW, NEW_HIGH + 1, size=PROMPTS)
    return [(rng.integers(1, SIZES["vocabulary_size"], size=n).tolist(), int(m))
            for n, m in zip(lengths, news)]


def _count_programs(task_module):
    """Wraps the compiling function that the generation base calls, recording each distinct
    (compiled function, input shapes) pair: one program per pair on every backend."""
    import keras

    programs = set()
    compile_function = task_module.compile_generate_function

    def counting(model, function, sampler):
        run = compile_function(model, function, sampler)

        def counted(*args):
            shapes = tuple(tuple(x.shape) for x in keras.tree.flatten(args))
            programs.add((id(run), shapes))
            return run(*args)

        return counted

    task_module.compile_generate_function = counting
    return programs


def _count_torch_traces():
    import keras

    traces = []
    if keras.config.backend() != "torch":
        return traces
    import torch

    trace = torch.jit.trace

    def counting(*args, **kwargs):
        traces.append(1)
        return trace(*args, **kwargs)

    torch.jit.trace = counting
    return traces


def main():
    import keras

    from keras_xf.models import CausalLM
    from keras_xf.models.generative import generative_task

    programs = _count_programs(generative_task)
    traces = _count_torch_traces()
    model = CausalLM(**SIZES)
    times = []
    compiled_calls = []
    for prompt, new in chat():
        before = len(programs) + len(traces)
        start = time.perf_counter()
        model.generate([prompt], max_length=len(prompt) + new)
        times.append(time.perf_counter() - start)
        compiled_calls.append(len(programs) + len(traces) > before)
    quiet = [t for t, c in zip(times, compiled_calls) if not c]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    print(f"backend={keras.config.backend()} cpu={cpu!r} cores={os.cpu_count()}")
    print(f"compiled programs={len(programs)}"
          + (f" torch traces={len(traces)}" if keras.config.backend() == "torch" else "")
          + (f" model.generate_compile_count={model.generate_compile_count}"
             if hasattr(model, "generate_compile_count") else ""))
    print(f"first call {times[0]:.2f} s, total {sum(times):.2f} s over {len(times)} calls, "
          f"calls that compiled {sum(compiled_calls)}, median of the others "
          f"{np.median(quiet) if quiet else float('nan'):.3f} s")


if __name__ == "__main__":
    main()
