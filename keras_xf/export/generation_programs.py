"""A generating task's generation on PyTorch: the prefill and the cached decoding step, each a
`torch.export` program written as ONNX or `.pt2`, which a short loop of the caller's runs
(`docs/export.md`). PyTorch has no SavedModel, and `model.generate`'s loop is data-dependent:
neither `torch.export` nor its ONNX exporter lowers it."""

import keras
import numpy as np

from keras_xf.export.endpoints import model_endpoints
from keras_xf.export.onnx import int64_scatter_indices
from keras_xf.export.onnx import require_onnx
from keras_xf.export.onnx import save_onnx
from keras_xf.export.signatures import dict_inputs
from keras_xf.export.torch_programs import capture_program


def export_decode_step(model, path, format="onnx", opset_version=None):
    """Writes a generating task's cached decoding step (PyTorch backend) as ONNX or `.pt2`.

    PyTorch has no SavedModel, so its artefacts hold the pieces of `model.generate`'s loop and
    the caller runs the loop (`docs/export.md` has the greedy loop that reproduces
    `model.generate`'s tokens): `export_prefill` encodes the context and the prompts into
    the cache, this step (`GenerationSteps.decode_token`, the step the loop runs) feeds one
    token. Inputs: `token_ids` int32 `[B, 1]` (the token at `cache_index`), `cache_index`
    int64 scalar, and `cache_0`, `cache_1`, … (the flattened cache: `export_prefill`'s
    outputs; for a `CausalLM` also zeros of `model.init_cache(B, L)`'s shapes, the loop then
    starting at index 1). Outputs: float32 logits `[B, V]` for position `cache_index + 1`,
    then `new_cache_0`, `new_cache_1`, … (the `.pt2` module takes and returns the same
    tensors positionally). Batch, output width `L` (at most the text's
    `max_sequence_length`) and a `Seq2SeqLM`'s source length are dynamic.

    Args:
        model: a built `CausalLM`, `Seq2SeqLM` or `VisionLanguageLM`, or its
            `ExportEndpoints`.
        path: the file to write (`.onnx`, or `.pt2` for `format="torch"`).
        format: `"onnx"` (needs `onnx` and `onnxscript`) or `"torch"`.
        opset_version: int, the ONNX opset; torch's default when `None`.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX (their SavedModel has a `generate` endpoint), for a
            model that does not generate, or an unknown `format`.
    """
    import torch

    endpoints = _check_generation_export(model, path, format, "export_decode_step")
    steps = endpoints.generation
    samples = GenerationSamples(endpoints)
    structure = samples.cache()

    class _DecodeStep(torch.nn.Module):
        """One cached step on flat tensors (ONNX inputs and outputs are flat)."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped  # the model, so that torch.export sees its parameters

        def forward(self, token_ids, cache_index, *cache):
            cache = keras.tree.pack_sequence_as(structure, list(cache))
            logits, _, cache = steps.decode_token(token_ids, cache, cache_index)
            return (logits, *keras.tree.flatten(cache))

    flat = keras.tree.flatten(structure)
    names = ["token_ids", "cache_index"] + [f"cache_{i}" for i in range(len(flat))]
    return _write_program(
        endpoints.serve, _DecodeStep(endpoints.serve),
        (torch.ones((2, 1), dtype=torch.int32), torch.tensor(1, dtype=torch.int64), *flat),
        ({0: samples.batch}, None, samples.cache_shapes()),
        names, ["logits"] + [f"new_{name}" for name in names[2:]],
        path, format, opset_version,
    )


def export_prefill(model, path, format="onnx", opset_version=None):
    """Writes a generating task's prefill (PyTorch backend) as ONNX or `.pt2`: the cache that
    `export_decode_step`'s loop starts from.

    The program encodes the context once (a `Seq2SeqLM`'s source through the encoder, a
    `VisionLanguageLM`'s images through the vision encoder; a `CausalLM` has none), writes it
    into an empty cache of the output width (cross-attention keys and values, or the image
    prefix), and writes the prompt tokens in one parallel pass, as `model.generate`'s
    prefill does (`GenerationSteps.encode_context`, `init_cache`, `prefill`). Inputs, by
    name: the prompts `token_ids` (`decoder_token_ids` for a `Seq2SeqLM`), int32 `[B, L]`,
    left-aligned and padded to the output width `L`; then `encoder_token_ids` and
    `encoder_padding_mask` (int32 `[B, S]`, `Seq2SeqLM`) or `images` (float32
    `[B, H, W, C]`, `VisionLanguageLM`). Outputs: `cache_0`, `cache_1`, … , the decoding
    step's cache inputs. The loop starts at the shortest prompt's length: the step
    overwrites every cache position it attends to from there on. A model whose decoder
    keeps a recurrent state (which must see each token once) gets only the context written;
    its loop starts at index 1. Batch, `L` and `S` are dynamic.

    Args:
        model: a built `CausalLM`, `Seq2SeqLM` or `VisionLanguageLM`, or its
            `ExportEndpoints`.
        path: the file to write (`.onnx`, or `.pt2` for `format="torch"`).
        format: `"onnx"` (needs `onnx` and `onnxscript`) or `"torch"`.
        opset_version: int, the ONNX opset; torch's default when `None`.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX, for a model that does not generate, or an unknown
            `format`.
    """
    import torch

    endpoints = _check_generation_export(model, path, format, "export_prefill")
    steps = endpoints.generation
    samples = GenerationSamples(endpoints)
    extras = samples.extras()
    extra_names = list(extras)

    class _Prefill(torch.nn.Module):
        """Context and prompts into the cache, on flat tensors."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped  # the model, so that torch.export sees its parameters

        def forward(self, token_ids, *extras):
            return tuple(keras.tree.flatten(
                prefilled_cache(steps, token_ids, dict(zip(extra_names, extras)))))

    count = len(keras.tree.flatten(samples.cache()))
    return _write_program(
        endpoints.serve, _Prefill(endpoints.serve),
        (torch.ones((2, samples.length), dtype=torch.int32),
         *(torch.from_numpy(value) for value in extras.values())),
        # `forward(token_ids, *extras)`: torch.export sees the extras as one tuple, if any.
        ({0: samples.batch, 1: samples.dims["length"]},
         *([tuple(samples.extra_shapes()[name] for name in extra_names)] if extras else [])),
        [steps.prompt_keys[0]] + extra_names, [f"cache_{i}" for i in range(count)],
        path, format, opset_version,
    )


def prefilled_cache(steps, token_ids, context_inputs):
    """`model.generate`'s cache after its prefill over the whole width of `token_ids`
    (the context alone where the decoder keeps a recurrent state)."""
    from keras import ops

    context = steps.encode_context(**context_inputs)
    batch_size, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    cache = steps.init_cache(batch_size, length, context)
    _, cache = steps.prefill(None if steps.recurrent_state else token_ids, cache, context)
    return cache


def _check_generation_export(model, path, format, function):
    """The `ExportEndpoints` of `model`, after checking the backend, the model and the
    format."""
    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            f"{function} is the PyTorch backend's generation export. Received: {backend}."
            " On TensorFlow and JAX, model.export(path) writes a SavedModel with a `generate` "
            "endpoint."
        )
    endpoints = model_endpoints(model)
    if endpoints.generation is None:
        raise ValueError(
            f"{function} exports a CausalLM's, Seq2SeqLM's or VisionLanguageLM's generation. "
            f"Received: {model!r}"
        )
    if format not in ("onnx", "torch"):
        raise ValueError(f"format must be 'onnx' or 'torch'. Received: format={format!r}")
    if format == "onnx":
        require_onnx(function)
    if format == "torch" and not str(path).endswith(".pt2"):
        raise ValueError(f"format='torch' writes a `.pt2` file. Received: path={path}")
    return endpoints


class GenerationSamples:
    """Tracing samples of a generating task's inputs and cache, and their torch.export
    dynamic dimensions: batch, output width `length`, and `encoder_length` (a `Seq2SeqLM`'s
    source)."""

    # torch.export specialises sizes 0 and 1: trace at batch 2 and lengths of at least 2.
    batch_size = 2

    def __init__(self, endpoints):
        import torch

        self.endpoints = endpoints
        self.steps = endpoints.generation
        # Lengths fit the text's position table where it has one (rotary: unbounded).
        self.max_length = self.steps.max_length
        self.length = min(6, self.max_length or 6)
        self.encoder_length = min(5, self.max_length or 5)
        self.batch = torch.export.Dim("batch", min=1)
        self.dims = {"length": self._dim("length", 2, self.max_length),
                     "encoder_length": self._dim("encoder_length", 2, self.max_length)}

    @staticmethod
    def _dim(name, low, high):
        import torch

        return torch.export.Dim(name, min=low) if high is None else torch.export.Dim(
            name, min=low, max=int(high))

    def extras(self, encoder_length=None):
        """The task's inputs besides the prompts, as numpy (`generate`'s extras)."""
        shapes = {name: tuple(spec.shape[1:]) for name, spec in dict_inputs(self.endpoints).items()
                  if name not in self.steps.prompt_keys}
        length = encoder_length or self.encoder_length
        extras = {}
        for name, shape in shapes.items():
            if len(shape) > 1:  # images: static size
                extras[name] = np.full((self.batch_size,) + shape, 0.5, "float32")
            else:
                extras[name] = np.ones((self.batch_size, length), "int32")
        return extras

    def extra_shapes(self):
        return {name: {0: self.batch} if value.ndim > 2
                else {0: self.batch, 1: self.dims["encoder_length"]}
                for name, value in self.extras().items()}

    def cache(self, length=None, encoder_length=None):
        from keras import ops

        extras = {name: ops.convert_to_tensor(value)
                  for name, value in self.extras(encoder_length).items()}
        context = self.steps.encode_context(**extras)
        return self.steps.init_cache(self.batch_size, length or self.length, context)

    def cache_shapes(self):
        """Per flat cache tensor, `{axis: Dim}`: the axes that follow the output width or the
        source length (an image prefix adds its fixed length: a dimension of its own)."""
        base = keras.tree.flatten(self.cache())
        longer = keras.tree.flatten(self.cache(length=self.length + 1))
        wider = keras.tree.flatten(self.cache(encoder_length=self.encoder_length + 1))
        shapes = []
        for x, y, z in zip(base, longer, wider):
            axes = {0: self.batch}
            for axis, (a, b, c) in enumerate(zip(x.shape, y.shape, z.shape)):
                if a != b:
                    offset = a - self.length
                    name = "length" if not offset else f"length_plus_{offset}"
                    if name not in self.dims:
                        self.dims[name] = self._dim(
                            name, 2 + offset,
                            None if self.max_length is None else self.max_length + offset)
                    axes[axis] = self.dims[name]
                elif a != c:
                    axes[axis] = self.dims["encoder_length"]
            shapes.append(axes)
        return tuple(shapes)


def _write_program(model, module, args, dynamic_shapes, input_names, output_names, path, format,
                   opset_version):
    """Captures `module(*args)` with torch.export and writes it as `.pt2` or ONNX."""
    import torch

    program = capture_program(model, module, args, dynamic_shapes)
    if format == "torch":
        torch.export.save(program, str(path))
        return path
    save_onnx(program, path, input_names, output_names, opset_version)
    int64_scatter_indices(str(path))
    return path
