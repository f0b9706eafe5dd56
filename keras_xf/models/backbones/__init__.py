"""Backbones: the functional base class and the stacks of blocks the tasks build on."""

from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.presets import PRESETS
from keras_xf.models.backbones.presets import preset_names
from keras_xf.models.backbones.seq2seq_backbone import Seq2SeqBackbone
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.models.backbones.vision_backbone import VisionBackbone
