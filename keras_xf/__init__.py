"""keras_xf: Transformer building blocks for Keras 3 on TensorFlow, JAX and PyTorch."""

from keras_xf import checkpoints
from keras_xf import datasets
from keras_xf import distribution
from keras_xf import generation
from keras_xf import initializers
from keras_xf import layers
from keras_xf import models
from keras_xf import ops
from keras_xf import surgery
from keras_xf import training

__version__ = "0.1.0"
