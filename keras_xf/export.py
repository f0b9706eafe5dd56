"""Export keras_xf models for serving: SavedModel (TensorFlow, JAX), ONNX and `.pt2` (PyTorch).

keras_xf's models take a dict of int32 `[batch, length]` tensors, and the inputs of one
sequence (`token_ids`, `padding_mask`, `segment_ids`; or `encoder_…` / `decoder_…`) must share
their batch and length. Keras' own `model.export` does not know that: on JAX it gives every
`None` dimension its own symbol, so attention cannot broadcast a `[batch, a]` padding mask
against `[batch, b]` queries. The helpers here declare the shared dimensions and otherwise use
what Keras supports on each backend. Inputs whose dimensions after the batch are static
(`images` `[batch, H, W, C]` of a `VisionClassifier`) keep only the batch dynamic.

`model.export(path, format=...)` (Keras' signature, overridden by keras_xf's
`FunctionalModel`) goes through `export_model` to the functions below:

| backend    | `"tf_saved_model"` (default)  | `"onnx"`                         | `"torch"`      |
|------------|-------------------------------|----------------------------------|----------------|
|            | `export_saved_model`          | `export_onnx`                    | `export_torch` |
| tensorflow | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| jax        | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| torch      | no (Keras needs `torch_xla`)  | yes, dynamic batch and length    | yes (`.pt2`)   |

Every unsupported combination raises a `ValueError` that says why and what to use instead.
See `docs/export.md`.

Example:
>>> lm.export("/tmp/lm")                   # TensorFlow or JAX backend: export_saved_model
>>> import tensorflow as tf
>>> tf.saved_model.load("/tmp/lm").serve({"token_ids": ids, "padding_mask": mask})
"""

import keras

# Input-name endings that mark the tensors of one sequence; the prefix before the ending names
# the sequence ("" for `token_ids`, "encoder_" for `encoder_token_ids`, ...).
SEQUENCE_INPUT_SUFFIXES = ("token_ids", "padding_mask", "segment_ids")


def export_model(model, filepath, format="tf_saved_model", verbose=None, input_signature=None,
                 **kwargs):
    """What `model.export(filepath, format, verbose, input_signature, **kwargs)` does for a
    keras_xf model (`FunctionalModel.export`): Keras' `export` with keras_xf's dynamic shapes.

    - `"tf_saved_model"` (the default; TensorFlow and JAX): `export_saved_model`.
    - `"onnx"` (PyTorch): `export_onnx`; `opset_version` is its keyword.
    - `"torch"` (PyTorch): `export_torch`; other keywords go to `torch.export.export`.
    - `"openvino"`, `"litert"`: Keras' own export, unchanged.

    A model whose inputs are not a dict (`VisionBackbone` takes one image tensor) has no
    shared dimensions to declare and goes to Keras' own export as it is.

    Raises:
        ValueError: for a format the backend cannot export (`"tf_saved_model"` on PyTorch,
            `"onnx"` on TensorFlow / JAX, `"torch"` on TensorFlow / JAX), saying what to use.
    """
    if not isinstance(getattr(model, "_inputs_struct", None), dict):
        return keras.Model.export(model, filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "tf_saved_model":
        return export_saved_model(model, filepath, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "onnx":
        if input_signature is not None and keras.config.backend() == "torch":
            raise ValueError(
                "model.export(format='onnx') on PyTorch derives the ONNX inputs itself (dynamic "
                "batch and lengths, see keras_xf.export.export_onnx). Received: "
                f"input_signature={input_signature!r}. For Keras' fixed-shape ONNX export call "
                "keras.Model.export(model, path, format='onnx', input_signature=...)."
            )
        return export_onnx(model, filepath, verbose=bool(verbose), **kwargs)
    if format == "torch":
        return export_torch(model, filepath, verbose=verbose, input_signature=input_signature,
                            **kwargs)
    return keras.Model.export(model, filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)


def export_saved_model(model, path, verbose=False, input_signature=None, **kwargs):
    """Writes a TensorFlow SavedModel whose `serve` endpoint runs `model` (inference mode).

    `model.export(path)` (the default format) comes here for keras_xf models. The endpoint
    takes a dict of int32 tensors named as the model's inputs and accepts any batch size and
    sequence length (each sequence's inputs sharing theirs). On JAX the computation is
    lowered with `jax2tf` (native serialization, for the platform JAX runs on); pass
    `jax2tf_kwargs` to change that (e.g. `{"native_serialization_platforms": ("cpu",
    "cuda")}`). keras_xf fills in `polymorphic_shapes` (shared batch and per-sequence length
    symbols for the free dimensions of the signature), `polymorphic_constraints` (each length
    at most the backbone's `max_sequence_length`) and `with_gradient=False` (the artefact
    serves inference; jax2tf loses the constraints when it converts the gradient) unless you
    give them.

    Args:
        model: a built functional keras_xf model (`CausalLM`, `Seq2SeqLM`, ...).
        path: the SavedModel folder to write.
        verbose: bool, whether Keras prints the endpoint summary.
        input_signature: `[{name: keras.InputSpec}]`; defaults to `input_signature(model)`
            (every dimension but fixed feature sizes free).
        **kwargs: passed on to Keras' `export(..., format="tf_saved_model")`.

    Returns:
        `path`. Load it with `tf.saved_model.load(path).serve(inputs)`.

    Raises:
        ValueError: on the PyTorch backend (see `export_onnx` and `export_torch`).
    """
    backend = keras.config.backend()
    if backend == "torch":
        raise ValueError(
            "A SavedModel (model.export(path), format='tf_saved_model') cannot be written from "
            "the PyTorch backend: Keras exports a torch model as a SavedModel only through "
            "`torch_xla` (StableHLO), which has no release for this torch version, and its "
            "torch SavedModel path does not accept dict inputs. Use "
            "model.export(path, format='onnx') (keras_xf.export.export_onnx) or "
            "model.export('model.pt2', format='torch') (export_torch) instead, or export from "
            "the TensorFlow or JAX backend."
        )
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"export_saved_model needs the TensorFlow or JAX backend. Received: {backend}"
        )
    if input_signature is None:
        input_signature = _free_signature(model)
    if backend == "jax":
        kwargs["jax2tf_kwargs"] = _jax2tf_kwargs(model, input_signature,
                                                 kwargs.get("jax2tf_kwargs"))
    keras.Model.export(model, str(path), format="tf_saved_model",
                       input_signature=input_signature, verbose=verbose, **kwargs)
    return path


def _jax2tf_kwargs(model, signature, given=None):
    """`jax2tf_kwargs` with keras_xf's defaults filled in where `given` has none."""
    jax2tf_kwargs = dict(given or {})
    shapes = _polymorphic_shapes(model, signature)
    if shapes is not None:
        jax2tf_kwargs.setdefault("polymorphic_shapes", [shapes])
        jax2tf_kwargs.setdefault("polymorphic_constraints",
                                  _length_constraints(model, signature))
    # An inference artefact: jax2tf's gradient function drops the constraints above.
    jax2tf_kwargs.setdefault("with_gradient", False)
    return jax2tf_kwargs


def export_onnx(model, path, opset_version=None, verbose=False):
    """Writes an ONNX model (PyTorch backend) with dynamic batch and sequence lengths.

    The graph is captured with `torch.export` (batch and each sequence's length symbolic,
    lengths bounded by the backbone's `max_sequence_length`) and translated by torch's
    dynamo ONNX exporter, which needs the `onnx` and `onnxscript` packages. Keras'
    `model.export(format="onnx")` gives the same result for fixed shapes only: with dynamic
    shapes it falls back to the TorchScript tracer, which cannot trace Keras'
    `LayerNormalization` with a symbolic length.

    The ONNX inputs are named as the model's inputs (int32); run it with
    `onnxruntime.InferenceSession(path).run(None, inputs)`.

    Args:
        model: a built functional keras_xf model.
        path: the `.onnx` file to write.
        opset_version: int, the ONNX opset; torch's default when `None`.
        verbose: bool, whether torch prints its export steps.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX (export a SavedModel and convert it), or when
            `onnx` / `onnxscript` are not installed.
    """
    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            "keras_xf.export.export_onnx (model.export(format='onnx')) supports the PyTorch "
            f"backend only. Received: {backend}. "
            "On TensorFlow and JAX, Keras' ONNX export needs `tf2onnx` / `jax2onnx` (not part "
            "of keras_xf's set-up), and Keras' JAX ONNX path gives each input its own length. "
            "Export a SavedModel with model.export(path) (export_saved_model) and convert it: "
            "`python -m tf2onnx.convert --saved-model PATH --output model.onnx`."
        )
    for package in ("onnx", "onnxscript"):
        _require(package, "export_onnx")
    import torch

    names, program = _torch_export_program(model)
    with _quiet_torch_export():
        onnx_program = torch.onnx.export(
            program,
            dynamo=True,
            input_names=names,
            opset_version=opset_version,
            verbose=verbose,
        )
        onnx_program.optimize()
        onnx_program.save(str(path))
    return path


def export_torch(model, path, verbose=False, input_signature=None, **kwargs):
    """Writes a `torch.export` ExportedProgram (`.pt2`, PyTorch backend) with dynamic shapes.

    This is Keras' `model.export(path, format="torch")` with keras_xf's shared batch / length
    dimensions (what `model.export(path, format="torch")` does for keras_xf models). Load it
    with `torch.export.load(path).module()` and call that with the dict of int32 tensors.

    Args:
        model: a built functional keras_xf model.
        path: the file to write; must end with `.pt2`.
        verbose: bool, whether Keras prints a message.
        input_signature: defaults to `input_signature(model)`; with a signature of your own,
            `dynamic_shapes` is not filled in (pass it in `kwargs`).
        **kwargs: passed to `torch.export.export` (`strict`, `dynamic_shapes`, ...).

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX, or when `path` does not end with `.pt2`.
    """
    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            f"export_torch (model.export(format='torch')) needs the PyTorch backend "
            f"(torch.export). Received: {backend}. Use model.export(path) (a SavedModel, "
            "export_saved_model) on TensorFlow and JAX."
        )
    if not str(path).endswith(".pt2"):
        raise ValueError(f"export_torch writes a `.pt2` file. Received: path={path}")
    if input_signature is None:
        input_signature = _free_signature(model)
        kwargs.setdefault("dynamic_shapes", [(_torch_dynamic_shapes(model)[0],)])
    with _quiet_torch_export():
        keras.Model.export(model, str(path), format="torch", input_signature=input_signature,
                           verbose=verbose, **kwargs)
    return path


def input_signature(model):
    """`[{name: keras.InputSpec([None, None], dtype, name=name)}]`: the model's dict inputs,
    with every dimension but fixed feature sizes left free (Keras' export convention: one
    positional argument holding the whole dict)."""
    return _free_signature(model)


def _free_signature(model):
    # A second name: `export_saved_model` and `export_torch` take an `input_signature` argument.
    inputs = _dict_inputs(model)
    return [
        {
            name: keras.InputSpec(
                shape=(None,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, name=name
            )
            for name, tensor in inputs.items()
        }
    ]


def sequence_dimensions(model):
    """`{input name: (batch symbol, length symbol)}`: inputs of one sequence share a symbol.

    `token_ids` / `padding_mask` → `("batch", "length")`; `encoder_token_ids` →
    `("batch", "encoder_length")`; an input with another name gets a length of its own; an
    input of rank above 2 with static trailing dimensions (`images`) → `("batch",)`.
    """
    dims = {}
    for name, tensor in _dict_inputs(model).items():
        if len(tensor.shape) > 2:
            dims[name] = ("batch",)  # a fixed-shape input (images): only the batch is free
            continue
        for suffix in SEQUENCE_INPUT_SUFFIXES:
            if name.endswith(suffix):
                dims[name] = ("batch", f"{name[: -len(suffix)]}length")
                break
        else:
            dims[name] = ("batch", f"{name}_length")
    return dims


# ----------------------------------------------------------------------------------------
def _dict_inputs(model):
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"Export needs a built keras.Model. Received: {model!r}")
    inputs = getattr(model, "_inputs_struct", None)
    if not isinstance(inputs, dict):
        raise ValueError(
            "keras_xf.export handles functional models with dict inputs (keras_xf's models). "
            f"Received inputs: {inputs!r}; use `model.export` directly."
        )
    for name, tensor in inputs.items():
        fixed_shape = len(tensor.shape) > 2 and None not in tensor.shape[1:]
        if len(tensor.shape) != 2 and not fixed_shape:
            raise ValueError(
                "keras_xf.export expects [batch, length] inputs, or inputs whose dimensions "
                f"after the batch are static (images). Received: {name} with shape {tensor.shape}"
            )
    return inputs


def _polymorphic_shapes(model, signature):
    """jax2tf `polymorphic_shapes` for the dict argument, e.g. `"(batch, length)"`: the free
    dimensions of `signature` get keras_xf's shared symbols, the others their size. `None`
    when `signature` is not one dict with the model's input names (Keras' defaults apply)."""
    inputs = _dict_inputs(model)
    if not (isinstance(signature, (list, tuple)) and len(signature) == 1
            and isinstance(signature[0], dict) and set(signature[0]) == set(inputs)):
        return None
    shapes = {}
    for name, dims in sequence_dimensions(model).items():
        sizes = tuple(signature[0][name].shape)
        symbols = list(dims) + [None] * (len(sizes) - len(dims))
        shapes[name] = "({})".format(", ".join(
            str(size) if size is not None or symbol is None else symbol
            for size, symbol in zip(sizes, symbols)
        ))
    return shapes


def _length_constraints(model, signature):
    """`("length <= 512", ...)` for the lengths left free in `signature`: lengths fit the
    backbone's position table (learned positions slice it, which jax2tf must prove in
    bounds)."""
    max_length = _max_length(model)
    if max_length is None:
        return ()
    lengths = sorted({dims[1] for name, dims in sequence_dimensions(model).items()
                      if len(dims) > 1 and tuple(signature[0][name].shape)[1] is None})
    return tuple(f"{length} <= {max_length}" for length in lengths)


def _max_length(model):
    backbone = getattr(model, "backbone", model)
    length = getattr(backbone, "max_sequence_length", None)
    return int(length) if length else None


def _torch_dynamic_shapes(model):
    """torch.export `dynamic_shapes` for the dict argument, and a sample batch for tracing."""
    import torch

    max_length = _max_length(model)
    # torch.export specialises dimensions whose sample value is 0 or 1: trace with 2 and 3.
    sample_length = 3 if max_length is None else min(3, max_length)
    symbols = {"batch": torch.export.Dim("batch", min=1)}
    shapes, sample = {}, {}
    for name, dims in sequence_dimensions(model).items():
        tensor = _dict_inputs(model)[name]
        dtype = getattr(torch, keras.backend.standardize_dtype(tensor.dtype))
        if len(dims) == 1:  # a fixed-shape input: only the batch is dynamic
            shapes[name] = {0: symbols[dims[0]]}
            sample[name] = torch.ones((2,) + tuple(tensor.shape[1:]), dtype=dtype)
            continue
        batch, length = dims
        if length not in symbols:
            symbols[length] = torch.export.Dim(length, min=1, max=max_length)
        shapes[name] = {0: symbols[batch], 1: symbols[length]}
        sample[name] = torch.ones((2, sample_length), dtype=dtype)
    return shapes, sample


def _torch_export_program(model):
    """`(input names, ExportedProgram)` of `model` called on a flat tuple of its inputs."""
    import torch

    dynamic_shapes, sample = _torch_dynamic_shapes(model)
    names = list(sample)

    class _FlatInputs(torch.nn.Module):
        """Calls the model with a dict rebuilt from positional tensors (ONNX inputs are flat)."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, *tensors):
            return self.wrapped(dict(zip(names, tensors)), training=False)

    was_training = model.training
    model.eval()
    try:
        with _quiet_torch_export():
            program = torch.export.export(
                _FlatInputs(model),
                tuple(sample[name] for name in names),
                # `forward(*tensors)`: torch.export sees one argument, the tuple.
                dynamic_shapes=[tuple(dynamic_shapes[name] for name in names)],
                strict=False,
            )
    finally:
        model.train(was_training)
    return names, program


def _require(package, function):
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"{function} needs the `{package}` package: pip install onnx onnxscript "
            "(and onnxruntime to run the result)."
        )


class _quiet_torch_export:
    """Silences the warnings torch.export / torch.onnx raise for Keras' layer bookkeeping."""

    # torch.onnx logs one warning per torchvision operator it cannot register.
    _LOGGER = "torch.onnx._internal.exporter._registration"

    def __enter__(self):
        import logging
        import warnings

        self._context = warnings.catch_warnings()
        self._context.__enter__()
        for message in (
            r".*not properly registered as a submodule.*",
            r".*created when tracing.*",
            r".*Unable to find the path of the module.*",
            r".*get_attr.*",
            r".*LeafSpec.*",
        ):
            warnings.filterwarnings("ignore", message=message)
        self._logger = logging.getLogger(self._LOGGER)
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc_info):
        self._logger.setLevel(self._level)
        return self._context.__exit__(*exc_info)
