"""Masks and matrices given to the attention layers are checked against the inputs before they
are used: a wrong rank, length, batch or head count raises the same `ValueError` naming the
argument on every backend (before, TensorFlow raised `InvalidArgumentError`, PyTorch
`RuntimeError` and JAX a broadcasting error). Constructor arguments are checked alike."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import BranchMix
from keras_xf.layers import CompressedAttention
from keras_xf.layers import LocalityPrior
from keras_xf.layers import LocalPattern
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import PerceiverResampler
from keras_xf.layers import RelativePositionBias
from keras_xf.layers import RelativePositionEmbedding

B, T, S, D, H, CACHE = 2, 5, 6, 16, 4, 8
MATRICES = ("attention_bias", "attention_multiplier", "attention_weights")


def _x(length=T, batch=B):
    return np.random.default_rng(0).normal(size=(batch, length, D)).astype("float32")


# Each case: (layer factory, call(layer, **masks), key length the masks must match, arguments).
def _self(layer, **kwargs):
    return layer(_x(), **kwargs)


def _cross(layer, **kwargs):
    return layer(_x(), _x(S), **kwargs)


def _cached(layer, **kwargs):
    return layer(_x(1), cache=layer.init_cache(B, CACHE), cache_index=0, **kwargs)


def _cached_self(layer, **kwargs):
    """Queries `T` attending to a cache of `CACHE` positions."""
    return layer(_x(), cache=layer.init_cache(B, CACHE), cache_index=0, **kwargs)


ALL = ("padding_mask", "attention_mask") + MATRICES
CASES = {
    "dense": (lambda: MultiHeadAttention(H), _self, T, ALL),
    "block_sparse": (lambda: MultiHeadAttention(H, pattern=LocalPattern(2)), _self, T,
                     ("padding_mask",)),
    "relative_embedding": (
        lambda: MultiHeadAttention(H, biases=[RelativePositionEmbedding(2, use_values=True)]),
        _self, T, ALL),
    "alibi": (lambda: MultiHeadAttention(H, biases=[AlibiBias()]), _self, T, ALL),
    "cross": (lambda: MultiHeadAttention(H), _cross, S, ALL),
    "cached": (lambda: MultiHeadAttention(H, head_dim=4), _cached_self, CACHE, ALL),
    "compressed": (lambda: CompressedAttention(H, compressed_length=3, max_length=S), _self, T,
                   ("padding_mask",)),
    "compressed_convolution": (
        lambda: CompressedAttention(H, method="convolution", stride=2), _cross, S,
        ("padding_mask",)),
    "selection": (lambda: CompressedAttention(H, compressed_length=2, method="selection"),
                  _self, T, ("padding_mask", "attention_mask")),
    "branch_mix": (lambda: BranchMix(MultiHeadAttention(H)), _self, T,
                   ("padding_mask", "attention_mask", "attention_bias", "attention_multiplier")),
    "perceiver": (lambda: PerceiverResampler(3, H, 8), _self, T, ("padding_mask",)),
}


def _bad_values(argument, key_length, queries=T):
    """`{kind: value}`: shapes of the wrong rank, length, batch and number of heads."""
    if argument == "padding_mask":
        return {
            "rank": np.ones((B, key_length, 1), bool),
            "rank_1": np.ones((key_length,), bool),
            "length": np.ones((B, key_length + 1), bool),
            "batch": np.ones((B + 1, key_length), bool),
        }
    dtype = bool if argument == "attention_mask" else "float32"
    values = {
        "rank": np.ones((B, 1, 1, queries, key_length), dtype),
        "key_length": np.ones((B, queries, key_length + 1), dtype),
        "query_length": np.ones((B, queries + 1, key_length), dtype),
        "batch": np.ones((B + 1, queries, key_length), dtype),
        "heads": np.ones((B, H + 1, queries, key_length), dtype),
    }
    if argument != "attention_mask":  # a rank-2 attention_mask [T, S] is shared by the batch
        values["rank_2"] = np.ones((queries, key_length), dtype)
    return values


def _good_values(argument, key_length, queries=T):
    if argument == "padding_mask":
        return [np.ones((B, key_length), bool)]
    dtype = bool if argument == "attention_mask" else "float32"
    fill = 1.0 / key_length if argument == "attention_weights" else 1
    values = [np.full((B, queries, key_length), fill, dtype),
              np.full((B, H, queries, key_length), fill, dtype),
              np.full((B, 1, queries, key_length), fill, dtype)]
    if argument == "attention_mask":
        values.append(np.ones((queries, key_length), bool))
    return values


BAD = [
    (case, argument, kind)
    for case, (_, _, key_length, arguments) in CASES.items()
    for argument in arguments
    for kind in _bad_values(argument, key_length)
]


@pytest.mark.parametrize("case, argument, kind", BAD)
def test_a_wrong_shape_raises_a_value_error_naming_the_argument(case, argument, kind):
    make, call, key_length, _ = CASES[case]
    queries = 1 if call is _cached else T
    value = _bad_values(argument, key_length, queries)[kind]
    with pytest.raises(ValueError, match=f"{argument}.*Received: {argument}.shape="):
        call(make(), **{argument: value})


@pytest.mark.parametrize(
    "case, argument",
    [(case, argument) for case, (_, _, _, arguments) in CASES.items() for argument in arguments],
)
def test_the_documented_shapes_are_accepted(case, argument):
    make, call, key_length, _ = CASES[case]
    layer = make()
    for value in _good_values(argument, key_length):
        result = call(layer, **{argument: value})
        outputs = result[0] if isinstance(result, tuple) else result
        outputs = outputs["outputs"] if isinstance(outputs, dict) else outputs
        assert np.isfinite(keras.ops.convert_to_numpy(outputs)).all()


def test_a_single_query_against_a_cache_checks_the_cache_length():
    layer = MultiHeadAttention(H, head_dim=4)
    _cached(layer, padding_mask=np.ones((B, CACHE), bool))
    with pytest.raises(ValueError, match=r"padding_mask.*cache.*Received: padding_mask.shape="):
        _cached(layer, padding_mask=np.ones((B, 1), bool))


CONSTRUCTORS = [
    (lambda: MultiHeadAttention(0), "num_heads"),
    (lambda: MultiHeadAttention(2.0), "num_heads"),
    (lambda: MultiHeadAttention(H, head_dim=-1), "head_dim"),
    (lambda: MultiHeadAttention(H, num_key_value_heads=0), "num_key_value_heads"),
    (lambda: MultiHeadAttention(H, num_key_value_heads=3), "num_key_value_heads"),
    (lambda: MultiHeadAttention(H, output_dim=0), "output_dim"),
    (lambda: MultiHeadAttention(H, dropout=1.0), "dropout"),
    (lambda: MultiHeadAttention(H, dropout="x"), "dropout"),
    (lambda: MultiHeadAttention(H, scale=-1.0), "scale"),
    (lambda: MultiHeadAttention(H, scale="x"), "scale"),
    (lambda: MultiHeadAttention(H, causal="yes"), "causal"),
    (lambda: MultiHeadAttention(H, kernel_initializer="nope"), "kernel_initializer"),
    (lambda: MultiHeadAttention(H, bias_initializer=3), "bias_initializer"),
    (lambda: CompressedAttention(H, compressed_length=0, max_length=S), "compressed_length"),
    (lambda: CompressedAttention(H, compressed_length=2, max_length=S,
                                 compression_initializer="nope"), "compression_initializer"),
    (lambda: PerceiverResampler(0, H, 8), "num_latents"),
    (lambda: PerceiverResampler(3, H, 8, epsilon=-1), "epsilon"),
    (lambda: PerceiverResampler(3, H, 8, dropout=2), "dropout"),
    (lambda: PerceiverResampler(3, H, 8, latent_initializer="nope"), "latent_initializer"),
    (lambda: RelativePositionBias(embeddings_initializer="nope"), "embeddings_initializer"),
    (lambda: RelativePositionEmbedding(2, embeddings_initializer="nope"),
     "embeddings_initializer"),
    (lambda: RelativePositionEmbedding(2, scale=0), "scale"),
    (lambda: LocalityPrior(kernel_initializer="nope"), "kernel_initializer"),
    (lambda: AlibiBias(max_bias=-1), "max_bias"),
    (lambda: BranchMix(MultiHeadAttention(H), alpha=2), "alpha"),
]


@pytest.mark.parametrize("make, argument", CONSTRUCTORS,
                         ids=[f"{i}-{arg}" for i, (_, arg) in enumerate(CONSTRUCTORS)])
def test_constructor_arguments_are_checked(make, argument):
    with pytest.raises(ValueError, match=f"{argument}.*Received"):
        make()
