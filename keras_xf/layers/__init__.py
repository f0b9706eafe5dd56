"""keras_xf layers: one public class per file, grouped by concern."""

from keras_xf.layers.attention.attention_pattern import AttentionPattern
from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.embeddings.learned_position_embedding import LearnedPositionEmbedding
from keras_xf.layers.embeddings.rotary_embedding import RotaryEmbedding
from keras_xf.layers.embeddings.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.layers.embeddings.token_embedding import TokenEmbedding
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.heads.classification_head import ClassificationHead
from keras_xf.layers.heads.pooling import Pooling
from keras_xf.layers.mixers.linear_attention import LinearAttention
from keras_xf.layers.mixers.state_space_mixer import StateSpaceMixer
from keras_xf.layers.residual.residual import Residual
