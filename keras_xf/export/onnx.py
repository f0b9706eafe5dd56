"""ONNX files (PyTorch backend), translated from `torch.export` programs by torch's dynamo
ONNX exporter; `onnx` and `onnxscript` must be installed."""

import importlib.util

import keras

from keras_xf.export.endpoints import model_endpoints
from keras_xf.export.torch_programs import quiet_torch_export
from keras_xf.export.torch_programs import serve_program


def export_onnx(model, path, opset_version=None, verbose=False):
    """Writes an ONNX model (PyTorch backend) with dynamic batch and sequence lengths.

    The graph is captured with `torch.export` (batch and each sequence's length symbolic,
    lengths bounded by the model's `max_sequence_length`) and translated by torch's
    dynamo ONNX exporter, which needs the `onnx` and `onnxscript` packages. Keras'
    `model.export(format="onnx")` gives the same result for fixed shapes only: with dynamic
    shapes it falls back to the TorchScript tracer, which cannot trace Keras'
    `LayerNormalization` with a symbolic length.

    The ONNX inputs are named as the model's inputs (int32); run it with
    `onnxruntime.InferenceSession(path).run(None, inputs)`.

    Args:
        model: a built functional keras_xf model, or its `ExportEndpoints`.
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
    require_onnx("export_onnx")
    names, program = serve_program(model_endpoints(model))
    save_onnx(program, path, names, None, opset_version, verbose)
    return path


def save_onnx(program, path, input_names, output_names, opset_version, verbose=False):
    """Translates a `torch.export` program to ONNX, optimises it and writes it to `path`."""
    import torch

    with quiet_torch_export():
        onnx_program = torch.onnx.export(program, dynamo=True, input_names=input_names,
                                         output_names=output_names,
                                         opset_version=opset_version, verbose=verbose)
        onnx_program.optimize()
        onnx_program.save(str(path))


def require_onnx(function):
    """Raises a `ValueError` naming `function` when `onnx` or `onnxscript` is missing."""
    for package in ("onnx", "onnxscript"):
        if importlib.util.find_spec(package) is None:
            raise ValueError(
                f"{function} needs the `{package}` package: pip install onnx onnxscript "
                "(and onnxruntime to run the result)."
            )


def int64_scatter_indices(path):
    """Casts int32 `ScatterND` indices to int64 in the ONNX file at `path`: torch's exporter
    keeps the int32 positions of Keras' cache writes, which ONNX's `ScatterND` (int64 indices
    only) and onnxruntime reject."""
    import onnx

    model = onnx.load(path)
    graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in list(graph.value_info) + list(graph.input) + list(graph.output)}
    nodes, cast = [], set()
    for node in graph.node:
        if node.op_type == "ScatterND" and types.get(node.input[1]) == onnx.TensorProto.INT32:
            name = f"{node.input[1]}_int64"
            if name not in cast:
                nodes.append(onnx.helper.make_node("Cast", [node.input[1]], [name],
                                                   to=onnx.TensorProto.INT64))
                cast.add(name)
            node.input[1] = name
        nodes.append(node)
    if cast:
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, path)
