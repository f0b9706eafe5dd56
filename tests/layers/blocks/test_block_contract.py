"""The block contract: mixers return `outputs` or `(outputs, cache)`, anything more comes back
in one dict; `Residual`, `TransformerBlock` and `TransformerStack` pass mixer arguments through."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.layers import FeedForward
from keras_xf.layers import GatedCrossAttentionBlock
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Residual
from keras_xf.layers import SequenceMixer
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests import layer_checks as checks

B, T, D, H, S = 2, 5, 8, 2, 4


@keras.saving.register_keras_serializable(package="keras_xf_tests")
class GainMixer(SequenceMixer):
    """`y = gain · (x W)`: a mixer with a call argument (`gain`, `[B, 1, 1]`) that no generic
    layer knows; its cache counts the calls."""

    def build(self, inputs_shape):
        self.kernel = self.add_weight(name="kernel", shape=(inputs_shape[-1], inputs_shape[-1]))

    def init_cache(self, batch_size, max_length, dtype=None):
        return ops.zeros((batch_size, 1), dtype or "float32")

    def call(self, inputs, padding_mask=None, use_causal_mask=None, cache=None,
             cache_index=None, gain=None, training=None):
        outputs = ops.matmul(inputs, self.kernel)
        if gain is not None:
            outputs = outputs * ops.cast(gain, outputs.dtype)
        return outputs if cache is None else (outputs, cache + 1)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape)


def _inputs(rng, length=T):
    return rng.normal(size=(B, length, D)).astype("float32")


def _block(mixer=None, cross=False):
    return TransformerBlock(
        MultiHeadAttention(H) if mixer is None else mixer,
        FeedForward(16),
        cross_attention=MultiHeadAttention(H) if cross else None,
        norm_placement="pre",
    )


def _check_scores_dict(results, cache, key_length=T):
    outputs, scores, *rest = checks.split_scores(results, cache=cache)
    assert tuple(outputs.shape) == (B, T, D)
    assert tuple(scores.shape) == (B, H, T, key_length)
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"
    return outputs, scores, rest


@pytest.mark.parametrize("make", [lambda: MultiHeadAttention(H), _block,
                                  lambda: Residual(MultiHeadAttention(H))])
def test_scores_come_back_in_one_dict_with_and_without_cache(rng, make):
    layer = make()
    x = _inputs(rng)
    plain = layer(x, use_causal_mask=True)
    assert not isinstance(plain, (dict, tuple, list))
    outputs, scores, _ = _check_scores_dict(
        layer(x, use_causal_mask=True, return_attention_scores=True), cache=False)
    np.testing.assert_allclose(checks.to_numpy(outputs), checks.to_numpy(plain), atol=1e-5)
    np.testing.assert_allclose(checks.to_numpy(scores).sum(-1), 1.0, atol=1e-5)
    mixer = getattr(layer, "mixer", getattr(layer, "layer", layer))
    cache = mixer.init_cache(B, T + 1)
    plain_out, plain_cache = layer(x, use_causal_mask=True, cache=cache, cache_index=0)
    outputs, scores, (new_cache,) = _check_scores_dict(
        layer(x, use_causal_mask=True, cache=cache, cache_index=0, return_attention_scores=True),
        cache=True, key_length=T + 1)
    assert [tuple(p.shape) for p in new_cache] == [tuple(p.shape) for p in cache]
    np.testing.assert_allclose(checks.to_numpy(new_cache), checks.to_numpy(plain_cache), atol=1e-6)
    np.testing.assert_allclose(checks.to_numpy(outputs), checks.to_numpy(plain_out), atol=1e-5)


def test_symbolic_calls_give_the_same_structure(rng):
    """`compute_output_spec` matches `call`: a functional model returns the dict too."""
    for layer in (MultiHeadAttention(H), _block(), TransformerStack(_block(), 2)):
        inputs = keras.Input((T, D))
        symbolic = layer(inputs, return_attention_scores=True)
        assert isinstance(symbolic, dict) and {"outputs", "attention_scores"} <= set(symbolic)
        model = keras.Model(inputs, symbolic)
        eager = model(_inputs(rng))
        assert set(eager) == set(symbolic)


def test_tensor_and_python_mixer_arguments_together_in_a_saved_functional_model(rng, tmp_path):
    """Keras refuses a `**kwargs` that mixes tensors with Python values; the generic layers
    carry the Python values apart (`mixer_options`), also through a `.keras` round trip."""
    x = _inputs(rng)
    bias = np.zeros((B, T, T), "float32")
    bias[:, :, 0] = -1e9
    inputs, bias_input = keras.Input((T, D)), keras.Input((T, T), name="bias")
    stack = TransformerStack(_block(), 2)
    symbolic = stack(inputs, attention_bias=bias_input, return_attention_scores=True,
                     use_causal_mask=False)
    model = keras.Model([inputs, bias_input], symbolic)
    results = model([x, bias])
    assert all(np.allclose(checks.to_numpy(s)[..., 0], 0.0, atol=1e-6)
               for s in results["attention_scores"])
    eager = stack(x, attention_bias=bias, return_attention_scores=True)
    np.testing.assert_allclose(checks.to_numpy(results["outputs"]),
                               checks.to_numpy(eager["outputs"]), atol=1e-5)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)(  # JSON turns tuples into lists
        [x, bias])
    for key in ("outputs", "attention_scores"):
        for want, got in zip(keras.tree.flatten(results[key]), keras.tree.flatten(loaded[key])):
            np.testing.assert_allclose(checks.to_numpy(got), checks.to_numpy(want), atol=1e-5)


def test_block_with_cross_attention_returns_its_cache_pair_in_the_dict(rng):
    block = _block(cross=True)
    x, memory = _inputs(rng), rng.normal(size=(B, S, D)).astype("float32")
    block(x, encoder_outputs=memory)
    cache = block.init_cache(B, T, encoder_length=S)
    outputs, scores, (new_cache,) = _check_scores_dict(
        block(x, encoder_outputs=memory, cache=cache, cache_index=0, use_causal_mask=True,
              return_attention_scores=True),
        cache=True)
    assert isinstance(new_cache, tuple) and len(new_cache) == 2
    assert [tuple(p.shape) for p in new_cache[1]] == [tuple(p.shape) for p in cache[1]]


def test_stack_returns_scores_per_layer_and_keeps_its_cache_tuple(rng):
    stack = TransformerStack(_block(), 3, share_attention_maps=2)
    x = _inputs(rng)
    plain = stack(x, use_causal_mask=True)
    assert not isinstance(plain, (dict, tuple, list))  # the sharing layers' dicts stay inside
    results = stack(x, use_causal_mask=True, return_attention_scores=True)
    assert set(results) == {"outputs", "attention_scores"}
    assert len(results["attention_scores"]) == 3
    assert all(tuple(s.shape) == (B, H, T, T) for s in results["attention_scores"])
    np.testing.assert_allclose(checks.to_numpy(results["outputs"]), checks.to_numpy(plain),
                               atol=1e-5)
    # Layer 1 reuses layer 0's weights (attention-map sharing).
    np.testing.assert_allclose(checks.to_numpy(results["attention_scores"][1]),
                               checks.to_numpy(results["attention_scores"][0]), atol=1e-6)
    cache = stack.init_cache(B, T)
    outputs, caches = stack(x, use_causal_mask=True, cache=cache, cache_index=0)
    assert len(caches) == 3
    results = stack(x, use_causal_mask=True, cache=cache, cache_index=0,
                    return_attention_scores=True)
    assert set(results) == {"outputs", "attention_scores", "cache"} and len(results["cache"]) == 3


def test_a_new_mixer_argument_passes_through_the_generic_layers(rng):
    """`gain` is named by no generic layer: it reaches the mixer eagerly, with a cache, and
    as a symbolic input of a functional model."""
    x = _inputs(rng)
    gain = np.full((B, 1, 1), 3.0, "float32")
    for layer in (Residual(GainMixer()), _block(GainMixer()), TransformerStack(_block(GainMixer()), 2)):
        base = checks.to_numpy(layer(x))
        gained = checks.to_numpy(layer(x, gain=gain))
        assert not np.allclose(base, gained, atol=1e-4)
        inputs, gain_input = keras.Input((T, D)), keras.Input((1, 1), name="gain")
        model = keras.Model([inputs, gain_input], layer(inputs, gain=gain_input))
        np.testing.assert_allclose(checks.to_numpy(model([x, gain])), gained, atol=1e-5)
    block = _block(GainMixer())
    outputs, cache = block(x, gain=gain, cache=block.mixer.init_cache(B, T), cache_index=0)
    np.testing.assert_allclose(checks.to_numpy(cache), 1.0)
    np.testing.assert_allclose(checks.to_numpy(outputs), checks.to_numpy(block(x, gain=gain)),
                               atol=1e-5)


def test_gated_cross_attention_block_passes_mixer_arguments_through(rng):
    gated = GatedCrossAttentionBlock(_block(), MultiHeadAttention(H), FeedForward(16))
    x, memory = _inputs(rng), rng.normal(size=(B, S, D)).astype("float32")
    bias = np.zeros((B, T, T), "float32")
    bias[:, :, 0] = -1e9
    results = gated(x, encoder_outputs=memory, attention_bias=bias, return_attention_scores=True)
    _, scores, _ = _check_scores_dict(results, cache=False)
    np.testing.assert_allclose(checks.to_numpy(scores)[..., 0], 0.0, atol=1e-6)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Residual("ffn"), "layer must be a Keras layer or a serialised layer config"),
        (lambda: TransformerBlock(MultiHeadAttention(H), "ffn"), "feedforward must be a Keras"),
        (lambda: TransformerBlock(FeedForward(8), FeedForward(8)),
         "mixer must be an instance of SequenceMixer"),
        (lambda: TransformerBlock(MultiHeadAttention(H), MultiHeadAttention(H)),
         "feedforward must be an instance of FeedForwardLayer"),
        (lambda: TransformerBlock(None, FeedForward(8)), "mixer must be a Keras layer"),
        (lambda: TransformerStack(FeedForward(8), 1),
         "block must be an instance of TransformerBlock or GatedCrossAttentionBlock"),
        (lambda: TransformerStack([_block(), "block"], 2), r"block\[1\] must be a Keras layer"),
        (lambda: GatedCrossAttentionBlock(_block(), FeedForward(8)),
         "cross_attention must be an instance of SequenceMixer"),
        (lambda: GatedCrossAttentionBlock("block", MultiHeadAttention(H)), "block must be a Keras"),
    ],
)
def test_a_sub_layer_of_the_wrong_kind_raises_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_sub_layers_given_as_configs_still_work(rng):
    mixer = keras.saving.serialize_keras_object(MultiHeadAttention(H))
    block = TransformerBlock(mixer, keras.saving.serialize_keras_object(FeedForward(16)))
    assert isinstance(block.mixer, MultiHeadAttention)
    stack = TransformerStack(keras.saving.serialize_keras_object(block), 2)
    assert tuple(stack(_inputs(rng)).shape) == (B, T, D)
