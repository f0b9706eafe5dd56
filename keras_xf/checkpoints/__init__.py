"""Hugging Face checkpoint folders ↔ keras_xf task models; llama.cpp GGUF files → keras_xf
`CausalLM`s."""

from keras_xf.checkpoints.convert import from_huggingface
from keras_xf.checkpoints.convert import to_huggingface
from keras_xf.checkpoints.keras_hub_backbones import from_keras_hub
from keras_xf.checkpoints.peft import from_peft
from keras_xf.checkpoints.peft import to_peft
from keras_xf.checkpoints.sentence_transformers import sentence_transformers_settings
from keras_xf.preprocessing import HuggingFaceTokenizer
from keras_xf.checkpoints.gguf_loading import from_gguf
