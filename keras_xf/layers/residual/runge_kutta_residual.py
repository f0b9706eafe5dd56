"""A residual sub-layer that takes a Runge–Kutta step of `dz/dl = f(z)` (survey §4.3)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import first_positions
from keras_xf.layers.block_contract import join_results
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.layers.residual.residual import validate_normalization
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_output_length
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rank

# Butcher tableaux `(β, γ)`: stage `i` evaluates `f` at `z + Σ_j β[i][j] g_j`, the step adds
# `Σ_i γ[i] g_i`. "euler" is the plain residual; "rk2" is Heun's method (the RK2 of the
# ODE Transformer, Li et al. 2022); "rk2_midpoint" the midpoint method; "rk4" the survey's.
TABLEAUX = {
    "euler": (((),), (1.0,)),
    "rk2": (((), (1.0,)), (0.5, 0.5)),
    "rk2_midpoint": (((), (0.5,)), (0.0, 1.0)),
    "rk4": (((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6)),
}
STAGE_NORMS = ("input", "output")


@keras.saving.register_keras_serializable(package="keras_xf")
class RungeKuttaResidual(PassesMixerArguments, keras.layers.Layer):
    """One explicit Runge–Kutta step of `dz/dl = f(z)` as a residual sub-layer (survey §4.3):

        z(l) = z(l−1) + Σ_i γ_i · g_i,
        g_i  = h · f(z(l−1) + Σ_{j<i} β_{i,j} · g_j),

    e.g. RK4: `g_1 = h f(z)`, `g_2 = h f(z + g_1/2)`, `g_3 = h f(z + g_2/2)`,
    `g_4 = h f(z + g_3)`, `z(l) = z + (g_1 + 2g_2 + 2g_3 + g_4)/6`. `f` is the sub-layer
    `F` with a normalisation: `f(z) = F(LNorm(z))` (`stage_norm="input"`, the pre-norm
    sub-layer `Residual` builds) or `f(z) = LNorm(F(z))` (`stage_norm="output"`, the `f` of
    the survey's Figure). With `share_weights=True` every stage uses the same `f` (the
    survey's simplification, Eq. for `g_i` without `i` in `f`: no parameters beyond the
    plain residual); with `False` stage `i` has its own copy `f_i` (own weights, own
    norm). `method="euler"` is the plain pre-norm residual `z + h f(z)`.

    The residual path `z` is never normalised (as in a pre-norm stack, which ends with a
    normalisation: `TransformerStack` adds it for `RungeKuttaBlock`).

    Caches: a cached decoder evaluates `f` once per stage at each new position, at that
    stage's own input `z + Σ β g`. A sub-layer whose outputs depend on earlier positions
    (attention, a state-space or convolutional mixer) therefore needs one cache per stage,
    holding the keys/values (or states) of that stage's inputs, which differ from stage to
    stage even when the weights are shared: the cache is a tuple with one entry per stage,
    `init_cache` builds it. Causality is kept: stage `i`'s input at position `t` depends on
    positions `≤ t` only, so the cached steps equal the full pass.

    Args:
        layer: the sub-layer `F` (width-preserving), or its serialised config.
        method: `"rk2"` (Heun: `z + (g_1 + g_2)/2`, `g_2 = h f(z + g_1)`), `"rk2_midpoint"`
            (`z + g_2`, `g_2 = h f(z + g_1/2)`), `"rk4"` or `"euler"`.
        share_weights: bool, one `f` for all stages (survey) or one copy per stage.
        learned_coefficients: bool; `True` makes the `γ_i` trainable weights, initialised
            to the method's values.
        stage_norm: `"input"` (`f = F∘LNorm`) or `"output"` (`f = LNorm∘F`).
        step_size: float `h > 0`.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"` (see `Residual`).
        dropout: float in [0, 1), applied to the increment `Σ_i γ_i g_i`.
        epsilon: float, the normalisation epsilon.
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `Residual` (`inputs`, `context`, masks, `cache`, `cache_index`, `training`,
        mixer-specific `**kwargs`, each passed to every stage's `F`); `cache` is a tuple with
        one cache per stage. `output_length`: the first `n` positions of the full result
        (every stage needs all positions).

    Returns:
        As `F` under the block contract, with its outputs replaced by `z(l)`: `[B, T, d]`,
        `(outputs, new_cache)` (one cache per stage), or a dict whose entries other than
        `"outputs"`/`"cache"` (e.g. `"attention_scores"`) are those of the first stage,
        `f(z(l−1))`.

    Example:
    >>> block = RungeKuttaResidual(FeedForward(64), method="rk4")
    >>> y = block(keras.random.normal((2, 5, 16)))
    """

    def __init__(
        self,
        layer,
        method="rk2",
        share_weights=True,
        learned_coefficients=False,
        stage_norm="input",
        step_size=1.0,
        normalization="layer_norm",
        dropout=0.0,
        epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if method not in TABLEAUX:
            raise ValueError(
                f"method must be one of {tuple(TABLEAUX)}. Received: method={method!r}")
        if stage_norm not in STAGE_NORMS:
            raise ValueError(
                f"stage_norm must be one of {STAGE_NORMS}. Received: stage_norm={stage_norm!r}")
        check_bool("share_weights", share_weights)
        check_bool("learned_coefficients", learned_coefficients)
        check_positive_number("step_size", step_size)
        validate_normalization(normalization, "pre", dropout, epsilon)
        self.method = method
        self.share_weights = share_weights
        self.learned_coefficients = learned_coefficients
        self.stage_norm = stage_norm
        self.step_size = float(step_size)
        self.normalization = normalization
        self.dropout = dropout
        self.epsilon = epsilon
        self.betas, self.gammas = TABLEAUX[method]
        self.layer = as_layer(layer, "layer")
        stages = 1 if share_weights else len(self.gammas)
        # Stage copies start from the same config with fresh weights.
        self.stage_layers = [self.layer] + [
            clone_layer(self.layer, name=f"{self.layer.name}_stage_{i}") for i in range(1, stages)
        ]
        self.norms = [
            make_normalization(normalization, epsilon, self.dtype_policy,
                               "norm" if i == 0 else f"norm_stage_{i}")
            for i in range(stages)
        ]
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    @property
    def num_stages(self):
        """The number of evaluations of `f` per step."""
        return len(self.gammas)

    def _stage(self, index):
        """`(F_i, LNorm_i)` of stage `index`."""
        index = 0 if self.share_weights else index
        return self.stage_layers[index], self.norms[index]

    def build(self, inputs_shape, context_shape=None):
        for norm in self.norms:
            norm.build(inputs_shape)
        for layer in self.stage_layers:
            if layer.built:
                continue
            if context_shape is None:
                layer.build(inputs_shape)
            else:
                layer.build(inputs_shape, context_shape)
        if self.learned_coefficients:
            self.coefficients = self.add_weight(
                shape=(self.num_stages,),
                initializer=keras.initializers.Constant(list(self.gammas)),
                name="coefficients",
            )

    def init_cache(self, batch_size, max_length, dtype=None):
        """A tuple with one cache of `F` per stage (see the class docstring)."""
        return tuple(self._stage(i)[0].init_cache(batch_size, max_length, dtype)
                     for i in range(self.num_stages))

    def call(
        self,
        inputs,
        context=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        training=None,
        mixer_options=None,
        output_length=None,
        **kwargs,
    ):
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        check_output_length(output_length, inputs)
        if cache is not None and len(cache) != self.num_stages:
            raise ValueError(
                f"cache must hold one entry per stage ({self.num_stages}, method="
                f"{self.method!r}). Received: {len(cache)} entries")
        args = () if context is None else (context,)
        named = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "use_causal_mask": use_causal_mask,
            "cache_index": cache_index,
        }
        named = {key: value for key, value in named.items() if value is not None}
        extra = mixer_arguments(kwargs, mixer_options)
        increments, new_caches, first_extras = [], [], None
        for index in range(self.num_stages):
            layer, norm = self._stage(index)
            stage_input = inputs
            for beta, increment in zip(self.betas[index], increments):
                if beta:
                    stage_input = stage_input + beta * increment
            hidden = norm(stage_input) if self.stage_norm == "input" else stage_input
            stage_cache = {} if cache is None else {"cache": cache[index]}
            results = layer(hidden, *args, training=training, **named, **stage_cache, **extra)
            outputs, new_cache, extras = split_results(results, cache is not None)
            if self.stage_norm == "output":
                outputs = norm(outputs)
            increments.append(self.step_size * outputs if self.step_size != 1.0 else outputs)
            new_caches.append(new_cache)
            if index == 0:
                first_extras = extras
        outputs = self.dropout_layer(self._combine(increments), training=training) + inputs
        if output_length is not None:
            outputs = outputs[:, :output_length]
        new_cache = tuple(new_caches) if cache is not None else None
        return join_results(outputs, new_cache, first_extras, cache is not None)

    def _combine(self, increments):
        """`Σ_i γ_i g_i`, with learned `γ` when `learned_coefficients`."""
        if self.learned_coefficients:
            gammas = ops.cast(self.coefficients, increments[0].dtype)
            return sum(gammas[i] * g for i, g in enumerate(increments))
        terms = [gamma * g for gamma, g in zip(self.gammas, increments) if gamma]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def compute_output_shape(self, inputs_shape, context_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, context=None, cache=None, mixer_options=None,
                            output_length=None, **kwargs):
        outputs = keras.KerasTensor(first_positions(inputs.shape, output_length),
                                    dtype=self.compute_dtype)
        extra = mixer_arguments(kwargs, mixer_options)
        if not extra:
            return join_results(outputs, new_specs(cache), None, cache is not None)
        args = () if context is None else (context,)
        if cache is not None:
            extra["cache"] = cache[0]
        layer_spec = self.layer.compute_output_spec(inputs, *args, **extra)
        extras = split_results(layer_spec, cache is not None)[2]
        return join_results(outputs, new_specs(cache), extras, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "layer": keras.saving.serialize_keras_object(self.layer),
                "method": self.method,
                "share_weights": self.share_weights,
                "learned_coefficients": self.learned_coefficients,
                "stage_norm": self.stage_norm,
                "step_size": self.step_size,
                "normalization": self.normalization,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
            }
        )
        return config
