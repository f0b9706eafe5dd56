"""Generation utilities: prompt packing and compiled decoding loops (samplers from keras-hub)."""

from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.prompts import PackedPrompts
from keras_xf.generation.prompts import output_padding_mask
from keras_xf.generation.prompts import pack_prompts
from keras_xf.generation.sampling import get_sampler
