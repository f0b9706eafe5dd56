"""Where the time goes on TensorFlow: the top XLA ops of one training step and of one decoded
token of the benchmark `CausalLM`, from TensorFlow's profiler trace.

    KERAS_BACKEND=tensorflow python -m benchmarks.profile_tensorflow

Each phase is profiled after warm-up; the trace (`xplane.pb`) is summed over the op events of
TensorFlow's compute threads ("scope/op:Type" in graph mode, "fusion_kind.N" inside XLA
clusters such as the compiled decoding loop) and printed by op type, in milliseconds per
training step or per decoded token.
"""

import collections
import glob
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from benchmarks import cases  # noqa: E402
from benchmarks import config as c  # noqa: E402
from benchmarks import models  # noqa: E402

TOP = 12


def _profile(function, repeats):
    """Op name → total milliseconds over `repeats` calls of `function`, from the trace."""
    directory = tempfile.mkdtemp(prefix="xf_tf_profile_")
    tf.profiler.experimental.start(directory)
    for _ in range(repeats):
        function()
    tf.profiler.experimental.stop()
    totals = collections.Counter()
    for path in glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            names = {key: meta.name for key, meta in plane.event_metadata.items()}
            for line in plane.lines:
                if line.name == "python":
                    continue
                for event in line.events:
                    name = names.get(event.metadata_id, "?")
                    # Skip wrappers that enclose other events: executors, functions, XLA loops.
                    if "::" not in name and not name.startswith(("__inference", "while")):
                        # "scope/op_name:OpType" (TensorFlow ops) or "fusion_kind.N" (XLA)
                        totals[name] += event.duration_ps
    return {key: ps / 1e9 for key, ps in totals.items()}


def _report(title, totals, divisor):
    """Prints the milliseconds per unit by op type, then the top single ops."""
    total = sum(totals.values()) / divisor
    print(f"\n{title}: {total:.2f} ms of ops per unit (both compute threads summed)")
    by_type = collections.Counter()
    for name, ms in totals.items():
        op_type = name.rsplit(":", 1)[1] if ":" in name else name.rsplit(".", 1)[0]
        by_type[op_type] += ms / divisor
    for op_type, ms in by_type.most_common(TOP):
        print(f"  {ms:8.2f} ms  {100 * ms / total:5.1f} %  {op_type}")
    print("  top single ops:")
    for name, ms in collections.Counter(totals).most_common(6):
        print(f"  {ms / divisor:8.2f} ms  {name[-110:]}")


def main():
    keras.utils.set_random_seed(c.SEED)
    model = models.compile_for_training(models.xf_causal_lm())
    x, y = cases._training_data(1)
    for _ in range(3):
        model.train_on_batch(x, y)
    steps = 2
    _report("training step (8 x 256 tokens)",
            _profile(lambda: model.train_on_batch(x, y), steps), steps)

    inputs = cases._generation_inputs(1)
    for _ in range(2):
        model.generate(dict(inputs), stop_token_ids=None)
    _report(f"greedy decoding, batch 1 (per token, {c.NEW_TOKENS} tokens a call)",
            _profile(lambda: np.asarray(model.generate(dict(inputs),
                                                       stop_token_ids=None)["token_ids"]), 1),
            c.NEW_TOKENS)


if __name__ == "__main__":
    main()
