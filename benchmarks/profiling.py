"""What the profilers (`profile_jax`, `profile_torch`, `profile_tensorflow`) share: the calls
they profile side by side, and the op events of a TensorFlow/XLA profiler trace."""

import glob
import os

import keras

from benchmarks import cases
from benchmarks import config as c
from benchmarks import models


def training_calls(chunked=True):
    """name → one training step (`train_on_batch`, `BATCH` x `SEQUENCE` tokens) of the
    compiled keras_xf `CausalLM`, with `chunked` also of one with `ChunkedCrossEntropy`, and
    of keras-hub's `GPT2CausalLM`."""
    x, y = cases._training_data(1)
    keras.utils.set_random_seed(c.SEED)
    contenders = {"keras_xf": models.compile_for_training(models.xf_causal_lm())}
    if chunked:
        contenders["keras_xf chunked"] = models.compile_for_training(models.xf_causal_lm(), True)
    contenders["keras-hub"] = models.compile_for_training(models.hub_causal_lm())
    return {name: (lambda m=model: m.train_on_batch(x, y)) for name, model in contenders.items()}


def encoder_calls():
    """name → one `predict_on_batch` of `ENCODER_BATCH` x `ENCODER_SEQUENCE` tokens by
    keras_xf's `TextEncoder` and by keras-hub's `BertBackbone`."""
    keras.utils.set_random_seed(c.SEED)
    contenders = {"keras_xf": (models.xf_text_encoder(), cases._encoder_inputs(False)),
                  "keras-hub": (models.hub_text_encoder(), cases._encoder_inputs(True))}
    calls = {}
    for name, (model, x) in contenders.items():
        batch = {k: v[: c.ENCODER_BATCH] for k, v in x.items()}
        calls[name] = lambda m=model, b=batch: m.predict_on_batch(b)
    return calls


def trace_events(directory):
    """`(name, event, stat_names)` of each event of the profiler traces (`*.xplane.pb`) under
    `directory`, the Python tracer's lines left out: the event's name ("?" where its metadata
    is missing), the event, and its plane's stat id → stat name."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for path in glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            names = {key: meta.name for key, meta in plane.event_metadata.items()}
            stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
            for line in plane.lines:
                if line.name == "python":
                    continue
                for event in line.events:
                    yield names.get(event.metadata_id, "?"), event, stat_names
