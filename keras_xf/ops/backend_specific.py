"""The code of keras_xf that `keras.ops` cannot express: every branch on the backend and every
direct use of TensorFlow, JAX or PyTorch lives here (`keras_xf/export/` aside), so that the
rest of the library is written once against `keras.ops`.

Each function says why `keras.ops` is not enough for it. Backends other than the three that
keras_xf tests take the `keras.ops` form wherever one exists.
"""

import copy
import warnings

import keras
from keras.src.backend.common.stateless_scope import in_stateless_scope


def _backend():
    """The name of the Keras backend: the one place the library reads it."""
    return keras.config.backend()


# Functional models (keras_xf.models.backbones.functional_model) ---------------------------------------------


def sets_attributes_before_module_init(model):
    """Whether `model` must take attributes with `object.__setattr__`: a PyTorch module cannot
    hold attributes before `torch.nn.Module.__init__` has run, and a functional model assigns
    its layers before calling the functional `__init__` (the graph tracks them then). Keras
    has no backend-neutral hook for this; other backends track attributes as usual."""
    return _backend() == "torch" and not hasattr(model, "_initialized")


def register_module_parameters(model):
    """Registers `model`'s variables as PyTorch parameters again after the functional
    `__init__`: `_torch_params` was set past torch's `__setattr__` (see
    `sets_attributes_before_module_init`), and `parameters()` (torch.onnx, torch.export)
    would miss the weights. Nothing to do on other backends, nor for variables created
    without values (in a `keras.StatelessScope`): Keras tracks those when first asked for the
    parameters, as its own layers do."""
    if _backend() == "torch" and not in_stateless_scope():
        model._track_variables()


# Generation (keras_xf.generation.compile) -----------------------------------------------


def compile_function(model, function, sampler):
    """Returns `f(*tensors)` running `function(*tensors)` compiled for the backend.

    Why not `keras.ops`: it has no portable "compile this function" call (keras-hub's
    generation talks to the backends here too). TensorFlow: `tf.function(jit_compile=True)`;
    JAX: `jax.jit` over the model and sampler state (a stateless call, so the variables are
    inputs rather than constants); PyTorch: the eager function under `torch.no_grad()`.
    Shapes that were seen before reuse the compiled program.
    """
    name = _backend()
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, reduce_retracing=True)
    if name == "jax":
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
    if name == "torch":
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
    its cache: `keras_xf.ops.cache.update_cache` writes in place while a trace records it)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarning: shapes are fixed per trace
        return torch.jit.trace(function, example_inputs, check_trace=False, strict=False)


def trace_step(model, function):
    """Returns `function(*tensors)` for the decoding loop's step: on PyTorch a TorchScript
    trace per input shapes, elsewhere `function` itself (the whole loop is compiled by XLA).

    Why not `keras.ops`: PyTorch runs the loop eagerly, one Python iteration per token, so
    every Keras layer call of every step costs Python time that dwarfs the arithmetic of a
    small model, and only `torch.jit.trace` records the step's tensor operations once and
    replays them without the Python. The model's variables are inputs of the trace (a
    stateless call), so the trace always reads the current weights. `function` must not
    branch in Python on tensor values, which holds for keras_xf layers.
    """
    if _backend() != "torch":
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
    """Whether `traced_sampler` traces the sampler's loop body: on PyTorch only, and only for
    greedy search, whose body is deterministic tensor arithmetic (random samplers draw seeds
    in Python, which a trace would freeze)."""
    import keras_hub

    return _backend() == "torch" and type(sampler) is keras_hub.samplers.GreedySampler


def traced_sampler(model, sampler):
    """A copy of a keras-hub `sampler` whose loop body (the model's cached step, the choice
    of the next token and the update of the prompt) is one TorchScript trace per input
    shapes, replayed by a plain Python loop; `sampler` itself where `traces_whole_loop_body`
    says no. Why not `keras.ops`: see `trace_step`.
    """
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
