"""Hugging Face checkpoint folders ↔ keras_xf task models."""

from keras_xf.models.huggingface.convert import from_huggingface
from keras_xf.models.huggingface.convert import to_huggingface
from keras_xf.models.huggingface.keras_hub_backbones import from_keras_hub
from keras_xf.models.huggingface.tokenizer import HuggingFaceTokenizer
