"""The decoding loop's body as TorchScript traces on PyTorch: one trace per input shapes,
reading the current weights, giving the eager step's values; elsewhere the functions and
samplers are returned as they are (XLA compiles the whole loop)."""

import keras
import keras_hub
import numpy as np
import pytest

from keras_xf.generation.traced_loop import trace_decoding_step
from keras_xf.generation.traced_loop import traced_run_loop
from keras_xf.generation.traced_loop import traces_whole_loop_body
from tests.layer_checks import to_numpy
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings

TORCH = keras.config.backend() == "torch"


def test_only_greedy_search_on_torch_traces_the_whole_body():
    greedy, top_k = keras_hub.samplers.GreedySampler(), keras_hub.samplers.TopKSampler(k=2)
    assert traces_whole_loop_body(greedy) is TORCH
    assert not traces_whole_loop_body(top_k)
    model = causal_lm(num_layers=1)
    assert traced_run_loop(model, top_k) is top_k
    assert (traced_run_loop(model, greedy) is greedy) is not TORCH


@pytest.mark.skipif(TORCH, reason="the torch trace is tested below")
def test_without_torch_the_step_is_the_function():
    def step(x):
        return x

    assert trace_decoding_step(causal_lm(num_layers=1), step) is step


@pytest.mark.skipif(not TORCH, reason="TorchScript traces are PyTorch's")
def test_traced_step_is_one_trace_per_shape_and_reads_current_weights(rng):
    import torch

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs))
    calls = []

    def step(x):
        calls.append(tuple(x.shape))
        return model(x)

    traced = trace_decoding_step(model, step)
    x = torch.from_numpy(rng.normal(size=(2, 4)).astype("float32"))
    for _ in range(3):
        np.testing.assert_allclose(to_numpy(traced(x)), to_numpy(model(x)), atol=1e-6)
    assert calls == [(2, 4)]  # traced once, replayed after
    model.get_layer("dense").kernel.assign(rng.normal(size=(4, 3)).astype("float32"))
    np.testing.assert_allclose(to_numpy(traced(x)), to_numpy(model(x)), atol=1e-6)
    traced(torch.from_numpy(rng.normal(size=(3, 4)).astype("float32")))
    assert calls == [(2, 4), (3, 4)]  # a new shape, a new trace


@pytest.mark.skipif(not TORCH, reason="TorchScript traces are PyTorch's")
def test_traced_greedy_loop_gives_the_eager_tokens():
    """`generate` runs greedy search through the traced body; without the trace (the
    uncached loop, which is not traced) the tokens are the same."""
    model = randomize_embeddings(causal_lm(num_layers=1))
    prompts = {"token_ids": np.array([[3, 4, 5, 0, 0, 0, 0, 0], [6, 7, 0, 0, 0, 0, 0, 0]],
                                     "int32")}
    traced = model.generate(prompts)["token_ids"]
    assert model._generate_functions.decode_step is None  # the whole body was traced instead
    np.testing.assert_array_equal(to_numpy(traced),
                                  to_numpy(model.generate(prompts, use_cache=False)["token_ids"]))
