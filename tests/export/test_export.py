"""Exported artefacts give the Keras model's outputs, at the export shapes and at new ones.

SavedModel on TensorFlow and JAX (loaded with TensorFlow, `serve` called with a dict of int32
tensors); ONNX (run with onnxruntime) and `.pt2` (torch.export) on PyTorch. Every format a
backend cannot export must raise a clear `ValueError`.
"""

import importlib.util

import keras
import numpy as np
import pytest

from keras_xf import export
from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqLM
from keras_xf.models import TextClassifier
from keras_xf.models import TextEncoder
from keras_xf.models import VisionClassifier

BACKEND = keras.config.backend()
VOCABULARY = 37
TOLERANCE = 1e-4  # float32 logits of a tiny model; observed differences are ~1e-7


def tiny_causal_lm():
    # Learned positions: the table is sliced to the symbolic length (JAX needs the length
    # constraint, torch.export a plain slice). The Seq2SeqLM covers sinusoidal positions.
    return CausalLM(vocabulary_size=VOCABULARY, num_layers=1, hidden_dim=16, num_heads=2,
                    intermediate_dim=32, max_sequence_length=24, position="learned")


def tiny_seq2seq_lm():
    return Seq2SeqLM(vocabulary_size=VOCABULARY, num_layers=1, hidden_dim=16, num_heads=2,
                     intermediate_dim=32, max_sequence_length=24)


def tiny_text_classifier():
    # [CLS] pooling: the exported graph runs the last layer on the first position alone.
    return TextClassifier(num_classes=3, vocabulary_size=VOCABULARY, num_layers=2, hidden_dim=16,
                          num_heads=2, intermediate_dim=32, max_sequence_length=24,
                          pooling="cls")


def tiny_text_encoder():
    return TextEncoder(vocabulary_size=VOCABULARY, num_layers=1, hidden_dim=16, num_heads=2,
                       intermediate_dim=32, max_sequence_length=24)


IMAGE_SHAPE = (4, 4, 1)


def tiny_vision_classifier():
    return VisionClassifier(num_classes=3, image_shape=IMAGE_SHAPE, patch_size=2, hidden_dim=16,
                            num_heads=2, intermediate_dim=32, num_layers=1)


def sequence(rng, batch, length, prefix=""):
    """Random ids with right padding in the last row (so masks matter)."""
    ids = rng.integers(1, VOCABULARY, size=(batch, length)).astype("int32")
    mask = np.ones((batch, length), "int32")
    mask[-1, max(1, length // 2):] = 0
    ids[mask == 0] = 0
    return {f"{prefix}token_ids": ids, f"{prefix}padding_mask": mask}


def causal_inputs(rng, batch, length):
    return sequence(rng, batch, length)


def seq2seq_inputs(rng, batch, length):
    # Source and target lengths differ, so a shared length symbol would be wrong.
    return {**sequence(rng, batch, length + 2, "encoder_"),
            **sequence(rng, batch, length, "decoder_")}


def image_inputs(rng, batch, length):
    # Images have a fixed size: only the batch varies.
    return {"images": rng.uniform(size=(batch,) + IMAGE_SHAPE).astype("float32")}


MODELS = [
    pytest.param(tiny_causal_lm, causal_inputs, id="causal_lm"),
    pytest.param(tiny_seq2seq_lm, seq2seq_inputs, id="seq2seq_lm"),
]
# Every kind of keras_xf task, for `model.export` with Keras' defaults.
ALL_MODELS = MODELS + [
    pytest.param(tiny_text_classifier, causal_inputs, id="text_classifier"),
    pytest.param(tiny_text_encoder, causal_inputs, id="text_encoder"),
    pytest.param(tiny_vision_classifier, image_inputs, id="vision_classifier"),
]
# Two batch sizes and lengths: the artefact must not be specialised to one shape (SavedModels
# are exported fully symbolic; torch.export traces at [2, 3]).
SHAPES = [(2, 8), (3, 5)]


def check_matches(model, run, make_inputs, rng):
    for batch, length in SHAPES:
        inputs = make_inputs(rng, batch, length)
        expected = model.predict(inputs, verbose=0)
        actual = np.asarray(run(inputs))
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, atol=TOLERANCE, rtol=0)


def check_shared_dimensions(model):
    """Each sequence's ids and mask share one length symbol; the two sequences do not."""
    dims = export.sequence_dimensions(model)
    for prefix in ("", "encoder_", "decoder_"):
        if f"{prefix}token_ids" in dims:
            assert dims[f"{prefix}token_ids"] == dims[f"{prefix}padding_mask"] == (
                "batch", f"{prefix}length")
    assert len(set(dims.values())) == len(dims) // 2


# SavedModel ----------------------------------------------------------------------------------
def serve_saved_model(path):
    import tensorflow as tf

    served = tf.saved_model.load(path)

    def run(inputs):
        return served.serve({name: tf.constant(value) for name, value in inputs.items()})

    return run


@pytest.mark.skipif(BACKEND == "torch", reason="Keras exports SavedModels from torch only "
                    "through torch_xla, which has no release for this torch version")
@pytest.mark.parametrize("build, make_inputs", ALL_MODELS)
def test_model_export_with_keras_defaults_serves_predict(build, make_inputs, tmp_path, rng):
    # `model.export(path)` as Keras documents it: format="tf_saved_model", no signature.
    model = build()
    path = str(tmp_path / "saved_model")
    assert model.export(path, verbose=False) == path
    check_matches(model, serve_saved_model(path), make_inputs, rng)


@pytest.mark.skipif(BACKEND == "torch", reason="Keras exports SavedModels from torch only "
                    "through torch_xla, which has no release for this torch version")
def test_export_saved_model_function_matches_predict(tmp_path, rng):
    model = tiny_causal_lm()
    check_shared_dimensions(model)
    path = export.export_saved_model(model, str(tmp_path / "saved_model"))
    check_matches(model, serve_saved_model(path), causal_inputs, rng)


@pytest.mark.skipif(BACKEND == "torch", reason="Keras exports SavedModels from torch only "
                    "through torch_xla, which has no release for this torch version")
def test_model_export_keeps_a_given_signature(tmp_path, rng):
    # A fixed length of the user's: the batch stays free, other lengths are refused.
    model = tiny_causal_lm()
    signature = [{name: keras.InputSpec(shape=(None, 5), dtype="int32", name=name)
                  for name in ("token_ids", "padding_mask")}]
    path = str(tmp_path / "saved_model")
    model.export(path, input_signature=signature, verbose=False)
    run = serve_saved_model(path)
    for batch in (2, 3):
        inputs = causal_inputs(rng, batch, 5)
        np.testing.assert_allclose(np.asarray(run(inputs)), model.predict(inputs, verbose=0),
                                   atol=TOLERANCE, rtol=0)
    with pytest.raises(Exception):
        run(causal_inputs(rng, 2, 6))


@pytest.mark.skipif(BACKEND != "torch", reason="the PyTorch backend's limitation is tested")
def test_saved_model_on_torch_raises_clear_error(tmp_path):
    model = tiny_causal_lm()
    with pytest.raises(ValueError, match="torch_xla"):
        export.export_saved_model(model, str(tmp_path / "saved_model"))
    # Keras' default format: the error names the formats PyTorch exports.
    with pytest.raises(ValueError, match="format='onnx'"):
        model.export(str(tmp_path / "saved_model"))


# PyTorch: ONNX and torch.export --------------------------------------------------------------
@pytest.mark.skipif(BACKEND != "torch", reason="ONNX export is the PyTorch backend's format")
@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None
                    or importlib.util.find_spec("onnxscript") is None,
                    reason="needs onnx, onnxscript and onnxruntime (pip install keras-xf[dev])")
@pytest.mark.parametrize("build, make_inputs", MODELS)
def test_onnx_matches_predict(build, make_inputs, tmp_path, rng):
    import onnxruntime

    model = build()
    check_shared_dimensions(model)
    path = export.export_onnx(model, str(tmp_path / "model.onnx"))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert {node.name for node in session.get_inputs()} == set(model._inputs_struct)
    check_matches(model, lambda inputs: session.run(None, inputs)[0], make_inputs, rng)


@pytest.mark.skipif(BACKEND != "torch", reason="ONNX export is the PyTorch backend's format")
@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None
                    or importlib.util.find_spec("onnxscript") is None,
                    reason="needs onnx, onnxscript and onnxruntime (pip install keras-xf[dev])")
@pytest.mark.parametrize("build, make_inputs", ALL_MODELS[2:])
def test_model_export_onnx_matches_predict(build, make_inputs, tmp_path, rng):
    # `model.export(path, format="onnx")` as Keras documents it (the two LMs: above).
    import onnxruntime

    model = build()
    path = str(tmp_path / "model.onnx")
    model.export(path, format="onnx")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    check_matches(model, lambda inputs: session.run(None, inputs)[0], make_inputs, rng)
    with pytest.raises(ValueError, match="input_signature"):
        model.export(path, format="onnx", input_signature=export.input_signature(model))


@pytest.mark.skipif(BACKEND != "torch", reason="torch.export is the PyTorch backend's format")
def test_torch_export_matches_predict(tmp_path, rng):
    import torch

    model = tiny_causal_lm()
    path = str(tmp_path / "model.pt2")
    model.export(path, format="torch")  # keras_xf's `export_torch`
    module = torch.export.load(path).module()

    def run(inputs):
        with torch.no_grad():
            out = module({name: torch.from_numpy(value) for name, value in inputs.items()})
        return out.detach().cpu().numpy()

    check_matches(model, run, causal_inputs, rng)


@pytest.mark.skipif(BACKEND == "torch", reason="the TensorFlow / JAX limitation is tested")
def test_onnx_and_torch_export_need_torch(tmp_path):
    model = tiny_causal_lm()
    with pytest.raises(ValueError, match="PyTorch backend"):
        export.export_onnx(model, str(tmp_path / "model.onnx"))
    with pytest.raises(ValueError, match="PyTorch backend"):
        export.export_torch(model, str(tmp_path / "model.pt2"))
    # The same through Keras' `model.export`, and the error names the SavedModel instead.
    with pytest.raises(ValueError, match=r"model.export\(path\)"):
        model.export(str(tmp_path / "model.onnx"), format="onnx")
    with pytest.raises(ValueError, match="PyTorch backend"):
        model.export(str(tmp_path / "model.pt2"), format="torch")


def test_rejects_models_without_dict_inputs(tmp_path):
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    function = export.export_onnx if BACKEND == "torch" else export.export_saved_model
    with pytest.raises(ValueError, match="dict inputs"):
        function(model, str(tmp_path / "model"))
