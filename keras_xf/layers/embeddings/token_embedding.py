"""Token embedding with an optional √d scale and a tied reverse projection (survey §2.1, §5.4)."""

import math
import warnings

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.lora.adapters import LoRAAdapters
from keras_xf.layers.quantized_saving import QuantizedVariableSaving
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer


_FEW_ROWS = 64  # below this many rows the output projection multiplies the table first
# int8: symmetric [-127, 127]; int4: Keras' packed int4 range [-8, 7].
_VALUE_RANGES = {"int8": (-127, 127), "int4": (-8, 7)}


@keras.saving.register_keras_serializable(package="keras_xf")
class TokenEmbedding(LoRAAdapters, QuantizedVariableSaving, keras.layers.Layer):
    """Looks up token vectors `x_j = E[token_j]`, and projects back to vocabulary logits.

    The forward call returns `E[ids] · (√d if scale else 1)`. Called with `reverse=True` on
    hidden states `h` it returns logits `h · Eᵀ` (tied input/output embeddings, survey §5.4),
    or `h · W_out` with a separate output matrix when `tie_weights=False`.

    `quantize("int8")` (or `model.quantize("int8")`) stores `q = round(E · s)` in int8 with
    one scale `s_v = 127 / max|E_v|` per token `v`: the lookup returns `q[ids] / s[ids]`, the
    tied projection `(h · qᵀ) / s` (the same int8 table and scales), and an untied `W_out` is
    quantised column by column the same way. `quantize("int4")` does the same with
    `s_v = 7 / max|E_v|` and values in `[-8, 7]` packed two per byte along `d`, one scale
    per token whatever the configuration's block size (a scale per block of `d` would not
    factor out of the tied projection's sum over `d`). `float8` leaves the layer as it
    is with a warning, as `Model.quantize` does for Keras' `Embedding` (Keras has no float8
    embedding lookup).

    LoRA on the output head (Hu et al. 2021; `enable_lora(rank, lora_alpha)`, untied only):
    the logits become `h (W_out + (α/r)·A·B)` with `A [d, r]` random, `B [r, V]` zero and
    `W_out` frozen (float adapters over a quantised `W_out`); `reverse_kernel` is that merged
    matrix. The lookup table is left alone.

    Args:
        vocabulary_size: int, number of tokens.
        embedding_dim: int, width `d`.
        tie_weights: bool, reuse the embedding matrix for the reverse projection.
        scale: bool, multiply embeddings by `√d` as in the original Transformer (and Gemma);
            `√d` is cast to the compute dtype first.
        embeddings_initializer: initializer for the matrix.
        **kwargs: base `Layer` arguments (`name`, `dtype`, …).

    Call arguments:
        inputs: int tensor `[B, T]`, or float `[B, T, d]` when `reverse=True`.
        reverse: bool.

    Returns:
        `[B, T, d]` embeddings, or `[B, T, vocabulary_size]` logits when `reverse=True`.

    Example:
    >>> emb = TokenEmbedding(100, 16)
    >>> logits = emb(emb(np.array([[1, 2, 3]])), reverse=True)  # (1, 3, 100)
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        tie_weights=True,
        scale=False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        vocabulary_size = check_positive_int("vocabulary_size", vocabulary_size)
        embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.tie_weights = tie_weights
        self.scale = scale
        self.embeddings_initializer = get_initializer(
            "embeddings_initializer", embeddings_initializer
        )

    def build(self, inputs_shape=None):
        if self.quantization_mode is not None:
            # A quantised layer being rebuilt (loading a `.keras` file): integer state only.
            self.quantized_build(inputs_shape, mode=self.quantization_mode)
            return
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.embedding_dim),
            initializer=self.embeddings_initializer,
        )
        if not self.tie_weights:
            self.reverse_embeddings = self.add_weight(
                name="reverse_embeddings",
                shape=(self.embedding_dim, self.vocabulary_size),
                initializer=clone_initializer(self.embeddings_initializer),
            )

    def call(self, inputs, reverse=False):
        return self._embed_or_project(inputs, reverse, quantized=False)

    def _int8_call(self, inputs, reverse=False):
        return self._embed_or_project(inputs, reverse, quantized=True)

    def _int4_call(self, inputs, reverse=False):
        return self._embed_or_project(inputs, reverse, quantized=True)

    def _unpacked(self, values, name):
        """The values of the table `name` as stored, or its int4 values unpacked to int8
        (packed along `d`)."""
        if self.quantization_mode != "int4":
            return values
        axis = 1 if name == "embeddings" else 0
        return keras.quantizers.unpack_int4(values, self.embedding_dim, axis=axis)

    def _table(self, name):
        """A table as stored, or its int4 values unpacked to int8 (packed along `d`)."""
        return self._unpacked(getattr(self, name), name)

    def _product(self, inputs, table, tied):
        """`h · Eᵀ` (tied: `table` is the `[V, d]` token table) or `h · W_out` (`[d, V]`)."""
        if not tied:
            return ops.matmul(inputs, table)
        # Only for concrete sizes: symbolic ones (shape-polymorphic export, torch.export)
        # would turn the comparison into a guard on the exported input shapes.
        leading = tuple(inputs.shape[:-1])
        rows = math.prod(leading) if all(type(d) is int for d in leading) else None
        if rows is not None and rows <= _FEW_ROWS:
            # A few rows (a decoding step): `table · hᵀ` reads the table in its own
            # layout, where `h · tableᵀ` makes XLA copy the whole table transposed.
            flat = ops.reshape(inputs, (rows, inputs.shape[-1]))
            logits = ops.transpose(ops.matmul(table, ops.transpose(flat)))
            return ops.reshape(logits, leading + (self.vocabulary_size,))
        return ops.matmul(inputs, ops.transpose(table))

    def _quantized_logits(self, inputs, name):
        """`(h · q) / s` of the quantised table `name` (`q / s ≈` the float table). Its
        gradient, to `h` only, dequantises `q` again in the backward pass: automatic
        differentiation would keep the float copy of the forward pass (`[V, d]`, as large as
        the float layer's table) alive until the backward pass, the cost that quantising a
        frozen head for LoRA training is meant to save. Keras' quantised `Dense` and
        `EinsumDense` do the same. A compiled graph may still compute the backward's copy
        early, since it depends on the table alone (XLA on a CPU does)."""
        tied = name == "embeddings"

        @ops.custom_gradient
        def project(inputs, values, scale):
            def grad_fn(*args, upstream=None):
                if upstream is None:
                    (upstream,) = args
                table = ops.cast(self._unpacked(values, name), upstream.dtype)
                upstream = ops.divide(upstream, ops.cast(scale, upstream.dtype))
                gradient = ops.matmul(upstream, table if tied else ops.transpose(table))
                return gradient, None, None

            table = ops.cast(self._unpacked(values, name), self.compute_dtype)
            logits = self._product(inputs, table, tied)
            return ops.divide(logits, ops.cast(scale, logits.dtype)), grad_fn

        return project(inputs, ops.convert_to_tensor(getattr(self, name)),
                       ops.convert_to_tensor(getattr(self, f"{name}_scale")))

    def _embed_or_project(self, inputs, reverse, quantized):
        """Float and int8 paths; int8 tables hold `q = round(E · s)` with one scale `s` per
        vocabulary entry, so `E ≈ q / s` row by row (lookup) and column by column (logits).
        The quantised logits are the float hidden states times the integer table, then the
        per-token scale: the dequantised table's logits (only weight rounding, no input
        rounding)."""
        if reverse:
            check_width(inputs, self.embedding_dim)
            name = "embeddings" if self.tie_weights else "reverse_embeddings"
            if quantized:
                logits = self._quantized_logits(inputs, name)
            else:
                logits = self._product(inputs, ops.cast(getattr(self, name), self.compute_dtype),
                                       self.tie_weights)
            return logits if self.tie_weights else self._add_lora(inputs, logits)
        ids = ops.cast(inputs, "int32")
        outputs = ops.cast(ops.take(self._table("embeddings"), ids, axis=0), self.compute_dtype)
        if quantized:
            # From a `[V, 1]` table: Keras' 1-D `take` on PyTorch adds a Squeeze ONNX rejects.
            scale = ops.take(ops.expand_dims(self.embeddings_scale, -1), ids, axis=0)
            outputs = ops.divide(outputs, ops.cast(scale, outputs.dtype))
        if self.scale:
            outputs = outputs * ops.cast(self.embedding_dim**0.5, outputs.dtype)
        return outputs

    # LoRA on the untied output projection ------------------------------------------------

    def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform",
                    b_initializer="zeros"):
        """Adds adapters `A [d, r]`, `B [r, V]` to the untied output projection and freezes
        `W_out` (Keras' `Dense.enable_lora` protocol); a `ValueError` for a bad `rank` or
        `lora_alpha`, a tied layer (its output projection is the lookup table), an unbuilt
        layer, or adapters that exist already."""
        rank, lora_alpha = self._check_lora_settings(rank, lora_alpha)
        if self.tie_weights:
            raise ValueError(f"LoRA on the output projection of '{self.name}' needs untied "
                             "weights: a tied projection is the token table. Received: "
                             "tie_weights=True")
        self._add_lora_adapters(rank, lora_alpha, (self.embedding_dim, rank),
                                (rank, self.vocabulary_size), a_initializer, b_initializer,
                                frozen=self.reverse_embeddings)

    @property
    def lora_enabled(self):
        """Whether the adapters exist (`lora_adapters_enabled`), under Keras' `Dense` name."""
        return self.lora_adapters_enabled

    def _add_lora(self, inputs, logits):
        if not self.lora_enabled:
            return logits
        a = ops.cast(self.lora_kernel_a, inputs.dtype)
        b = ops.cast(self.lora_kernel_b, inputs.dtype)
        update = ops.matmul(ops.matmul(inputs, a), b) * self._lora_scale()
        return logits + ops.cast(update, logits.dtype)

    def _dequantized(self, name):
        """The table `name` in float32: the variable, or `q / s` of a quantised one (one
        scale per token: rows of `E`, columns of `W_out`)."""
        table = ops.cast(self._table(name), "float32")
        if self.quantization_mode is None:
            return table
        scale = ops.cast(getattr(self, f"{name}_scale"), "float32")
        return table / (scale[:, None] if name == "embeddings" else scale[None, :])

    @property
    def reverse_kernel(self):
        """The untied output matrix `[d, V]` the logits use: the `reverse_embeddings`
        variable, or with LoRA the tensor `W_out + (α/r)·A·B` (of a quantised `W_out`,
        `q / s`)."""
        if not self.lora_enabled:
            return self.reverse_embeddings
        delta = ops.matmul(self.lora_kernel_a, self.lora_kernel_b)
        return self._dequantized("reverse_embeddings") + delta * self._lora_scale()

    def output_table(self):
        """The `[V, d]` table `E` in the compute dtype whose product `h · Eᵀ` gives the
        logits of `reverse=True`: the token table (tied) or `W_outᵀ` with its LoRA update,
        dequantised (`q / s`) when the layer is quantised."""
        if self.tie_weights:
            table = self._dequantized("embeddings")
        elif self.lora_enabled:
            table = ops.transpose(self.reverse_kernel)
        else:
            table = ops.transpose(self._dequantized("reverse_embeddings"))
        return ops.cast(table, self.compute_dtype)

    def quantize(self, mode=None, type_check=True, config=None):
        """Quantises the table(s) in place to int8 or int4 (`model.quantize(mode)`), as Keras'
        `Embedding` and `ReversibleEmbedding` do per channel: symmetric abs-max, one scale per
        vocabulary entry (rows of `E`, columns of the untied `W_out`)."""
        if type_check and type(self) is not TokenEmbedding:
            raise self._not_implemented_error(self.quantize)
        if mode not in _VALUE_RANGES:  # left as it is, with the warning `Model.quantize` gives
            warnings.warn(str(self._quantization_mode_error(mode)))
            return

        def quantized(table, axis):  # `axis`: the axis of `d`, reduced by the abs-max
            default = keras.quantizers.AbsMaxQuantizer(
                axis=axis, value_range=_VALUE_RANGES[mode], output_dtype="int8")
            quantizer = keras.quantizers.QuantizationConfig.weight_quantizer_or_default(
                config, default)
            values, scale = quantizer(table, to_numpy=True)
            if mode == "int4":  # two values per byte, along `d` (the reduced axis)
                values, _, _ = keras.quantizers.pack_int4(values, axis=axis)
            return values, ops.squeeze(scale, axis=axis)

        values, scale = quantized(self.embeddings, 1)
        del self.embeddings
        if not self.tie_weights:
            reverse_values, reverse_scale = quantized(self.reverse_embeddings, 0)
            del self.reverse_embeddings
        self.quantized_build(None, mode, config)
        self.embeddings.assign(values)
        self.embeddings_scale.assign(scale)
        if not self.tie_weights:
            self.reverse_embeddings.assign(reverse_values)
            self.reverse_embeddings_scale.assign(reverse_scale)
        if self.dtype_policy.quantization_mode is None:
            name = "int4/-1" if mode == "int4" else mode  # -1: per channel
            self.dtype_policy = keras.dtype_policies.get(f"{name}_from_{self.dtype_policy.name}")

    def quantized_build(self, inputs_shape, mode, config=None):
        if mode not in _VALUE_RANGES:
            raise self._quantization_mode_error(mode)
        width = self.embedding_dim if mode == "int8" else (self.embedding_dim + 1) // 2
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocabulary_size, width),
            initializer="zeros", dtype="int8", trainable=False,
        )
        self.embeddings_scale = self.add_weight(
            name="embeddings_scale", shape=(self.vocabulary_size,), initializer="ones",
            trainable=False,
        )
        if not self.tie_weights:
            self.reverse_embeddings = self.add_weight(
                name="reverse_embeddings", shape=(width, self.vocabulary_size),
                initializer="zeros", dtype="int8", trainable=False,
            )
            self.reverse_embeddings_scale = self.add_weight(
                name="reverse_embeddings_scale", shape=(self.vocabulary_size,),
                initializer="ones", trainable=False,
            )
        self._is_quantized = True

    @property
    def variable_serialization_spec(self):
        """Variable names in saving order per quantisation mode (Keras' `Embedding` /
        `ReversibleEmbedding` layout: table, its scale, then the untied matrix and scale)."""
        quantized = ["embeddings", "embeddings_scale"]
        if not self.tie_weights:
            quantized += ["reverse_embeddings", "reverse_embeddings_scale"]
        plain = ["embeddings"] + ([] if self.tie_weights else ["reverse_embeddings"])
        # The output head's adapters last, unmerged: a `.keras` file keeps them trainable.
        lora = ["lora_kernel_a", "lora_kernel_b"] if self.lora_enabled else []
        return {None: plain + lora, "int8": quantized + lora, "int4": quantized + lora}

    def _quantization_mode_error(self, mode):
        return ValueError(
            "TokenEmbedding supports quantization modes 'int8' and 'int4'. "
            f"Received: mode={mode}"
        )

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)
        return tuple(inputs_shape) + (self.embedding_dim,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "tie_weights": self.tie_weights,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
