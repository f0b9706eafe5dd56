"""What a model exports it declares through `export_endpoints()`, and export reads only that.

A model that does not generate (a `TextClassifier` whose hook serves its class probabilities
instead of its logits) exports the `serve` model its hook names; a generating task's hook gives
the prefill and decoding step that `model.generate`'s loop runs, and the exported generation
runs the steps the hook gives (the SavedModel's `generate_step` on TensorFlow and JAX, the
prefill and decoding-step programs on PyTorch).
"""

import dataclasses

import keras
import numpy as np
import pytest

from keras_xf import export
from keras_xf.export import ExportEndpoints
from keras_xf.export import GenerationSteps
from keras_xf.models import CausalLM
from keras_xf.models import TextClassifier
from keras_xf.models import VisionClassifier
from keras_xf.models import VisionLanguageLM
from tests.layer_checks import to_numpy
from tests.models.tiny import SIZES
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch

BACKEND = keras.config.backend()


class ProbabilityClassifier(TextClassifier):
    """A classifier whose exported `serve` gives class probabilities: its hook names another
    serve model than itself."""

    def export_endpoints(self):
        probabilities = keras.Model(self.input, keras.layers.Softmax()(self.output))
        return dataclasses.replace(super().export_endpoints(), serve=probabilities)


# Calls of the steps a `CountingCausalLM` declares, by step name.
CALLS = {}


def _counted(name, function):
    def counted(*args, **kwargs):
        CALLS[name] = CALLS.get(name, 0) + 1
        return function(*args, **kwargs)

    return counted


class CountingCausalLM(CausalLM):
    """A `CausalLM` whose declared generation steps count their calls in `CALLS`."""

    def export_endpoints(self):
        endpoints = super().export_endpoints()
        steps = endpoints.generation
        counted = {"generate_step": _counted("generate_step", steps.generate_step),
                   "prefill": _counted("prefill", steps.prefill),
                   "decode_token": _counted("decode_token", steps.decode_token)}
        return dataclasses.replace(endpoints, generation=dataclasses.replace(steps, **counted))


def test_the_hook_declares_inputs_limits_and_steps():
    classifier = text_classifier()
    endpoints = classifier.export_endpoints()
    assert isinstance(endpoints, ExportEndpoints) and endpoints.generation is None
    assert endpoints.serve is classifier
    assert {name: (tuple(spec.shape), spec.dtype) for name, spec in endpoints.inputs.items()} == {
        "token_ids": ((None, None), "int32"), "padding_mask": ((None, None), "int32")}
    assert endpoints.max_sequence_length == SIZES["max_sequence_length"]  # its backbone's
    vision = VisionClassifier(num_classes=3, image_shape=(4, 4, 1), patch_size=2, hidden_dim=16,
                              num_heads=2, intermediate_dim=32, num_layers=1)
    assert vision.export_endpoints().max_sequence_length is None
    lm = causal_lm(num_layers=1)
    steps = lm.export_endpoints().generation
    assert isinstance(steps, GenerationSteps)
    assert steps.prompt_keys == lm.prompt_keys and steps.pad_token_id == lm.pad_token_id
    assert steps.max_length == SIZES["max_sequence_length"] and not steps.recurrent_state
    # The export functions take the declared structure as well as the model.
    assert export.sequence_dimensions(lm.export_endpoints()) == export.sequence_dimensions(lm)


@pytest.mark.parametrize("fusion", ["none", "prefix"])
def test_declared_steps_decode_as_generate_does(fusion, rng):
    """The steps of the hook, run by the greedy loop of `docs/export.md` (prefill, then one
    token at a time from the shortest prompt), give `model.generate`'s tokens; for a
    `VisionLanguageLM` with the prefix fusion the prefill writes the image, then the text."""
    if fusion == "none":
        model, extras = randomize_embeddings(causal_lm(num_layers=1)), {}
    else:
        model = randomize_embeddings(VisionLanguageLM(**{**SIZES, "num_layers": 1},
                                                      image_shape=(4, 4, 3), patch_size=2))
        extras = {"images": rng.uniform(size=(2, 4, 4, 3)).astype("float32")}
    ids = np.array([[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0]], "int32")
    mask = ids != 0
    expected = to_numpy(model.generate({"token_ids": ids, "padding_mask": mask, **extras})[
        "token_ids"])
    steps = model.export_endpoints().generation
    context = steps.encode_context(**{k: keras.ops.convert_to_tensor(v) for k, v in extras.items()})
    cache = steps.init_cache(*ids.shape, context)
    _, cache = steps.prefill(keras.ops.convert_to_tensor(ids), cache, context)
    tokens = ids.copy()
    for index in range(int(mask.sum(axis=1).min()), ids.shape[1]):
        logits, _, cache = steps.decode_token(
            keras.ops.convert_to_tensor(tokens[:, index - 1:index]), cache, index - 1)
        tokens[:, index] = np.where(mask[:, index], tokens[:, index],
                                    to_numpy(logits).argmax(-1))
    np.testing.assert_array_equal(tokens, expected)


def test_recurrent_state_is_declared():
    from keras_xf.layers import FeedForward
    from keras_xf.layers import RecurrentMixer
    from keras_xf.layers import TransformerBlock

    block = TransformerBlock(RecurrentMixer("gru"), FeedForward(SIZES["intermediate_dim"]))
    assert causal_lm(num_layers=1, block=block).export_endpoints().generation.recurrent_state


@pytest.mark.skipif(BACKEND == "torch", reason="SavedModels are written from TensorFlow and JAX")
def test_saved_model_serves_the_declared_model(tmp_path, rng):
    import tensorflow as tf

    model = ProbabilityClassifier(num_classes=3, **{**SIZES, "num_layers": 1})
    path = model.export(str(tmp_path / "saved_model"), verbose=False)
    inputs = token_batch(rng, lengths=(8, 5))
    loaded = tf.saved_model.load(path)  # kept: it owns the variables
    served = loaded.serve({k: tf.constant(v) for k, v in inputs.items()})
    expected = keras.ops.softmax(model.predict(inputs, verbose=0))
    np.testing.assert_allclose(np.asarray(served), to_numpy(expected), atol=1e-5)
    np.testing.assert_allclose(np.asarray(served).sum(-1), 1.0, atol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.export is the PyTorch backend's format")
def test_torch_program_serves_the_declared_model(tmp_path, rng):
    import torch

    model = ProbabilityClassifier(num_classes=3, **{**SIZES, "num_layers": 1})
    path = model.export(str(tmp_path / "model.pt2"), format="torch")
    inputs = token_batch(rng, lengths=(8, 5))
    with torch.no_grad():
        served = torch.export.load(path).module()(
            {k: torch.from_numpy(v) for k, v in inputs.items()})
    expected = keras.ops.softmax(model.predict(inputs, verbose=0))
    np.testing.assert_allclose(to_numpy(served), to_numpy(expected), atol=1e-5)


@pytest.mark.skipif(BACKEND == "torch", reason="SavedModels are written from TensorFlow and JAX")
def test_saved_model_generate_runs_the_declared_loop(tmp_path):
    CALLS.clear()
    CountingCausalLM(**{**SIZES, "num_layers": 1}).export(str(tmp_path / "saved_model"),
                                                          verbose=False)
    assert CALLS.get("generate_step", 0) >= 1  # traced for the endpoint


@pytest.mark.skipif(BACKEND != "torch", reason="the prefill and step programs are PyTorch's")
def test_torch_programs_trace_the_declared_steps(tmp_path):
    CALLS.clear()
    model = CountingCausalLM(**{**SIZES, "num_layers": 1})
    export.export_prefill(model, str(tmp_path / "prefill.pt2"), format="torch")
    assert CALLS.get("prefill", 0) >= 1 and "decode_token" not in CALLS
    export.export_decode_step(model, str(tmp_path / "step.pt2"), format="torch")
    assert CALLS.get("decode_token", 0) >= 1
