"""Sparse attention fields for `MultiHeadAttention(pattern=...)` (survey §5.1)."""

from keras_xf.layers.attention.patterns.chunked_pattern import ChunkedPattern
from keras_xf.layers.attention.patterns.local_pattern import LocalPattern
from keras_xf.layers.attention.patterns.strided_pattern import StridedPattern
