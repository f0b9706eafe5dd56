"""The cache kinds of `MultiHeadAttention`: how a layout of keys and values is allocated,
written and read. The cache itself stays the opaque value `init_cache` made."""

from keras_xf.layers.attention.caches.full_cache import FullCache
from keras_xf.layers.attention.caches.rolling_cache import RollingCache
from keras_xf.layers.attention.caches.rolling_cache import cache_kind
