"""Where the time goes on TensorFlow: the top XLA ops of one training step and of one decoded
token of the benchmark `CausalLM`, and one encoder batch of `TextEncoder` and keras-hub's
`BertBackbone` side by side, from TensorFlow's profiler trace.

    KERAS_BACKEND=tensorflow python -m benchmarks.profile_tensorflow [--encoder-only]
    KERAS_BACKEND=tensorflow python -m benchmarks.profile_tensorflow --training-pair

Each phase is profiled after warm-up; the trace (`xplane.pb`) is summed over the op events of
TensorFlow's compute threads ("scope/op:Type" in graph mode, "fusion_kind.N" inside XLA
clusters such as the compiled decoding loop) and printed by op type, in milliseconds per
training step or per decoded token; the encoders' table (and with `--training-pair` the
training steps of both models) is the median over three calls of each, the two models
alternating.
"""

import collections
import os
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import cases  # noqa: E402
from benchmarks import config as c  # noqa: E402
from benchmarks import models  # noqa: E402
from benchmarks import profiling  # noqa: E402
from benchmarks.profiling import trace_events  # noqa: E402
from benchmarks.report import interleaved  # noqa: E402
from benchmarks.report import op_table  # noqa: E402

TOP = 12


def _profile(function, repeats):
    """Op name → total milliseconds over `repeats` calls of `function`, from the trace, and
    the calls' wall-clock milliseconds."""
    directory = tempfile.mkdtemp(prefix="xf_tf_profile_")
    tf.profiler.experimental.start(directory)
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    wall = 1e3 * (time.perf_counter() - start)
    tf.profiler.experimental.stop()
    totals = collections.Counter()
    for name, event, _ in trace_events(directory):
        # Skip wrappers that enclose other events: executors, functions, XLA loops.
        if "::" not in name and not name.startswith(("__inference", "while")):
            # "scope/op_name:OpType" (TensorFlow ops) or "fusion_kind.N" (XLA)
            totals[name] += event.duration_ps
    return {key: ps / 1e9 for key, ps in totals.items()}, wall


def _op_type(name):
    """"scope/op_name:OpType" → "OpType"; "fusion_kind.N" → "fusion_kind"."""
    return name.rsplit(":", 1)[1] if ":" in name else name.rsplit(".", 1)[0]


def _report(title, totals, divisor):
    """Prints the milliseconds per unit by op type, then the top single ops."""
    total = sum(totals.values()) / divisor
    print(f"\n{title}: {total:.2f} ms of ops per unit (both compute threads summed)")
    by_type = collections.Counter()
    for name, ms in totals.items():
        by_type[_op_type(name)] += ms / divisor
    for op_type, ms in by_type.most_common(TOP):
        print(f"  {ms:8.2f} ms  {100 * ms / total:5.1f} %  {op_type}")
    print("  top single ops:")
    for name, ms in collections.Counter(totals).most_common(6):
        print(f"  {ms / divisor:8.2f} ms  {name[-110:]}")


def _profile_by_type(name, call):
    """{op type: (ms, ops)} of one call of the model `name`, as `report.op_table` takes, and
    the call's wall-clock ms."""
    totals, wall = _profile(call, 1)
    by_type = collections.defaultdict(lambda: [0.0, 0])
    for op, ms in totals.items():
        entry = by_type[_op_type(op)]
        entry[0] += ms
        entry[1] += 1
    return {k: tuple(v) for k, v in by_type.items()}, wall


def encoding(rounds=3):
    profiles, walls = interleaved(profiling.encoder_calls(), rounds, _profile_by_type,
                                  warmup=2)
    print(op_table(f"\nencoder batch ({c.ENCODER_BATCH} x {c.ENCODER_SEQUENCE}), op time per "
                   "batch (both compute threads summed)", profiles, wall=walls))


def training_pair(rounds=3):
    """One training step (`train_on_batch`, 8 x 256 tokens) of the benchmark `CausalLM` and of
    keras-hub's `GPT2CausalLM` side by side, alternating, the median over `rounds` steps."""
    profiles, walls = interleaved(profiling.training_calls(chunked=False), rounds,
                                  _profile_by_type, warmup=3)
    print(op_table("\ntraining step (8 x 256 tokens), op time per step (both compute threads "
                   "summed)", profiles, wall=walls))


def training_and_decoding():
    keras.utils.set_random_seed(c.SEED)
    model = models.compile_for_training(models.xf_causal_lm())
    x, y = cases._training_data(1)
    for _ in range(3):
        model.train_on_batch(x, y)
    steps = 2
    _report("training step (8 x 256 tokens)",
            _profile(lambda: model.train_on_batch(x, y), steps)[0], steps)

    inputs = cases._generation_inputs(1)
    for _ in range(2):
        model.generate(dict(inputs), stop_token_ids=None)
    _report(f"greedy decoding, batch 1 (per token, {c.NEW_TOKENS} tokens a call)",
            _profile(lambda: np.asarray(model.generate(dict(inputs),
                                                       stop_token_ids=None)["token_ids"]), 1)[0],
            c.NEW_TOKENS)


def main():
    if "--training-pair" in sys.argv:
        training_pair()
        return
    if "--encoder-only" not in sys.argv:
        training_and_decoding()
    encoding()


if __name__ == "__main__":
    main()
