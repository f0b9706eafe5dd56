"""Export keras_xf models for serving: SavedModel (TensorFlow, JAX), ONNX and `.pt2` (PyTorch).

This package knows no model class. A model declares what it exports through its public hook
`export_endpoints()` (on `FunctionalModel`, extended by `GenerativeTask`), which returns an
`ExportEndpoints`: the `serve` model, its input signature, the longest sequence it takes and,
for a generating task, its `GenerationSteps` (the cached loop, the context encoding, the
empty cache, the prefill and the decoding step). The functions here read only that structure.

`model.export(path, format=...)` (Keras' signature, overridden by keras_xf's
`FunctionalModel`) goes through `export_model` to the functions below:

| backend    | `"tf_saved_model"` (default)  | `"onnx"`                         | `"torch"`      |
|------------|-------------------------------|----------------------------------|----------------|
|            | `export_saved_model`          | `export_onnx`                    | `export_torch` |
| tensorflow | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| jax        | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| torch      | no (Keras needs `torch_xla`)  | yes, dynamic batch and length    | yes (`.pt2`)   |

Every unsupported combination raises a `ValueError` that says why and what to use instead.
The SavedModel of a generating task (`CausalLM`, `Seq2SeqLM`, `VisionLanguageLM`) also has a
`generate` endpoint: `model.generate`'s cached loop (see `export_saved_model`); on PyTorch
their generation exports as two programs that a short loop of the caller's runs: the prefill
(`export_prefill`: context and prompts into the cache) and the cached decoding step
(`export_decode_step`). A model quantised with `model.quantize("int8")` (its `Dense` and
`EinsumDense` kernels and its `TokenEmbedding` table int8) exports through the same functions.
See `docs/export.md`.

Example:
>>> lm.export("/tmp/lm")                   # TensorFlow or JAX backend: export_saved_model
>>> import tensorflow as tf
>>> tf.saved_model.load("/tmp/lm").serve({"token_ids": ids, "padding_mask": mask})
"""

from keras_xf.export.endpoints import ExportEndpoints
from keras_xf.export.endpoints import GenerationSteps
from keras_xf.export.endpoints import input_specs
from keras_xf.export.formats import export_model
from keras_xf.export.generate_endpoint import GENERATE_SAMPLERS
from keras_xf.export.generate_endpoint import generate_signature
from keras_xf.export.generation_programs import export_decode_step
from keras_xf.export.generation_programs import export_prefill
from keras_xf.export.onnx import export_onnx
from keras_xf.export.saved_model import export_saved_model
from keras_xf.export.signatures import SEQUENCE_INPUT_SUFFIXES
from keras_xf.export.signatures import input_signature
from keras_xf.export.signatures import sequence_dimensions
from keras_xf.export.torch_programs import export_torch
