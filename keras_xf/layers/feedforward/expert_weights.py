"""Stacked per-expert projections of a mixture of experts, quantisable (survey §4.4, §5.9)."""

import warnings

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.lora.adapters import LoRAAdapters
from keras_xf.layers.quantized_saving import QuantizedVariableSaving
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_rank
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.moe import grouped_matmul

SLICES = (None, "columns", "rows")
# int8: symmetric [-127, 127]; int4: Keras' packed int4 range [-8, 7].
_VALUE_RANGES = {"int8": (-127, 127), "int4": (-8, 7)}


def _stacked_initializer(initializer, slices):
    """Initialises `[E, a, b]` as `E` independent `[a, b]` matrices (fans of one expert), or
    as one `[a, E·b]` matrix (`slices="columns"`) or `[E·a, b]` (`"rows"`) cut into slices, so
    that a sliced feedforward starts like the dense one it splits."""

    def initialize(shape, dtype=None):
        experts, rows, cols = shape
        if slices == "columns":
            full = clone_initializer(initializer)((rows, experts * cols), dtype=dtype)
            return ops.transpose(ops.reshape(full, (rows, experts, cols)), (1, 0, 2))
        if slices == "rows":
            return ops.reshape(clone_initializer(initializer)((experts * rows, cols),
                                                              dtype=dtype), shape)
        return ops.stack([clone_initializer(initializer)((rows, cols), dtype=dtype)
                          for _ in range(experts)])

    return initialize


@keras.saving.register_keras_serializable(package="keras_xf")
class ExpertWeights(LoRAAdapters, QuantizedVariableSaving, keras.layers.Layer):
    """`y_g = x_g W^{e(g)} + b^{e(g)}`: one projection per expert, applied group by group.

    Survey §4.4 (mixture of experts): each expert `e` has its own matrix `W^e ∈ R^{D×F}`;
    the `E` matrices are one stacked kernel `[E, D, F]` (bias `[E, F]`). Called on rows
    grouped by expert, `[G, R, D]`, group `g` is multiplied by `W^g` (`G = E`), or by
    `W^{expert_index[g]}` when `expert_index [G]` is given (blocks of rows gathered per
    expert, as dropless dispatch does).

    Quantisation (survey §5.9; `quantize(mode)` or `model.quantize(mode)`): the kernel is
    stored as `q = round(W · s)` with one scale per expert and output column,
    `s_{e,f} = r / max_d |W^e_{d,f}|` (`r = 127` for `int8`, `7` for `int4`, packed two per
    byte along `F`). `int8` also rounds each input row to int8 with its own scale `t_r`
    (the activation quantiser of the configuration, as Keras' `Dense` does): the product runs
    in int8 with int32 accumulation and `y = (q_x · q) / (t_r · s)`. `int4` keeps the inputs
    as they are (weight-only, as Keras' default `int4`): `y = (x · q) / s`. Sub-channel
    `int4` blocks are not used: the kernel is always per channel. `float8` is not offered:
    `Model.quantize` warns and leaves the experts in float32 (Keras' float8 scheme keeps one
    delayed scale per whole kernel and one per input tensor, not per expert).

    LoRA (Hu et al. 2021; `enable_lora(rank, lora_alpha)`, as Keras' `Dense`): each expert
    gets its own adapters, `W^e + (α/r)·A^e·B^e` with `A [E, D, r]` random (He uniform),
    `B [E, r, F]` zero, and the kernel frozen; the adapters stay float over a quantised
    kernel. `kernel` is the merged `[E, D, F]` kernel (the variable itself without LoRA).

    Args:
        num_experts: int, `E`.
        units: int, the output width `F`.
        use_bias: bool, a bias per expert.
        kernel_initializer: initializer of each expert's `[D, F]` matrix.
        bias_initializer: initializer of the biases.
        init_slices: `None` (each expert initialised on its own), `"columns"` (the experts
            are column slices of one `[D, E·F]` matrix) or `"rows"` (row slices of one
            `[E·D, F]` matrix): the slice form of §4.4.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[G, R, D]`, rows grouped by expert.
        expert_index: optional int `[G]`, the expert of each group (default: group `g` is
            expert `g`, and `G` must equal `E`).

    Returns:
        `[G, R, F]`.

    Example:
    >>> experts = ExpertWeights(num_experts=4, units=8)
    >>> experts(keras.random.normal((4, 3, 16))).shape  # (4, 3, 8)
    """

    def __init__(
        self,
        num_experts,
        units,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        init_slices=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.units = check_positive_int("units", units)
        if not isinstance(use_bias, bool):
            raise ValueError(f"use_bias must be a bool. Received: use_bias={use_bias!r}")
        if init_slices not in SLICES:
            raise ValueError(
                f"init_slices must be one of {SLICES}. Received: init_slices={init_slices!r}")
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.init_slices = init_slices
        self.input_dim = None

    def build(self, inputs_shape, expert_index_shape=None):
        self.input_dim = inputs_shape[-1]
        if self.input_dim is None:
            raise ValueError(
                f"ExpertWeights needs a known last dimension. Received: "
                f"inputs_shape={tuple(inputs_shape)}"
            )
        kernel_shape = (self.num_experts, self.input_dim, self.units)
        if self.quantization_mode is not None:
            # A quantised layer being rebuilt (loading a `.keras` file).
            self.quantized_build(kernel_shape, self.quantization_mode)
        else:
            self.expert_kernel = self.add_weight(
                name="expert_kernel", shape=kernel_shape,
                initializer=_stacked_initializer(self.kernel_initializer, self.init_slices),
            )
        self.expert_bias = None
        if self.use_bias:
            self.expert_bias = self.add_weight(
                name="expert_bias", shape=(self.num_experts, self.units),
                initializer=clone_initializer(self.bias_initializer),
            )

    def _check(self, inputs, expert_index):
        check_rank("inputs", inputs, 3, "[groups, rows, dim]")
        check_width(inputs, self.input_dim)
        groups = inputs.shape[0]
        if expert_index is None:
            if isinstance(groups, int) and groups != self.num_experts:
                raise ValueError(
                    "Without expert_index, inputs must hold one group per expert. Received: "
                    f"inputs.shape={tuple(inputs.shape)}, num_experts={self.num_experts}"
                )
            return
        check_rank("expert_index", expert_index, 1, "[groups]")
        if isinstance(groups, int) and expert_index.shape[0] not in (None, groups):
            raise ValueError(
                "expert_index must give one expert per group of inputs. Received: "
                f"expert_index.shape={tuple(expert_index.shape)}, "
                f"inputs.shape={tuple(inputs.shape)}"
            )

    def _per_group(self, variable, expert_index):
        return variable if expert_index is None else ops.take(variable, expert_index, axis=0)

    def _add_bias(self, outputs, expert_index):
        if self.expert_bias is None:
            return outputs
        bias = self._per_group(self.expert_bias, expert_index)
        return outputs + ops.cast(bias, outputs.dtype)[:, None, :]

    def call(self, inputs, expert_index=None):
        self._check(inputs, expert_index)
        outputs = grouped_matmul(inputs, self._per_group(self.expert_kernel, expert_index))
        return self._add_bias(self._add_lora(inputs, outputs, expert_index), expert_index)

    # LoRA -------------------------------------------------------------------------------

    def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform",
                    b_initializer="zeros"):
        """Adds per-expert adapters `A [E, D, r]`, `B [E, r, F]` and freezes the kernel: the
        experts compute `x (W^e + (α/r)·A^e·B^e)`, `α = lora_alpha` (`rank` when `None`).
        Keras' `Dense.enable_lora` protocol; raises a `ValueError` for a bad `rank` or
        `lora_alpha`, before the layer is built or when LoRA is already enabled."""
        rank, lora_alpha = self._check_lora_settings(rank, lora_alpha)
        self._add_lora_adapters(
            rank, lora_alpha, (self.num_experts, self.input_dim, rank),
            (self.num_experts, rank, self.units),
            _stacked_initializer(keras.initializers.get(a_initializer), None), b_initializer,
            frozen=self.expert_kernel)

    @property
    def lora_enabled(self):
        """Whether the adapters exist (`lora_adapters_enabled`), under Keras' `Dense` name."""
        return self.lora_adapters_enabled

    def _add_lora(self, inputs, outputs, expert_index):
        """`outputs + (α/r)·(x A^e) B^e` with LoRA enabled, else `outputs`."""
        if not self.lora_enabled:
            return outputs
        a = ops.cast(self._per_group(self.lora_kernel_a, expert_index), inputs.dtype)
        b = ops.cast(self._per_group(self.lora_kernel_b, expert_index), inputs.dtype)
        update = grouped_matmul(grouped_matmul(inputs, a), b)
        return outputs + ops.cast(update * self._lora_scale(), outputs.dtype)

    @property
    def kernel(self):
        """The `[E, D, F]` kernel the layer computes with: the `expert_kernel` variable, or
        with LoRA enabled the tensor `W + (α/r)·A·B` (of a quantised kernel, `q / s`)."""
        if not self.lora_enabled:
            return self.expert_kernel
        kernel = self.expert_kernel
        if self.quantization_mode is not None:
            kernel = (ops.cast(self._integer_kernel(), "float32")
                      / ops.convert_to_tensor(self.expert_kernel_scale)[:, None, :])
        delta = ops.matmul(self.lora_kernel_a, self.lora_kernel_b)
        return ops.cast(kernel, "float32") + delta * self._lora_scale()

    # Quantisation (Keras' protocol: `quantize`, `quantized_build`, `_<mode>_call`). ---------

    def _int8_call(self, inputs, expert_index=None, training=None):
        return self._quantized_call(inputs, expert_index)

    def _int4_call(self, inputs, expert_index=None, training=None):
        return self._quantized_call(inputs, expert_index)

    def _integer_kernel(self):
        """The int8 values `q [E, D, F]` (int4 unpacked from its two-per-byte storage)."""
        if self.quantization_mode == "int4":
            return keras.quantizers.unpack_int4(self.expert_kernel, self.units, axis=-1)
        return self.expert_kernel

    def _quantized_call(self, inputs, expert_index):
        self._check(inputs, expert_index)
        kernel = self._per_group(ops.convert_to_tensor(self._integer_kernel()), expert_index)
        scale = self._per_group(ops.convert_to_tensor(self.expert_kernel_scale), expert_index)
        quantizer = self.inputs_quantizer

        @ops.custom_gradient
        def matmul(inputs, kernel, scale):
            def grad_fn(*args, upstream=None):
                # The int kernel is frozen: the gradient reaches the inputs only, through the
                # dequantised kernel.
                if upstream is None:
                    (upstream,) = args
                float_kernel = ops.cast(kernel, "float32") / scale[:, None, :]
                grad = grouped_matmul(ops.cast(upstream, "float32"),
                                      ops.transpose(float_kernel, (0, 2, 1)))
                return ops.cast(grad, inputs.dtype), None, None

            # Rounding and rescaling in float32: a zero row's scale overflows float16.
            x = ops.cast(inputs, "float32")
            output_scale = scale[:, None, :]
            if quantizer is not None:
                x, inputs_scale = quantizer(x, axis=-1)
                output_scale = output_scale * inputs_scale
            else:
                kernel = ops.cast(kernel, "float32")
            outputs = ops.cast(grouped_matmul(x, kernel), "float32") / output_scale
            return ops.cast(outputs, self.compute_dtype), grad_fn

        outputs = self._add_lora(inputs, matmul(inputs, kernel, scale), expert_index)
        return self._add_bias(outputs, expert_index)

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantises the kernel in place: `q = round(W · s)`, one scale per expert and output
        column (`int8`, or `int4` packed along `F`); other modes leave the layer as it is with
        a warning, as `Model.quantize` reports a layer that has no such mode."""
        if type_check and type(self) is not ExpertWeights:
            raise self._not_implemented_error(self.quantize)
        if mode not in _VALUE_RANGES:  # left as it is, with the warning `Model.quantize` gives
            warnings.warn(str(self._quantization_mode_error(mode)))
            return
        kernel_shape = tuple(self.expert_kernel.shape)
        values, scale = keras.quantizers.abs_max_quantize(
            self.expert_kernel, axis=1, value_range=_VALUE_RANGES[mode], dtype="int8",
            to_numpy=True,
        )
        scale = ops.squeeze(scale, axis=1)
        if mode == "int4":
            values, _, _ = keras.quantizers.pack_int4(values, axis=-1)
        del self.expert_kernel
        self.quantized_build(kernel_shape, mode, config)
        self.expert_kernel.assign(values)
        self.expert_kernel_scale.assign(scale)
        if self.dtype_policy.quantization_mode is None:
            name = "int4/-1" if mode == "int4" else mode  # -1: per channel
            self.dtype_policy = keras.dtype_policies.get(f"{name}_from_{self.dtype_policy.name}")

    def quantized_build(self, kernel_shape, mode, config=None):
        if mode not in _VALUE_RANGES:
            raise self._quantization_mode_error(mode)
        default = keras.quantizers.AbsMaxQuantizer() if mode == "int8" else None
        self.inputs_quantizer = (
            keras.quantizers.QuantizationConfig.activation_quantizer_or_default(config, default))
        experts, rows, cols = kernel_shape
        stored = cols if mode == "int8" else (cols + 1) // 2
        self.expert_kernel = self.add_weight(
            name="expert_kernel", shape=(experts, rows, stored), initializer="zeros",
            dtype="int8", trainable=False,
        )
        self.expert_kernel_scale = self.add_weight(
            name="expert_kernel_scale", shape=(experts, cols), initializer="ones",
            trainable=False,
        )
        self._is_quantized = True

    @property
    def variable_serialization_spec(self):
        """Variable names in saving order per quantisation mode."""
        names = ["expert_kernel"] + (["expert_bias"] if self.use_bias else [])
        # The adapters last, unmerged: a `.keras` file keeps them trainable.
        lora = ["lora_kernel_a", "lora_kernel_b"] if self.lora_enabled else []
        return {None: names + lora, "int8": names + ["expert_kernel_scale"] + lora,
                "int4": names + ["expert_kernel_scale"] + lora}

    def _quantization_mode_error(self, mode):
        return ValueError(
            "ExpertWeights supports quantization modes 'int8' and 'int4' (per channel). "
            f"Received: mode={mode}"
        )

    def compute_output_shape(self, inputs_shape, expert_index_shape=None):
        return tuple(inputs_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "units": self.units,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "init_slices": self.init_slices,
            }
        )
        return config
