"""The decoding loop's body as TorchScript traces on PyTorch (elsewhere XLA compiles the whole
loop, `keras_xf.generation.compile`).

Why not `keras.ops`: PyTorch runs the loop eagerly, one Python iteration per token, so every
Keras layer call of every step costs Python time that dwarfs the arithmetic of a small model,
and only `torch.jit.trace` records the step's tensor operations once and replays them without
the Python. The model's variables are inputs of each trace (a stateless call), so a trace
always reads the current weights. A traced function must not branch in Python on tensor
values, which holds for keras_xf layers.
"""

import copy
import warnings

import keras


def trace_decoding_step(model, function):
    """Returns `function(*tensors)` for the decoding loop's step: on PyTorch a TorchScript
    trace per input shapes, elsewhere `function` itself (the whole loop is compiled by XLA).
    `model` is what the step reads variables from."""
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
    """Whether `traced_run_loop` traces the sampler's loop body: on PyTorch only, and only for
    greedy search, whose body is deterministic tensor arithmetic (random samplers draw seeds
    in Python, which a trace would freeze)."""
    import keras_hub

    return keras.config.backend() == "torch" and type(sampler) is keras_hub.samplers.GreedySampler


def traced_run_loop(model, sampler):
    """A copy of a keras-hub `sampler` whose loop body (the model's cached step, the choice
    of the next token and the update of the prompt) is one TorchScript trace per input
    shapes, replayed by a plain Python loop; `sampler` itself where `traces_whole_loop_body`
    says no. `model` is what the loop reads variables from."""
    if not traces_whole_loop_body(sampler):
        return sampler
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
    return traced


def _shape_key(tensors):
    return tuple((tuple(t.shape), str(t.dtype)) for t in keras.tree.flatten(tensors))


def _current_values(variables):
    # The variables' own tensors (a Keras torch variable assigns in place, so these stay the
    # live weights); `.value` would add a Python call per variable per step.
    return [variable._value for variable in variables]


def _trace(function, example_inputs):
    """A TorchScript trace of `function`. Cache writes inside a trace are recorded in place
    (`keras_xf.ops.cache.records_in_place_writes`): the loop owns its cache."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarning: shapes are fixed per trace
        return torch.jit.trace(function, example_inputs, check_trace=False, strict=False)
