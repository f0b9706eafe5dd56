"""Text in, ids out and back: tokenizers (a folder's `tokenizer.json` through `tokenizers`,
keras-hub's), packing, task preprocessors (strings in; ids, masks, labels and weights out)
and chat templates. Host-side NumPy: the arrays reach every backend alike."""

from keras_xf.preprocessing.causal_lm_preprocessor import CausalLMPreprocessor
from keras_xf.preprocessing.chat_template import render_chat_template
from keras_xf.preprocessing.hugging_face_tokenizer import HuggingFaceTokenizer
from keras_xf.preprocessing.keras_hub_tokenizer import KerasHubTokenizer
from keras_xf.preprocessing.preprocessor import Preprocessor
from keras_xf.preprocessing.preprocessor import text_tokenizer
from keras_xf.preprocessing.seq2seq_lm_preprocessor import Seq2SeqLMPreprocessor
from keras_xf.preprocessing.text_classifier_preprocessor import TextClassifierPreprocessor
from keras_xf.preprocessing.text_inputs import is_text
from keras_xf.preprocessing.text_inputs import text_list
