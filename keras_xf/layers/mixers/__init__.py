"""Sequence mixers that replace attention (linear attention, SSMs, convolutions, recurrent)."""

from keras_xf.layers.mixers.average_attention import AverageAttention
from keras_xf.layers.mixers.conformer_convolution import ConformerConvolution
from keras_xf.layers.mixers.depthwise_convolution import DepthwiseConvolution
from keras_xf.layers.mixers.dynamic_convolution import DynamicConvolution
from keras_xf.layers.mixers.lightweight_convolution import LightweightConvolution
from keras_xf.layers.mixers.linear_attention import LinearAttention
from keras_xf.layers.mixers.mamba_mixer import MambaMixer
from keras_xf.layers.mixers.recurrent_mixer import RecurrentMixer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.layers.mixers.state_space_mixer import StateSpaceMixer
