"""Adaptive-depth models: early exit, layer skipping and stop classifiers."""

from keras_xf.models.adaptive.early_exit_causal_lm import EarlyExitCausalLM
from keras_xf.models.adaptive.early_exit_classifier import EarlyExitClassifier
from keras_xf.models.adaptive.early_exit_predictor import EarlyExitPredictor
from keras_xf.models.adaptive.layer_skipping_classifier import LayerSkippingClassifier
from keras_xf.models.adaptive.layer_skipping_predictor import LayerSkippingPredictor
from keras_xf.models.adaptive.stop_classifier_trainer import StopClassifierTrainer
