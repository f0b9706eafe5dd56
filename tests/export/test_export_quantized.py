"""Quantised serving: an `int8` model (`model.quantize("int8")`) exports and serves on the
paths of a float32 one.

Keras quantises the `Dense` and `EinsumDense` layers of keras_xf's blocks (attention
projections, feedforward) and keras_xf's `TokenEmbedding` (its table, which is also the tied
output projection, int8 with one scale per token). SavedModel (TensorFlow, JAX): `serve` gives the int8 model's logits
and `generate` its greedy tokens, loaded with plain `tf.saved_model.load`, for a `CausalLM` and
a `Seq2SeqLM`. PyTorch: the ONNX forward pass, and the cached decoding step (ONNX and `.pt2`)
run by the documented loop, give the int8 model's logits and greedy tokens.
"""

import importlib.util
import warnings

import keras
import numpy as np
import pytest

from keras_xf import export
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch

BACKEND = keras.config.backend()
TOLERANCE = 1e-4  # the artefact against the int8 model it was exported from
PROMPTS = np.array([[5, 6, 7, 0, 0, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0, 0, 0]], "int32")
SAVED_MODEL = pytest.mark.skipif(BACKEND == "torch", reason="SavedModels are written from "
                                 "TensorFlow and JAX (the PyTorch tests below use ONNX / .pt2)")
ONNX = pytest.mark.skipif(
    BACKEND != "torch" or importlib.util.find_spec("onnxruntime") is None
    or importlib.util.find_spec("onnxscript") is None,
    reason="ONNX and torch.export are the PyTorch backend's formats; they need onnx, onnxscript "
    "and onnxruntime")


@pytest.fixture(scope="module")
def causal():
    model = randomize_embeddings(causal_lm(num_layers=1))
    inputs = token_batch(np.random.default_rng(0))
    float_logits = np.asarray(model.predict(inputs, verbose=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    model.quantize_warnings = [str(warning.message) for warning in caught]
    return model, inputs, float_logits


def embedding_of(model):
    return model.backbone.embeddings.token_embedding


def test_token_embedding_quantises_without_a_warning(causal):
    model = causal[0]
    assert not [text for text in model.quantize_warnings if "TokenEmbedding" in text]
    embedding = embedding_of(model)
    assert embedding.quantization_mode == "int8"
    assert keras.backend.standardize_dtype(embedding.embeddings.dtype) == "int8"
    assert embedding.embeddings_scale.shape == (embedding.vocabulary_size,)


def test_int8_causal_lm_keras_file_round_trip_and_generate(causal, tmp_path):
    model, inputs, _ = causal
    path = str(tmp_path / "int8.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    # Every quantised layer comes back int8 (the model's config maps their paths to int8).
    assert {layer.path: layer.quantization_mode for layer in loaded._flatten_layers()} == \
        {layer.path: layer.quantization_mode for layer in model._flatten_layers()}
    assert keras.backend.standardize_dtype(embedding_of(loaded).embeddings.dtype) == "int8"
    np.testing.assert_array_equal(np.asarray(loaded.predict(inputs, verbose=0)),
                                  np.asarray(model.predict(inputs, verbose=0)))
    prompts = {"token_ids": PROMPTS, "padding_mask": (PROMPTS != 0).astype("int32")}
    expected = model.generate(prompts, max_length=10)
    np.testing.assert_array_equal(loaded.generate(prompts, max_length=10)["token_ids"],
                                  expected["token_ids"])
    assert (expected["token_ids"][:, 5:] != 0).any()  # it generated past the prompts


def test_int8_task_with_a_recorded_backbone_round_trips(tmp_path):
    # A classifier records its backbone's config at construction (float32 then): loading
    # quantises the layers its saved policy map names before the int8 weights are read.
    model = randomize_embeddings(text_classifier())
    inputs = token_batch(np.random.default_rng(1))
    model.predict(inputs, verbose=0)
    model.quantize("int8")
    path = str(tmp_path / "classifier.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    modes = {layer.path: layer.quantization_mode for layer in loaded._flatten_layers()}
    assert modes == {layer.path: layer.quantization_mode for layer in model._flatten_layers()}
    assert "int8" in modes.values()
    np.testing.assert_array_equal(np.asarray(loaded.predict(inputs, verbose=0)),
                                  np.asarray(model.predict(inputs, verbose=0)))


def test_blocks_quantise_and_logits_stay_close(causal):
    model, inputs, float_logits = causal
    modes = {layer.name: layer.quantization_mode for layer in model._flatten_layers()
             if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))}
    # query, key, value, attention_output, the FFN's hidden and output: all int8
    assert len(modes) == 6 and set(modes.values()) == {"int8"}, modes
    kernels = [w for w in model.weights if w.path.endswith("kernel")]
    assert kernels and all(keras.backend.standardize_dtype(w.dtype) == "int8" for w in kernels)
    difference = np.abs(np.asarray(model.predict(inputs, verbose=0)) - float_logits).max()
    assert 0 < difference < 0.05 * np.abs(float_logits).max()


@pytest.fixture(scope="module")
def saved(causal, tmp_path_factory):
    """The int8 CausalLM and an int8 Seq2SeqLM exported with `model.export(path)`."""
    model = causal[0]
    folder = tmp_path_factory.mktemp("int8")
    model.export(str(folder / "causal"), verbose=False)
    translator = randomize_embeddings(seq2seq_lm(start_token_id=1))
    translator.quantize("int8")
    translator.export(str(folder / "seq2seq"), verbose=False)
    return folder, translator


def generate_request(inputs, max_length):
    import tensorflow as tf

    return {**{key: tf.constant(value, tf.int32) for key, value in inputs.items()},
            "max_length": tf.constant(max_length, tf.int32),
            "stop_token_ids": tf.zeros([0], tf.int32), "seed": tf.constant(0, tf.int32)}


@SAVED_MODEL
def test_saved_model_serves_int8_logits_and_weights(causal, saved):
    import tensorflow as tf

    model, inputs, _ = causal
    loaded = tf.saved_model.load(str(saved[0] / "causal"))
    dtypes = {variable.dtype for variable in loaded.variables}
    assert tf.int8 in dtypes  # the artefact holds the int8 kernels, not float32 copies
    # ... and the int8 token table: no float32 variable of the table's shape is left.
    table = tuple(embedding_of(model).embeddings.shape)
    tables = [v for v in loaded.variables if tuple(v.shape) == table]
    assert tables and {v.dtype for v in tables} == {tf.int8}
    served = loaded.serve({key: tf.constant(value) for key, value in inputs.items()})
    np.testing.assert_allclose(np.asarray(served), np.asarray(model.predict(inputs, verbose=0)),
                               atol=TOLERANCE)


@SAVED_MODEL
def test_saved_model_generate_equals_int8_generate(causal, saved):
    import tensorflow as tf

    model = causal[0]
    inputs = {"token_ids": PROMPTS, "padding_mask": (PROMPTS != 0).astype("int32")}
    expected = model.generate(inputs, max_length=10)
    loaded = tf.saved_model.load(str(saved[0] / "causal"))
    outputs = loaded.generate(generate_request(inputs, 10))
    np.testing.assert_array_equal(np.asarray(outputs["token_ids"]), expected["token_ids"])
    np.testing.assert_array_equal(np.asarray(outputs["padding_mask"]), expected["padding_mask"])


@SAVED_MODEL
def test_seq2seq_saved_model_generate_equals_int8_generate(saved):
    import tensorflow as tf

    folder, translator = saved
    assert {layer.quantization_mode for layer in translator._flatten_layers()
            if isinstance(layer, keras.layers.EinsumDense)} == {"int8"}
    source = np.array([[5, 6, 7, 8, 0, 0], [0, 9, 10, 11, 12, 13]], "int32")
    target = np.array([[1, 4, 0], [1, 0, 0]], "int32")
    inputs = {"encoder_token_ids": source, "encoder_padding_mask": (source != 0).astype("int32"),
              "decoder_token_ids": target, "decoder_padding_mask": (target != 0).astype("int32")}
    expected = translator.generate(inputs, max_length=8)
    loaded = tf.saved_model.load(str(folder / "seq2seq"))  # kept: it owns the variables
    outputs = loaded.generate(generate_request(inputs, 8))
    np.testing.assert_array_equal(np.asarray(outputs["decoder_token_ids"]),
                                  expected["decoder_token_ids"])


@ONNX
def test_onnx_serves_int8_logits(causal, tmp_path):
    import onnxruntime

    model, inputs, _ = causal
    path = model.export(str(tmp_path / "lm.onnx"), format="onnx")
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, inputs)[0],
                               np.asarray(model.predict(inputs, verbose=0)), atol=TOLERANCE)


@ONNX
def test_decode_step_loop_reproduces_int8_generate(causal, tmp_path):
    import onnxruntime
    import torch

    from tests.export.test_export_decode import greedy_loop
    from tests.export.test_export_decode import zero_cache

    model = causal[0]
    mask = PROMPTS != 0
    caches = zero_cache(model, *PROMPTS.shape)
    expected = model.generate({"token_ids": PROMPTS, "padding_mask": mask})["token_ids"]

    path = export.export_decode_step(model, str(tmp_path / "step.onnx"))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]

    def onnx_step(token_ids, cache_index, caches):
        return session.run(None, dict(zip(names, [token_ids, cache_index, *caches])))

    np.testing.assert_array_equal(greedy_loop(onnx_step, PROMPTS, mask, caches), expected)

    module = torch.export.load(
        export.export_decode_step(model, str(tmp_path / "step.pt2"), format="torch")).module()

    def torch_step(token_ids, cache_index, caches):
        with torch.no_grad():
            outputs = module(torch.from_numpy(token_ids), torch.tensor(int(cache_index)),
                             *[torch.from_numpy(c) for c in caches])
        return [output.numpy() for output in outputs]

    np.testing.assert_array_equal(greedy_loop(torch_step, PROMPTS, mask, caches), expected)
