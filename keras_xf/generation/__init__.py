"""Generation utilities: prompt packing, compile buckets, compiled decoding loops and their
cache on disk, samplers (keras-hub's, built from plain arguments) and the repetition penalty."""

from keras_xf.generation.compilation_cache import enable_compilation_cache
from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.prompts import NewTokens
from keras_xf.generation.prompts import PackedPrompts
from keras_xf.generation.prompts import bucket_length
from keras_xf.generation.prompts import output_padding_mask
from keras_xf.generation.prompts import pack_prompts
from keras_xf.generation.sampling import SamplerSpec
from keras_xf.generation.sampling import get_sampler
from keras_xf.generation.sampling import penalize_repetition
from keras_xf.generation.sampling import sampler_from_arguments
