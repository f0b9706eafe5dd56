"""The variables that a compiled decoding loop reads."""


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
