"""Compiling a whole decoding loop once per shape: XLA on TensorFlow and JAX, eager on PyTorch.

This is the one module of keras_xf that talks to the backends directly, as keras-hub's
generation does: `keras.ops` has no portable "compile this function" call. The loop body
itself is written with `keras.ops` (including `keras.ops.while_loop`).
"""

import warnings

import keras

from keras_xf.ops.cache import cache_updates_in_place


def compile_generate_function(model, function, sampler):
    """Returns `f(*tensors)` running `function(*tensors)` compiled for the backend.

    TensorFlow: `tf.function(jit_compile=True)`; JAX: `jax.jit` over the model and sampler
    state (a stateless call, so the variables are inputs rather than constants); PyTorch:
    the eager function under `torch.no_grad()`. Shapes that were seen before reuse the
    compiled program.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, reduce_retracing=True)
    if backend == "jax":
        import jax

        sampler_variables = list(sampler.variables)
        model_variables = list(model.variables)

        @jax.jit
        def stateless(sampler_state, model_state, *args):
            mapping = list(zip(sampler_variables, sampler_state)) + list(
                zip(model_variables, model_state)
            )
            with keras.StatelessScope(state_mapping=mapping) as scope:
                outputs = function(*args)
            new_sampler_state = [scope.get_current_value(v) for v in sampler_variables]
            return outputs, new_sampler_state

        def run(*args):
            outputs, new_state = stateless(
                [v.value for v in sampler_variables], [v.value for v in model_variables], *args
            )
            for variable, value in zip(sampler_variables, new_state):
                if value is not None:
                    variable.assign(value)
            return outputs

        return run
    if backend == "torch":
        import torch

        def run(*args):
            with torch.no_grad():
                return function(*args)

        return run
    return function


def _shape_key(tensors):
    return tuple((tuple(t.shape), str(t.dtype)) for t in keras.tree.flatten(tensors))


def _current_values(variables):
    # The variables' own tensors (a Keras torch variable assigns in place, so these stay the
    # live weights); `.value` would add a Python call per variable per step.
    return [variable._value for variable in variables]


def _trace(function, example_inputs):
    """A TorchScript trace of `function`, recorded with in-place cache writes (the loop owns
    its cache: `keras_xf.ops.cache.cache_updates_in_place`)."""
    import torch

    with warnings.catch_warnings(), cache_updates_in_place():
        warnings.simplefilter("ignore")  # TracerWarning: shapes are fixed per trace
        return torch.jit.trace(function, example_inputs, check_trace=False, strict=False)


def trace_decoding_step(model, function):
    """Returns `function(*tensors)` for the decoding loop's step: on PyTorch a TorchScript
    trace per input shapes, elsewhere `function` itself (the whole loop is compiled by XLA).

    PyTorch runs the loop eagerly, one Python iteration per token, so every Keras layer call
    of every step costs Python time that dwarfs the arithmetic of a small model. A trace
    records the step's tensor operations once and replays them without the Python. The
    model's variables are inputs of the trace (a stateless call), so the trace always reads
    the current weights. `function` must not branch in Python on tensor values, which holds
    for keras_xf layers: everything the step computes from the cache index is tensor
    arithmetic (the cached path is tested against the uncached eager path).
    """
    if keras.config.backend() != "torch":
        return function
    variables = list(model.variables)
    traces = {}

    def stateless(values, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return function(*args)

    def run(*args):
        key = _shape_key(args)
        values = _current_values(variables)
        if key not in traces:
            traces[key] = _trace(stateless, (values, *args))
        return traces[key](values, *args)

    return run


def traces_whole_loop_body(sampler):
    """Whether `traced_run_loop` may trace the sampler's loop body: only for greedy search,
    whose body is deterministic tensor arithmetic (random samplers draw seeds in Python,
    which a trace would freeze)."""
    import keras_hub

    return keras.config.backend() == "torch" and type(sampler) is keras_hub.samplers.GreedySampler


def traced_run_loop(model, sampler):
    """A `run_loop` for a keras-hub sampler on PyTorch whose body (the model's cached step,
    the choice of the next token and the update of the prompt) is one TorchScript trace per
    input shapes; the loop itself is a plain Python loop that replays it.

    Returns a copy of `sampler` using it, or `sampler` itself where `traces_whole_loop_body`
    says no.
    """
    if not traces_whole_loop_body(sampler):
        return sampler
    import copy

    variables = list(model.variables)
    traces = {}

    def run_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        def stateless(values, *loop_vars):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return tuple(body(*loop_vars))

        loop_vars = tuple(loop_vars)
        steps = int(keras.ops.convert_to_numpy(maximum_iterations))
        for _ in range(steps):
            if not bool(cond(*loop_vars)):
                break
            key = _shape_key(loop_vars)
            values = _current_values(variables)
            if key not in traces:
                traces[key] = _trace(stateless, (values, *loop_vars))
            loop_vars = traces[key](values, *loop_vars)
        return loop_vars

    traced = copy.copy(sampler)
    traced.run_loop = run_loop
    traced.traces_loop_body = True  # the model step inside needs no trace of its own
    return traced


class CompiledFunctions:
    """A cache of compiled generation functions, keyed by (sampler, stop tokens, cache flag).

    A plain object rather than a dict: TensorFlow tracks dict attributes of a layer and would
    try to save the compiled functions into a SavedModel.
    """

    def __init__(self):
        self._functions = {}
        self.decode_step = None  # the loop body, traced on PyTorch (`trace_decoding_step`)

    def __contains__(self, key):
        return key in self._functions

    def __getitem__(self, key):
        return self._functions[key]

    def __setitem__(self, key, function):
        self._functions[key] = function

    def __len__(self):
        return len(self._functions)
