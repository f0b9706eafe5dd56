"""Generative tasks: the one generation base class and the language models built on it."""

from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.models.generative.generative_task import GenerativeTask
from keras_xf.models.generative.seq2seq_lm import Seq2SeqLM
from keras_xf.models.generative.vision_language_lm import VisionLanguageLM
