"""Fuzzing every public layer (issue 21): valid and invalid constructor arguments and call
inputs give finite outputs of the promised shape, or a `ValueError`/`TypeError` naming the
argument.

The layers are found, not listed (`fuzz_layers.discover_layers`), and each one's docstring
example is the valid construction and call that the cases change, so a new layer is covered
as soon as it is written with its example. Hypothesis draws two cases per layer and test with a
fixed derandomised seed, so the suite is reproducible and stays fast; `python -m tests.fuzz_layers`
runs every case.
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests import fuzz_layers

LAYERS = fuzz_layers.discover_layers()
IDS = [cls.__name__ for cls in LAYERS]
# Layers whose constructors take arguments of their own, beyond keras.layers.Layer's.
WITH_ARGUMENTS = [cls for cls in LAYERS if fuzz_layers.init_parameters(cls)]

# A handful of cases per layer and test: eager JAX compiles every new shape, and the first
# run of each layer (`test_example_runs`) already costs most of this file's time. Two cases a
# layer and test, drawn the same in every run (`derandomize`); `python -m tests.fuzz_layers`
# runs every case.
FUZZ_SETTINGS = settings(
    max_examples=2,
    deadline=None,
    derandomize=True,
    database=None,
    # A failing case is reported as drawn: shrinking would rerun the layer many more times.
    phases=[Phase.explicit, Phase.generate],
    # Each case starts from its own fresh Keras state (`fuzz_layers.isolated_keras_state`),
    # so the autouse state-reset fixture need not run between cases.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

VALUES = st.one_of(st.sampled_from(fuzz_layers.VALUE_POOL), st.integers(-2, 40))


def test_every_public_layer_is_found():
    assert len(LAYERS) >= 40
    assert {"MultiHeadAttention", "TransformerBlock", "AttentionPattern"} <= set(IDS)


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
def test_example_runs(cls):
    """Every public layer has a docstring example that builds it and calls a layer, with
    finite outputs of the promised shape: the valid case that the fuzz cases change."""
    assert fuzz_layers.example_source(cls), f"{cls.__name__} has no `>>>` example"
    fuzz_layers.baseline(cls)


@pytest.mark.parametrize("cls", WITH_ARGUMENTS, ids=lambda cls: cls.__name__)
@FUZZ_SETTINGS
@given(data=st.data())
def test_constructor_arguments(cls, data):
    """The example with one constructor argument replaced by a drawn value (wrong sign, zero,
    too large, NaN, a string, None, a list, ...) runs with finite outputs of the promised
    shape, or raises a ValueError/TypeError naming that argument."""
    name = data.draw(st.sampled_from(fuzz_layers.init_parameters(cls)), label="argument")
    value = data.draw(VALUES, label="value")
    fuzz_layers.constructor_case(cls, name, value)


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
@FUZZ_SETTINGS
@given(data=st.data())
def test_call_inputs(cls, data):
    """The example's call with its input scaled by 1e3, cut to one position or of another rank,
    or with a padding or attention mask that is valid (with a fully padded row) or of a wrong
    batch, length or rank: finite outputs of the promised shape, or a ValueError/TypeError
    naming the changed argument; a mask of a wrong shape must raise."""
    cases = fuzz_layers.call_cases_of(cls)
    assert cases, f"{cls.__name__}'s example calls a layer on no tensor that can be changed"
    argument, kind = data.draw(st.sampled_from(cases), label="case")
    fuzz_layers.call_case(cls, argument, kind)
