"""Sparse attention fields for `MultiHeadAttention(pattern=...)` (survey §5.1)."""

from keras_xf.layers.attention.patterns.chunked_pattern import ChunkedPattern
from keras_xf.layers.attention.patterns.local_pattern import LocalPattern
from keras_xf.layers.attention.patterns.strided_pattern import StridedPattern
from keras_xf.layers.attention.patterns.clustering_pattern import ClusteringPattern
from keras_xf.layers.attention.patterns.dilated_pattern import DilatedPattern
from keras_xf.layers.attention.patterns.global_pattern import GlobalPattern
from keras_xf.layers.attention.patterns.hashing_pattern import HashingPattern
from keras_xf.layers.attention.patterns.hybrid_pattern import HybridPattern
from keras_xf.layers.attention.patterns.per_head_pattern import PerHeadPattern
from keras_xf.layers.attention.patterns.random_pattern import RandomPattern
