"""PyTorch's exported generation: the prefill and the cached decoding step (ONNX and `.pt2`),
run by the greedy loop of `docs/export.md`, give `model.generate`'s tokens.

One tiny model per case: a `CausalLM` with a learned position table (GPT-2-like: the table is
read at a tensor `cache_index`), one with rotary positions (the step alone, from a zero cache),
a `Seq2SeqLM` (the prefill encodes the source and writes the cross-attention keys and values)
and a `VisionLanguageLM` (its default prefix fusion: the prefill writes the image into the
self-attention cache); and a `Seq2SeqLM` with a recurrent (GRU) decoder, whose loop starts at
index 1 (`.pt2`). On TensorFlow and JAX both functions raise a `ValueError` pointing to the
SavedModel's `generate` endpoint.
"""

import importlib.util

import keras
import numpy as np
import pytest

from keras_xf import export
from keras_xf.models import CausalLM
from keras_xf.models import VisionLanguageLM
from tests.models.tiny import SIZES
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_lm

BACKEND = keras.config.backend()
ONNX = pytest.mark.skipif(
    BACKEND != "torch" or importlib.util.find_spec("onnxruntime") is None
    or importlib.util.find_spec("onnxscript") is None,
    reason="ONNX and torch.export are the PyTorch backend's formats; they need onnx, onnxscript "
    "and onnxruntime (pip install keras-xf[dev])")
# Prompts left-aligned at the output width 8, of different lengths.
PROMPTS = np.array([[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 0, 0, 0]], "int32")
TARGETS = np.array([[1, 4, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]], "int32")
SOURCES = np.array([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]], "int32")


def prompts(ids):
    return {"token_ids": ids, "padding_mask": ids != 0}


def tasks():
    """`{name: (model, inputs of generate, extra inputs of the prefill, whether the loop
    starts from the prefill)}`."""
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(2, 4, 4, 3)).astype("float32")
    sources = {"encoder_token_ids": SOURCES, "encoder_padding_mask": (SOURCES != 0).astype("int32")}
    vision = VisionLanguageLM(**{**SIZES, "num_layers": 1}, image_shape=(4, 4, 3), patch_size=2)
    return {
        "causal_lm_learned": (CausalLM(**{**SIZES, "num_layers": 1}, position="learned"),
                              prompts(PROMPTS), {}, True),
        "causal_lm_rotary": (causal_lm(num_layers=1), prompts(PROMPTS), {}, False),
        "seq2seq_lm": (seq2seq_lm(start_token_id=1),
                       {**sources, "decoder_token_ids": TARGETS,
                        "decoder_padding_mask": TARGETS != 0}, sources, True),
        "vision_language_lm": (vision, {"images": images, **prompts(PROMPTS)},
                               {"images": images}, True),
    }


def greedy_loop(step, ids, mask, caches, start=1):
    """The documented loop over an exported decoding step: from `start`, feed the token at
    `index - 1`, keep prompt tokens, take the argmax elsewhere."""
    ids = ids.copy()
    for index in range(start, ids.shape[1]):
        logits, *caches = step(ids[:, index - 1:index], np.array(index - 1, "int64"), caches)
        ids[:, index] = np.where(mask[:, index], ids[:, index], np.argmax(logits, axis=-1))
    return ids


def zero_cache(model, batch, length):
    """A `CausalLM`'s empty cache, as the loop without a prefill starts from."""
    return [keras.ops.convert_to_numpy(cache)
            for cache in keras.tree.flatten(model.init_cache(batch, length))]


def runner(path, format):
    """`(input names, run)` of an exported program: `run(*inputs)` gives its outputs as
    numpy arrays (onnxruntime for ONNX, the `.pt2` module under `torch.no_grad`)."""
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [node.name for node in session.get_inputs()]
        return names, lambda *inputs: session.run(None, dict(zip(names, inputs)))
    import torch

    module = torch.export.load(path).module()

    def run(*inputs):
        with torch.no_grad():
            outputs = module(*[torch.as_tensor(value) for value in inputs])
        return [output.numpy() for output in outputs]

    return None, run


@pytest.fixture(scope="module")
def models():
    built = {}
    for name, (model, inputs, extras, prefill) in tasks().items():
        model = randomize_embeddings(model)
        ids_key, mask_key = model.prompt_keys
        expected = model.generate(inputs)[ids_key]
        built[name] = (model, inputs[ids_key], np.asarray(inputs[mask_key], bool), extras,
                       prefill, np.asarray(expected))
    return built


@ONNX
@pytest.mark.parametrize("format", ["onnx", "torch"])
@pytest.mark.parametrize("name", ["causal_lm_learned", "causal_lm_rotary", "seq2seq_lm",
                                  "vision_language_lm"])
def test_loop_over_exported_programs_reproduces_generate(models, name, format, tmp_path):
    model, ids, mask, extras, prefill, expected = models[name]
    suffix = "onnx" if format == "onnx" else "pt2"
    names, run_step = runner(
        export.export_decode_step(model, str(tmp_path / f"step.{suffix}"), format=format), format)
    if names is not None:
        assert names[:2] == ["token_ids", "cache_index"]

    def step(token_ids, cache_index, caches):
        return run_step(token_ids, cache_index, *caches)

    if not prefill:  # a CausalLM's step alone: zeros, the loop feeding the prompt from 1
        np.testing.assert_array_equal(greedy_loop(step, ids, mask, zero_cache(model, *ids.shape)),
                                      expected)
        return
    names, run_prefill = runner(
        export.export_prefill(model, str(tmp_path / f"prefill.{suffix}"), format=format), format)
    if names is not None:
        assert names == [model.prompt_keys[0], *extras]
    caches = run_prefill(ids, *extras.values())
    start = int(mask.sum(axis=1).min())
    np.testing.assert_array_equal(greedy_loop(step, ids, mask, caches, start), expected)


@pytest.mark.skipif(BACKEND == "torch", reason="the TensorFlow / JAX refusal is tested")
@pytest.mark.parametrize("function", [export.export_decode_step, export.export_prefill])
def test_generation_programs_need_torch(function, tmp_path):
    with pytest.raises(ValueError, match="SavedModel with a `generate`"):
        function(causal_lm(num_layers=1), str(tmp_path / "step.onnx"))


@pytest.mark.skipif(BACKEND != "torch", reason="checked before anything is traced, on PyTorch")
@pytest.mark.parametrize("function", [export.export_decode_step, export.export_prefill])
def test_generation_programs_reject_bad_arguments(function, tmp_path):
    from tests.models.tiny import text_classifier

    with pytest.raises(ValueError, match="Seq2SeqLM"):
        function(text_classifier(), str(tmp_path / "step.onnx"))
    model = causal_lm(num_layers=1)
    with pytest.raises(ValueError, match="format must be"):
        function(model, str(tmp_path / "step.onnx"), format="tflite")
    with pytest.raises(ValueError, match=r"\.pt2"):
        function(model, str(tmp_path / "step.onnx"), format="torch")


@ONNX
def test_recurrent_decoder_loop_starts_at_one(tmp_path):
    # A GRU decoder's state must see each token once: its prefill writes only the source's
    # cross-attention keys and values, and the loop feeds the prompts from index 1.
    from keras_xf.layers import FeedForward
    from keras_xf.layers import MultiHeadAttention
    from keras_xf.layers import RecurrentMixer
    from keras_xf.layers import TransformerBlock
    from keras_xf.models import Seq2SeqLM

    block = TransformerBlock(RecurrentMixer("gru"), FeedForward(16),
                             cross_attention=MultiHeadAttention(2))
    model = randomize_embeddings(Seq2SeqLM(**{**SIZES, "num_layers": 1}, decoder_block=block))
    targets = np.array([[1, 5, 6, 0, 0, 0], [1, 7, 0, 0, 0, 0]], "int32")
    sources = {"encoder_token_ids": SOURCES, "encoder_padding_mask": (SOURCES != 0).astype("int32")}
    expected = model.generate({**sources, "decoder_token_ids": targets,
                               "decoder_padding_mask": targets != 0})["decoder_token_ids"]
    _, prefill = runner(export.export_prefill(model, str(tmp_path / "prefill.pt2"),
                                              format="torch"), "torch")
    _, run_step = runner(export.export_decode_step(model, str(tmp_path / "step.pt2"),
                                                   format="torch"), "torch")

    def step(token_ids, cache_index, caches):
        return run_step(token_ids, cache_index, *caches)

    caches = prefill(targets, *sources.values())
    np.testing.assert_array_equal(greedy_loop(step, targets, targets != 0, caches, start=1),
                                  np.asarray(expected))
