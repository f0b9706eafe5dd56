"""Encoder-only tasks: classification, sentence embeddings, image and image-text encoders."""

from keras_xf.models.encoders.text_classifier import TextClassifier
from keras_xf.models.encoders.text_encoder import TextEncoder
from keras_xf.models.encoders.vision_classifier import VisionClassifier
from keras_xf.models.encoders.vision_language_encoder import VisionLanguageEncoder
