"""Every checkpoint family module offers the same interface, which the converters call
without probing: its architecture names, `build`, `build_from_folder`, `tensor_map` and
`hf_config`."""

import inspect

import pytest

from keras_xf.checkpoints.convert import FAMILIES


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_offers_the_converters_interface(name):
    family = FAMILIES[name]
    assert family.ARCHITECTURES and set(family.MODEL_TYPES.values()) <= set(family.ARCHITECTURES)
    for function, parameters in (("build", ["config", "dtype"]),
                                 ("build_from_folder", ["folder", "dtype"]),
                                 ("tensor_map", ["model", "config"]),
                                 ("hf_config", ["model"])):
        signature = inspect.signature(getattr(family, function))
        assert list(signature.parameters)[: len(parameters)] == parameters, (name, function)
