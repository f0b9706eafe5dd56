"""keras_xf models: functional backbones and tasks built from block templates."""

from keras_xf.models.causal_lm import CausalLM
from keras_xf.models.early_exit_classifier import EarlyExitClassifier
from keras_xf.models.early_exit_predictor import EarlyExitPredictor
from keras_xf.models.generative_task import GenerativeTask
from keras_xf.models.importance import importance_scores
from keras_xf.models.importance import layer_importance
from keras_xf.models.importance import top_indices
from keras_xf.models.layer_pruning import prune_layers
from keras_xf.models.presets import PRESETS
from keras_xf.models.presets import preset_names
from keras_xf.models.structured_pruning import prune_structure
from keras_xf.models.stop_classifier_trainer import StopClassifierTrainer
from keras_xf.models.seq2seq_backbone import Seq2SeqBackbone
from keras_xf.models.seq2seq_lm import Seq2SeqLM
from keras_xf.models.text_classifier import TextClassifier
from keras_xf.models.text_encoder import TextEncoder
from keras_xf.models.transformer_backbone import TransformerBackbone
from keras_xf.models.vision_backbone import VisionBackbone
from keras_xf.models.vision_classifier import VisionClassifier
from keras_xf.models.vision_language_encoder import VisionLanguageEncoder
from keras_xf.models.vision_language_lm import VisionLanguageLM
from keras_xf.models.huggingface import from_huggingface
from keras_xf.models.huggingface import to_huggingface
from keras_xf.models.huggingface import from_keras_hub
from keras_xf.models.huggingface import HuggingFaceTokenizer
