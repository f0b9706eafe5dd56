"""Model surgery: importance scores, pruning of heads, units and layers, width and depth growth."""

from keras_xf.surgery.grow_depth import grow_depth
from keras_xf.surgery.grow_width import grow_width
from keras_xf.surgery.importance import importance_scores
from keras_xf.surgery.importance import layer_importance
from keras_xf.surgery.importance import top_indices
from keras_xf.surgery.layer_pruning import prune_layers
from keras_xf.surgery.structured_pruning import prune_heads
from keras_xf.surgery.structured_pruning import prune_structure
