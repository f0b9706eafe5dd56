"""A functional model is a `torch.nn.Module` on PyTorch whose `parameters()` hold every weight
(torch.export and torch.onnx read them), although it assigns its layers before the module's
`__init__`; on other backends the set-up does nothing."""

import keras
import pytest

from keras_xf.models.backbones.torch_module import sets_attributes_before_module_init
from tests.models.tiny import causal_lm

TORCH = keras.config.backend() == "torch"


@pytest.mark.skipif(not TORCH, reason="a model is a torch module on PyTorch only")
def test_every_weight_is_a_module_parameter_on_torch():
    lm = causal_lm(num_layers=1)
    parameters = {id(parameter) for parameter in lm.parameters()}
    assert parameters and {id(weight.value) for weight in lm.weights} <= parameters


def test_attributes_bypass_torch_only_before_the_module_init():
    assert sets_attributes_before_module_init(False) is TORCH
    assert not sets_attributes_before_module_init(True)

