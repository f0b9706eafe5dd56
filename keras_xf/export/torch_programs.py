"""`torch.export` programs of a model's `serve` endpoint (PyTorch backend): `.pt2` files, and
the capture that the ONNX export translates."""

import keras

from keras_xf.export.endpoints import model_endpoints
from keras_xf.export.signatures import dict_inputs
from keras_xf.export.signatures import free_signature
from keras_xf.export.signatures import sequence_dimensions


def export_torch(model, path, verbose=False, input_signature=None, **kwargs):
    """Writes a `torch.export` ExportedProgram (`.pt2`, PyTorch backend) with dynamic shapes.

    This is Keras' `model.export(path, format="torch")` with keras_xf's shared batch / length
    dimensions (what `model.export(path, format="torch")` does for keras_xf models). Load it
    with `torch.export.load(path).module()` and call that with the dict of int32 tensors.

    Args:
        model: a built functional keras_xf model, or its `ExportEndpoints`.
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
    endpoints = model_endpoints(model)
    if input_signature is None:
        input_signature = free_signature(endpoints)
        kwargs.setdefault("dynamic_shapes", [(torch_dynamic_shapes(endpoints)[0],)])
    with quiet_torch_export():
        keras.Model.export(endpoints.serve, str(path), format="torch",
                           input_signature=input_signature, verbose=verbose, **kwargs)
    return path


def torch_dynamic_shapes(endpoints):
    """torch.export `dynamic_shapes` for the dict argument, and a sample batch for tracing."""
    import torch

    max_length = endpoints.max_sequence_length
    # torch.export specialises dimensions whose sample value is 0 or 1: trace with 2 and 3.
    sample_length = 3 if max_length is None else min(3, max_length)
    symbols = {"batch": torch.export.Dim("batch", min=1)}
    shapes, sample = {}, {}
    inputs = dict_inputs(endpoints)
    for name, dims in sequence_dimensions(endpoints).items():
        spec = inputs[name]
        dtype = getattr(torch, keras.backend.standardize_dtype(spec.dtype))
        if len(dims) == 1:  # a fixed-shape input: only the batch is dynamic
            shapes[name] = {0: symbols[dims[0]]}
            sample[name] = torch.ones((2,) + tuple(spec.shape[1:]), dtype=dtype)
            continue
        batch, length = dims
        if length not in symbols:
            symbols[length] = torch.export.Dim(length, min=1, max=max_length)
        shapes[name] = {0: symbols[batch], 1: symbols[length]}
        sample[name] = torch.ones((2, sample_length), dtype=dtype)
    return shapes, sample


def capture_program(model, module, args, dynamic_shapes, no_grad=True):
    """`torch.export.export(module, args, dynamic_shapes)` with `model` (whose layers
    `module` calls) in inference mode, under `torch.no_grad()` unless `no_grad=False`."""
    import contextlib

    import torch

    was_training = model.training
    model.eval()
    try:
        with quiet_torch_export(), torch.no_grad() if no_grad else contextlib.nullcontext():
            return torch.export.export(module, args, dynamic_shapes=dynamic_shapes,
                                       strict=False)
    finally:
        model.train(was_training)


def serve_program(endpoints):
    """`(input names, ExportedProgram)` of the `serve` model called on a flat tuple of its
    inputs."""
    import torch

    dynamic_shapes, sample = torch_dynamic_shapes(endpoints)
    names = list(sample)

    class _FlatInputs(torch.nn.Module):
        """Calls the model with a dict rebuilt from positional tensors (ONNX inputs are flat)."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, *tensors):
            return self.wrapped(dict(zip(names, tensors)), training=False)

    program = capture_program(
        endpoints.serve, _FlatInputs(endpoints.serve), tuple(sample[name] for name in names),
        # `forward(*tensors)`: torch.export sees one argument, the tuple.
        [tuple(dynamic_shapes[name] for name in names)], no_grad=False,
    )
    return names, program


class quiet_torch_export:
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
