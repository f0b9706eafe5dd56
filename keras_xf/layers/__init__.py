"""keras_xf layers: one public class per file, grouped by concern."""

from keras_xf.layers.attention.alibi_bias import AlibiBias
from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.attention.compressed_attention import CompressedAttention
from keras_xf.layers.attention.locality_prior import LocalityPrior
from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.attention.patterns.clustering_pattern import ClusteringPattern
from keras_xf.layers.attention.patterns.dilated_pattern import DilatedPattern
from keras_xf.layers.attention.patterns.global_pattern import GlobalPattern
from keras_xf.layers.attention.patterns.hashing_pattern import HashingPattern
from keras_xf.layers.attention.patterns.hybrid_pattern import HybridPattern
from keras_xf.layers.attention.patterns.per_head_pattern import PerHeadPattern
from keras_xf.layers.attention.patterns.random_pattern import RandomPattern
from keras_xf.layers.attention.relative_position_bias import RelativePositionBias
from keras_xf.layers.attention.relative_position_embedding import RelativePositionEmbedding
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.rotary_embedding import RotaryEmbedding
from keras_xf.layers.embeddings.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.feedforward.product_key_memory import ProductKeyMemory
from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.layers.residual.residual import Residual
