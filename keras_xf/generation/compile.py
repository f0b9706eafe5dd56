"""Compiling a whole decoding loop once per shape: XLA on TensorFlow and JAX, eager on PyTorch.

`keras.ops` has no portable "compile this function" call; the backend-specific bodies live in
`keras_xf.ops.backend_specific`, and this module keeps the names generation uses. The loop
body itself is written with `keras.ops` (including `keras.ops.while_loop`).
"""

from keras_xf.ops import backend_specific


def compile_generate_function(model, function, sampler):
    """Returns `f(*tensors)` running `function(*tensors)` compiled for the backend
    (`backend_specific.compile_function`): `tf.function(jit_compile=True)` on TensorFlow,
    `jax.jit` over the model and sampler state on JAX, the eager function under
    `torch.no_grad()` on PyTorch. Shapes that were seen before reuse the compiled program."""
    return backend_specific.compile_function(model, function, sampler)


def trace_decoding_step(model, function):
    """Returns `function(*tensors)` for the decoding loop's step: on PyTorch a TorchScript
    trace per input shapes, elsewhere `function` itself (`backend_specific.trace_step`)."""
    return backend_specific.trace_step(model, function)


def traces_whole_loop_body(sampler):
    """Whether `traced_run_loop` traces the sampler's loop body (PyTorch, greedy search)."""
    return backend_specific.traces_whole_loop_body(sampler)


def traced_run_loop(model, sampler):
    """A copy of `sampler` whose loop body is one TorchScript trace per input shapes on
    PyTorch, or `sampler` itself where `traces_whole_loop_body` says no
    (`backend_specific.traced_sampler`)."""
    return backend_specific.traced_sampler(model, sampler)


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


class GenerationVariables:
    """The variables that a decoding loop reads: a model's and those of layers that run in
    the loop beside it (a stop classifier). Stands for the model where the compiled loop
    takes its state (`compile_generate_function`, `traced_run_loop`, keras-hub's `run_loop`
    on JAX), so that those layers' weights are inputs of the compiled program, read anew at
    every call, rather than constants captured when it was traced."""

    def __init__(self, model, *layers):
        self._owners = (model, *layers)

    @property
    def variables(self):
        return [v for owner in self._owners for v in owner.variables]

    @property
    def trainable_variables(self):
        return [v for owner in self._owners for v in owner.trainable_variables]

    @property
    def non_trainable_variables(self):
        return [v for owner in self._owners for v in owner.non_trainable_variables]
