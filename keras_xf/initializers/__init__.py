"""keras_xf initializers: depth-aware Xavier initialisation (survey §4.2.2)."""

from keras_xf.initializers.model_depth_xavier import ModelDepthXavier
from keras_xf.initializers.sub_layer_depth_xavier import SubLayerDepthXavier
from keras_xf.initializers.xavier import Xavier
