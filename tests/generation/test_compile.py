"""`compile_generate_function`: the backend's compiled form of a generation function reads the
model's current weights at every call (they are inputs, not constants captured when it was
traced), advances the sampler's seed state, and gives the eager function's values."""

import keras
import keras_hub
import numpy as np

from keras_xf.generation.compile import CompiledFunctions
from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.generation_variables import GenerationVariables
from tests.layer_checks import to_numpy


def _dense_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs))


def test_compiled_function_reads_the_current_weights(rng):
    model = _dense_model()
    sampler = keras_hub.samplers.GreedySampler()
    compiled = compile_generate_function(model, lambda x: model(x), sampler)
    x = rng.normal(size=(2, 4)).astype("float32")
    np.testing.assert_allclose(to_numpy(compiled(keras.ops.convert_to_tensor(x))),
                               to_numpy(model(x)), atol=1e-6)
    model.get_layer("dense").kernel.assign(rng.normal(size=(4, 3)).astype("float32"))
    np.testing.assert_allclose(to_numpy(compiled(keras.ops.convert_to_tensor(x))),
                               to_numpy(model(x)), atol=1e-6)


def test_sampler_seed_state_advances_between_calls(rng):
    """A random sampler draws anew at each call of the compiled function (its seed generator
    is state that the call updates), as it does eagerly."""
    model = _dense_model()
    sampler = keras_hub.samplers.RandomSampler(seed=1)

    def draw(x):
        return keras.random.categorical(model(x), 1, seed=sampler.seed_generator)

    compiled = compile_generate_function(model, draw, sampler)
    x = keras.ops.convert_to_tensor(rng.normal(size=(64, 4)).astype("float32"))
    first, second = to_numpy(compiled(x)), to_numpy(compiled(x))
    assert not np.array_equal(first, second)


def test_layers_beside_the_model_are_loop_variables():
    model, other = _dense_model(), _dense_model()
    owner = GenerationVariables(model, other)
    assert owner.variables == model.variables + other.variables
    assert owner.trainable_variables == model.trainable_variables + other.trainable_variables
    assert owner.non_trainable_variables == []


def test_compiled_functions_are_kept_by_key():
    functions = CompiledFunctions()
    assert "greedy" not in functions and len(functions) == 0
    functions["greedy"] = len
    assert "greedy" in functions and functions["greedy"] is len and len(functions) == 1
    assert functions.decode_step is None
