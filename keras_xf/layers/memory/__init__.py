"""Memory layers (survey §5.2): attention over what earlier chunks of a stream left behind."""

from keras_xf.layers.memory.compressive_memory_attention import CompressiveMemoryAttention
from keras_xf.layers.memory.memory_attention import MemoryAttention
from keras_xf.layers.memory.memory_reset import reset_memories
from keras_xf.layers.memory.retrieval_memory_attention import RetrievalMemoryAttention
