"""Compiling a whole decoding loop once per shape: XLA on TensorFlow and JAX, eager on PyTorch.

The loop body itself is written with `keras.ops` (including `keras.ops.while_loop`); what
`keras.ops` cannot express is the "compile this function" call, which talks to each backend
here, beside the loop it serves (keras-hub's generation does the same).
"""

import keras


def compile_generate_function(model, function, sampler):
    """Returns `f(*tensors)` running `function(*tensors)` compiled for the backend.

    Why not `keras.ops`: it has no portable "compile this function" call. TensorFlow:
    `tf.function(jit_compile=True)`; JAX: `jax.jit` over the model and sampler state (a
    stateless call, so the variables are inputs rather than constants); PyTorch: the eager
    function under `torch.no_grad()` (the loop's step is traced instead, see
    `keras_xf.generation.traced_loop`). Shapes that were seen before reuse the compiled
    program. `model` is what the loop reads variables from (a model, or
    `GenerationVariables`).
    """
    name = keras.config.backend()
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(function, jit_compile=True, reduce_retracing=True, autograph=False)
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


class CompiledFunctions:
    """A cache of compiled generation functions, keyed by their settings (sampler, stop ids,
    cache flag, prefill length, ...), and a count of the programs they compiled.

    A plain object rather than a dict: TensorFlow tracks dict attributes of a layer and would
    try to save the compiled functions into a SavedModel.
    """

    def __init__(self):
        self._functions = {}
        self._programs = set()
        # The samplers that names and `SamplerSpec`s resolved to, one object per key, so that
        # a compiled loop and `generate(seed=...)` reach the same seed generators.
        self.samplers = {}
        self.decode_step = None  # the loop body, traced on PyTorch (`trace_decoding_step`)

    def count_program(self, key, arrays):
        """Records that the function under `key` ran on inputs of the shapes of `arrays`:
        one compiled program per distinct pair (XLA on TensorFlow and JAX, TorchScript traces
        of the step on PyTorch, each keyed by input shapes)."""
        self._programs.add((key, tuple(tuple(a.shape) for a in arrays)))

    @property
    def program_count(self):
        """How many (function, input shapes) pairs have run: the programs compiled."""
        return len(self._programs)

    def __contains__(self, key):
        return key in self._functions

    def __getitem__(self, key):
        return self._functions[key]

    def __setitem__(self, key, function):
        self._functions[key] = function

    def __len__(self):
        return len(self._functions)
