"""`model.export(path, format=...)` of a keras_xf model: which function writes each format."""

import keras

from keras_xf.export.endpoints import ExportEndpoints
from keras_xf.export.onnx import export_onnx
from keras_xf.export.saved_model import export_saved_model
from keras_xf.export.torch_programs import export_torch


def export_model(model, filepath, format="tf_saved_model", verbose=None, input_signature=None,
                 **kwargs):
    """What `model.export(filepath, format, verbose, input_signature, **kwargs)` does for a
    keras_xf model (`FunctionalModel.export`): Keras' `export` with keras_xf's dynamic shapes,
    of the endpoints the model declares (`model.export_endpoints()`).

    - `"tf_saved_model"` (the default; TensorFlow and JAX): `export_saved_model`.
    - `"onnx"` (PyTorch): `export_onnx`; `opset_version` is its keyword.
    - `"torch"` (PyTorch): `export_torch`; other keywords go to `torch.export.export`.
    - `"openvino"`, `"litert"`: Keras' own export, unchanged.

    A model whose inputs are not a dict has no shared dimensions to declare and goes to
    Keras' own export as it is.

    Raises:
        ValueError: for a format the backend cannot export (`"tf_saved_model"` on PyTorch,
            `"onnx"` on TensorFlow / JAX, `"torch"` on TensorFlow / JAX), saying what to use.
    """
    endpoints = model if isinstance(model, ExportEndpoints) else model.export_endpoints()
    if endpoints.inputs is None or format not in ("tf_saved_model", "onnx", "torch"):
        return keras.Model.export(endpoints.serve, filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "tf_saved_model":
        return export_saved_model(endpoints, filepath, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "onnx":
        if input_signature is not None and keras.config.backend() == "torch":
            raise ValueError(
                "model.export(format='onnx') on PyTorch derives the ONNX inputs itself (dynamic "
                "batch and lengths, see keras_xf.export.export_onnx). Received: "
                f"input_signature={input_signature!r}. For Keras' fixed-shape ONNX export call "
                "keras.Model.export(model, path, format='onnx', input_signature=...)."
            )
        return export_onnx(endpoints, filepath, verbose=bool(verbose), **kwargs)
    return export_torch(endpoints, filepath, verbose=verbose, input_signature=input_signature,
                        **kwargs)
