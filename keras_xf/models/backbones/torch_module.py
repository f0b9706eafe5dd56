"""What a functional model needs from PyTorch's `torch.nn.Module` that Keras does not give it:
attributes set before the module's `__init__`, and its weights as module parameters.

Why here and not through `keras.ops`: both concern how Keras' PyTorch backend makes a model a
`torch.nn.Module`; Keras has no backend-neutral hook for either, and other backends need
nothing. `FunctionalModel` is their only user.
"""

import keras

from keras_xf.ops.keras_internals import track_torch_variables


def sets_attributes_before_module_init(initialized):
    """Whether a model whose functional `__init__` has (`initialized`) or has not run must keep
    attributes in its own instance dictionary: a PyTorch module cannot
    hold attributes before `torch.nn.Module.__init__` has run, and a functional model assigns
    its layers before calling the functional `__init__` (the graph tracks them then). Keras
    has no backend-neutral hook for this; other backends track attributes as usual."""
    return keras.config.backend() == "torch" and not initialized


def register_module_parameters(model):
    """Registers `model`'s variables as PyTorch parameters again after the functional
    `__init__`: `_torch_params` was kept out of torch's `__setattr__` (see
    `sets_attributes_before_module_init`), and `parameters()` (torch.onnx, torch.export)
    would miss the weights. Nothing to do on other backends, nor for variables created
    without values (in a `keras.StatelessScope`): Keras tracks those when first asked for the
    parameters, as its own layers do."""
    if keras.config.backend() == "torch":
        track_torch_variables(model)
