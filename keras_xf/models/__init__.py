"""keras_xf models: functional backbones and the tasks built on them.

- `backbones/`: the functional base class and the backbones built from block templates;
- `encoders/`: encoder-only tasks (classification, sentence embeddings, vision);
- `generative/`: the generation base class and the language models that generate;
- `adaptive/`: adaptive-depth models (early exit, layer skipping, stop classifiers).

Checkpoint conversion lives in `keras_xf.checkpoints` and model surgery (importance scores,
pruning, growth) in `keras_xf.surgery`; both sit above this package.
"""

from keras_xf.models.adaptive import EarlyExitCausalLM
from keras_xf.models.adaptive import EarlyExitClassifier
from keras_xf.models.adaptive import EarlyExitPredictor
from keras_xf.models.adaptive import LayerSkippingClassifier
from keras_xf.models.adaptive import LayerSkippingPredictor
from keras_xf.models.adaptive import StopClassifierTrainer
from keras_xf.models.backbones import FunctionalModel
from keras_xf.models.backbones import PRESETS
from keras_xf.models.backbones import Seq2SeqBackbone
from keras_xf.models.backbones import TransformerBackbone
from keras_xf.models.backbones import VisionBackbone
from keras_xf.models.backbones import preset_names
from keras_xf.models.encoders import TextClassifier
from keras_xf.models.encoders import TextEncoder
from keras_xf.models.encoders import VisionClassifier
from keras_xf.models.encoders import VisionLanguageEncoder
from keras_xf.models.generative import CausalLM
from keras_xf.models.generative import GenerativeTask
from keras_xf.models.generative import Seq2SeqLM
from keras_xf.models.generative import VisionLanguageLM
