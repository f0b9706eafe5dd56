"""Pure functions over `keras.ops`: attention, masks, positions and linear recurrences."""

from keras_xf.ops.attention import attend
from keras_xf.ops.attention import attention_scores
from keras_xf.ops.attention import lowest_value
from keras_xf.ops.attention import masked_softmax
from keras_xf.ops.attention import repeat_kv_heads
from keras_xf.ops.attention import scaled_dot_product_attention
from keras_xf.ops.block_sparse_attention import block_sparse_attention
from keras_xf.ops.masks import causal_mask
from keras_xf.ops.masks import expand_attention_mask
from keras_xf.ops.masks import key_padding_to_attention_mask
from keras_xf.ops.masks import merge_masks
from keras_xf.ops.masks import padding_mask
from keras_xf.ops.positions import alibi_slopes
from keras_xf.ops.positions import apply_rotary
from keras_xf.ops.positions import clip_relative_distance
from keras_xf.ops.positions import relative_distance
from keras_xf.ops.positions import relative_position_buckets
from keras_xf.ops.positions import rotary_angles
from keras_xf.ops.positions import sinusoid_inverse_frequencies
from keras_xf.ops.positions import sinusoid_table
from keras_xf.ops.scan import associative_scan
from keras_xf.ops.scan import chunked_scan
from keras_xf.ops.scan import linear_recurrence
from keras_xf.ops.scan import sequential_scan
from keras_xf.ops.linear_attention import causal_linear_attention
from keras_xf.ops.linear_attention import linear_attention
