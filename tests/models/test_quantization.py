"""Low precision (survey §5.9): every keras_xf model under `model.quantize(mode)` and in half
precision.

- `int8`, `float8` and `int4` (Keras' post-training modes): every `Dense` / `EinsumDense` of the
  model (attention and head projections, feedforward, pooler and classifier heads, the patch
  projection, the mixture-of-experts router gate) takes the mode, and for `int8` and `int4`
  keras_xf's `TokenEmbedding` (its table, which is also the tied output projection) and the
  mixture-of-experts `ExpertWeights` too; the outputs stay close to the float32 model's, the
  generating tasks' cached `generate` gives the tokens of their own full pass
  (`use_cache=False`), and a `.keras` round trip gives identical outputs.
- Quantisation-aware fine-tuning: Keras' `float8` mode keeps a float32 kernel that `fit` trains
  through quantise-dequantise (float8 e4m3 forward, e5m2 gradients) with delayed scaling (amax
  histories the optimizer overwrites with their new values).
- `float16` and `bfloat16` (all computation and weights half precision): finite outputs close
  to the float32 model's with the same weights.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_xf.layers import ExpertWeights
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TokenEmbedding
from keras_xf.layers import TransformerBlock
from keras_xf.models import Seq2SeqLM
from keras_xf.models import VisionClassifier
from keras_xf.models import VisionLanguageEncoder
from keras_xf.models import VisionLanguageLM
from tests.layer_checks import to_numpy
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import batch_for
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_batch
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import text_encoder
from tests.models.tiny import token_batch

IMAGE, PATCH = (8, 8, 1), 4
VISION = dict(image_shape=IMAGE, patch_size=PATCH, hidden_dim=WIDTH, num_heads=HEADS,
              intermediate_dim=FFN, num_layers=1)
TEXT = dict(vocabulary_size=VOCAB, max_sequence_length=LENGTH)
# Largest |quantised - float32| output over the largest |float32| output, for random weights
# (float8 e4m3 keeps 3 mantissa bits of inputs and kernels, int4 16 levels per kernel column;
# a 3-class classifier's few logits make the ratio the noisiest).
QUANTIZED_TOLERANCE = {"int8": 0.05, "float8": 0.3, "int4": 0.4}
# A mixture of experts: a token whose top-2 experts change (near-tied router logits, moved by
# the rounding of the layers before the router) changes its whole output.
MOE_TOLERANCE = {"int8": 0.2, "int4": 0.4}
# The same for whole-model half precision: float16 keeps 10 mantissa bits, bfloat16 7.
HALF_TOLERANCE = {"float16": 0.01, "bfloat16": 0.06}


def images(rng, batch=2):
    return rng.uniform(size=(batch,) + IMAGE).astype("float32")


def with_images(rng):
    return {**token_batch(rng), "images": images(rng)}


def vision_language_lm(**kwargs):
    return VisionLanguageLM(**TEXT, **VISION, vision_layers=1, **kwargs)


def moe_causal_lm(**kwargs):
    # Dropless: every token reaches its experts, so a cached step equals the full pass.
    block = TransformerBlock(
        MultiHeadAttention(HEADS),
        MixtureOfExperts(4, FFN, top_k=2, activation="swiglu", capacity_factor=None),
        norm_placement="pre")
    return causal_lm(num_layers=1, block=block, **kwargs)


# name: (factory, inputs, generate inputs or None)
MODELS = {
    "causal_lm": (lambda **kw: causal_lm(num_layers=1, **kw), token_batch,
                  lambda rng: {"token_ids": np.array([[5, 6, 7, 0, 0, 0], [8, 9, 0, 0, 0, 0]],
                                                     "int32")}),
    "seq2seq_lm": (lambda **kw: seq2seq_lm(start_token_id=1, **kw), seq2seq_batch,
                   lambda rng: {"encoder_token_ids": np.array([[5, 6, 7, 8], [9, 10, 0, 0]],
                                                              "int32"),
                                "decoder_token_ids": np.array([[1, 4, 0, 0, 0, 0],
                                                               [1, 0, 0, 0, 0, 0]], "int32")}),
    "text_classifier": (lambda **kw: text_classifier(num_classes=3, **kw), token_batch, None),
    "text_encoder": (lambda **kw: text_encoder(projection_dim=8, **kw), token_batch, None),
    "vision_classifier": (lambda **kw: VisionClassifier(num_classes=3, **VISION, **kw),
                          lambda rng: {"images": images(rng)}, None),
    "vision_language_encoder": (lambda **kw: VisionLanguageEncoder(**TEXT, **VISION, **kw),
                                with_images, None),
    "vision_language_lm_prefix": (lambda **kw: vision_language_lm(fusion="prefix", **kw),
                                  with_images,
                                  lambda rng: {"images": images(rng),
                                               "token_ids": [[1, 4], [1]]}),
    "moe_causal_lm": (moe_causal_lm, token_batch,
                      lambda rng: {"token_ids": np.array([[5, 6, 7, 0, 0, 0],
                                                         [8, 9, 0, 0, 0, 0]], "int32")}),
}
# A mixture of experts keeps its router and statistics in float32 under any policy (tested in
# tests/layers/feedforward/test_mixture_of_experts.py).
HALF_PRECISION_MODELS = [name for name in MODELS if name != "moe_causal_lm"]


def build(name, **kwargs):
    return randomize_embeddings(MODELS[name][0](**kwargs))


def flat(outputs):
    """The model's outputs (a tensor or a dict of them) as one float64 vector."""
    if isinstance(outputs, dict):
        return np.concatenate([flat(outputs[key]) for key in sorted(outputs)])
    return to_numpy(keras.ops.cast(outputs, "float32")).astype("float64").ravel()


def outputs_of(model, x):
    # An eager call, not `predict`: on JAX every model's `predict` compiles its own function,
    # while eager ops of one shape and dtype compile once for the whole file.
    return flat(model(x, training=False))


def relative_difference(actual, expected):
    return np.abs(actual - expected).max() / np.abs(expected).max()


def quantize(model, mode):
    # Keras warns once per layer type it cannot quantise (norms, dropout, positions, ...).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize(mode)


def generate_tokens(model, inputs, use_cache):
    outputs = model.generate(inputs, max_length=6, use_cache=use_cache)
    if isinstance(outputs, dict):
        key = "decoder_token_ids" if isinstance(model, Seq2SeqLM) else "token_ids"
        return np.asarray(outputs[key])
    return outputs


# Every model family in int8; the other modes on the CausalLM. The text encoder and the
# vision-language encoder quantise the same layers as the classifier and the VisionLanguageLM.
QUANTIZED_CASES = [(name, "int8") for name in ("causal_lm", "seq2seq_lm", "text_classifier",
                                               "vision_classifier", "vision_language_lm_prefix")]
QUANTIZED_CASES += [("causal_lm", "float8"), ("causal_lm", "int4"), ("moe_causal_lm", "int8"),
                    ("moe_causal_lm", "int4")]
# Generation compiles a loop and a `.keras` load rebuilds the model: both for these only;
# the uncached loop, the reference of the cached one, for the first two.
GENERATES = {("causal_lm", "int8"), ("seq2seq_lm", "int8"), ("causal_lm", "int4"),
             ("moe_causal_lm", "int8")}
UNCACHED_REFERENCE = {("causal_lm", "int8"), ("seq2seq_lm", "int8")}
SAVES = {("causal_lm", "int8"), ("vision_language_lm_prefix", "int8"), ("causal_lm", "int4"),
         ("moe_causal_lm", "int4")}
# Layers of keras_xf's own with Keras' quantisation hooks, and the modes they take.
INTEGER_ONLY = (TokenEmbedding, ExpertWeights)


@pytest.mark.parametrize("name, mode", QUANTIZED_CASES)
def test_quantised_model_predicts_generates_and_saves(name, mode, rng, tmp_path):
    model = build(name)
    x = MODELS[name][1](rng)
    expected = outputs_of(model, x)
    quantize(model, mode)

    denses = [layer for layer in model._flatten_layers()
              if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))]
    assert denses and {layer.quantization_mode for layer in denses} == {mode}
    integer = mode in ("int8", "int4")
    for layer in model._flatten_layers():
        if isinstance(layer, INTEGER_ONLY):
            assert layer.quantization_mode == (mode if integer else None), layer.path
    if name == "moe_causal_lm":
        assert any(isinstance(layer, ExpertWeights) for layer in model._flatten_layers())
    if integer:  # every matrix is stored in int8 (int4: two values per byte)
        kernels = [w for w in model.weights
                   if w.name in ("kernel", "expert_kernel")]
        assert kernels and all(keras.backend.standardize_dtype(w.dtype) == "int8"
                               for w in kernels), [w.path for w in kernels]

    actual = outputs_of(model, x)
    assert np.all(np.isfinite(actual))
    tolerance = (MOE_TOLERANCE if name == "moe_causal_lm" else QUANTIZED_TOLERANCE)[mode]
    assert 0 < relative_difference(actual, expected) < tolerance

    if (name, mode) in GENERATES:
        prompts = MODELS[name][2](rng)
        cached = generate_tokens(model, prompts, use_cache=True)
        assert cached.shape[-1] == 6
        if (name, mode) in UNCACHED_REFERENCE:
            np.testing.assert_array_equal(cached, generate_tokens(model, prompts,
                                                                  use_cache=False))

    if (name, mode) not in SAVES:
        return
    path = str(tmp_path / "quantized.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert ({layer.path: layer.quantization_mode for layer in loaded._flatten_layers()}
            == {layer.path: layer.quantization_mode for layer in model._flatten_layers()})
    np.testing.assert_array_equal(outputs_of(loaded, x), actual)


def test_float8_quantisation_aware_fine_tuning(rng):
    """`quantize("float8")` then `fit`: the loss falls, the layers stay float8 (float32
    kernels trained through float8 quantise-dequantise) and the delayed scaling statistics
    fill."""
    model = build("causal_lm")
    quantize(model, "float8")
    x, y = batch_for(model, rng)
    kernels = {w.path: to_numpy(w).copy() for w in model.weights if w.path.endswith("/kernel")}
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, epochs=8, batch_size=2, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.9 * losses[0], losses

    denses = [layer for layer in model._flatten_layers()
              if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))]
    assert {layer.quantization_mode for layer in denses} == {"float8"}
    for layer in denses:
        assert keras.backend.standardize_dtype(layer.kernel.dtype) == "float32"
        assert not np.allclose(to_numpy(layer.kernel), kernels[layer.kernel.path])
        assert np.any(to_numpy(layer.inputs_amax_history) > 0)
        assert np.any(to_numpy(layer.outputs_grad_amax_history) > 0)
        assert to_numpy(layer.kernel_scale) != 1.0  # the delayed scale was updated
    assert np.all(np.isfinite(outputs_of(model, x)))


@pytest.mark.parametrize("name", HALF_PRECISION_MODELS)
def test_half_precision_inference(name, rng):
    reference = build(name)
    x = MODELS[name][1](rng)
    expected = outputs_of(reference, x)
    for dtype, tolerance in HALF_TOLERANCE.items():
        model = MODELS[name][0](dtype=dtype)
        assert model.compute_dtype == dtype
        model.set_weights(reference.get_weights())
        assert all(keras.backend.standardize_dtype(w.dtype) == dtype for w in model.weights
                   if keras.backend.is_float_dtype(w.dtype))
        actual = outputs_of(model, x)
        assert np.all(np.isfinite(actual)), dtype
        assert relative_difference(actual, expected) < tolerance, dtype
