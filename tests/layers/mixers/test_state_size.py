"""The decoding state of the linear-time mixers has a size independent of the context length
(survey §5.5.2, §5.5.3): `init_cache(B, max_length)` gives the same shapes for every
`max_length`, a step keeps them, and a `CausalLM`'s whole cache does not grow either, while
the key-value cache of `MultiHeadAttention` grows linearly."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LinearAttention
from keras_xf.layers import MambaMixer
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import StateSpaceMixer
from keras_xf.layers import TransformerBlock
from tests.models.tiny import FFN
from tests.models.tiny import causal_lm

B, D, H = 2, 16, 2
MAX_LENGTHS = (1, 12, 4096)

MIXERS = {
    "linear_attention": lambda: LinearAttention(H, feature_map="elu", causal=True),
    "gated_linear_attention": lambda: LinearAttention(H, decay="gated", causal=True),
    "gated_linear_attention_key_convolution": lambda: LinearAttention(
        H, decay="gated", causal=True, key_convolution=4),
    "ssm_time_invariant": lambda: StateSpaceMixer(4),
    "ssm_selective": lambda: StateSpaceMixer(4, selective=True),
    "mamba": lambda: MambaMixer(4),
}


def _shapes(cache):
    return [tuple(keras.ops.shape(c)) for c in keras.tree.flatten(cache)]


def _bytes(cache):
    return sum(int(np.prod(s)) * 4 for s in _shapes(cache))


@pytest.mark.parametrize("name", ["gated_linear_attention",
                                  "gated_linear_attention_key_convolution", "ssm_time_invariant",
                                  "ssm_selective", "mamba"])
def test_state_size_is_independent_of_max_length(rng, name):
    layer = MIXERS[name]()
    layer.build((B, None, D))
    shapes = {n: _shapes(layer.init_cache(B, n)) for n in MAX_LENGTHS}
    assert len({tuple(s) for s in shapes.values()}) == 1, shapes
    # One decoding step returns a state of the same shapes and dtypes (float32).
    cache = layer.init_cache(B, MAX_LENGTHS[-1])
    x = rng.normal(size=(B, 1, D)).astype("float32")
    _, new_cache = layer(x, cache=cache, cache_index=5)
    assert _shapes(new_cache) == _shapes(cache)
    dtypes = {keras.backend.standardize_dtype(c.dtype) for c in keras.tree.flatten(new_cache)}
    assert dtypes == {"float32"}
    # The state is small: per sequence, far less than a key-value cache of 4096 positions.
    assert _bytes(cache) / B < 2 * 4096 * D * 4 / 32


def test_causal_lm_cache_does_not_grow_and_attention_cache_does():
    def lm_cache_bytes(mixer, max_length):
        block = TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")
        lm = causal_lm(num_layers=1, block=block)
        return _bytes(lm.init_cache(B, max_length))

    for make in (MIXERS["gated_linear_attention"], MIXERS["ssm_selective"]):
        assert lm_cache_bytes(make(), 16) == lm_cache_bytes(make(), 1024)
    attention = lambda: MultiHeadAttention(num_heads=H, causal=True)  # noqa: E731
    assert lm_cache_bytes(attention(), 1024) == 64 * lm_cache_bytes(attention(), 16)
