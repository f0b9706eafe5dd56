"""A stack of Transformer layers that runs its middle layers on a compressed sequence
(survey §5.8, "Sequence Compression")."""

import keras
from keras import ops

from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.cloning import as_layer
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.cloning import serialize_layer
from keras_xf.layers.compression.downsample import Downsample
from keras_xf.layers.compression.upsample import METHODS
from keras_xf.layers.compression.upsample import Upsample
from keras_xf.layers.residual.residual import FINAL_NORM_PLACEMENTS
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_padding_mask
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_sequence_width
from keras_xf.ops.masks import compressed_length


def _check_num_layers(num_layers):
    ok = isinstance(num_layers, (list, tuple)) and len(num_layers) == 3
    if ok:
        try:
            before, middle, after = (check_positive_int("num_layers", n, minimum=0)
                                     for n in num_layers)
        except ValueError:
            ok = False
        else:
            ok = middle >= 1
    if not ok:
        raise ValueError(
            "num_layers must be three ints (full-length layers before downsampling >= 0, "
            "compressed layers >= 1, full-length layers after upsampling >= 0). Received: "
            f"num_layers={num_layers!r}"
        )
    return [before, middle, after]


@keras.saving.register_keras_serializable(package="keras_xf")
class CompressedStack(keras.layers.Layer):
    """`L₁` layers at length `n`, `Downsample` to `n′ = ⌈n / s⌉`, `L₂` layers at `n′`,
    `Upsample` back to `n` (plus the states before downsampling), `L₃` layers at `n`.

    Survey §5.8: a strided convolution shortens the sequence so that the middle layers cost
    `O(n′²)` attention instead of `O(n²)` (Funnel-Transformer, Dai et al. 2020, with one
    compression step). With `H⁰` the input:
    `H¹ = Stack₁(H⁰)`, `(C, m′) = Downsample(H¹, m)`, `C′ = Stack₂(C, m′)`,
    `H² = Upsample(C′) + H¹` (without the `+ H¹` when `residual=False`), `H³ = Stack₃(H²)`,
    and for a pre-norm template a final norm. `m` is the padding mask, `m′` the compressed
    mask (a compressed position is real when any position of its window is); padded
    positions never reach real outputs. Each of the three stacks is a `TransformerStack` of
    fresh copies of the template (`final_norm=False`; the one final norm is this layer's).

    Causal stacks (Hourglass, Nawrot et al. 2021): with a template whose mixer is causal, a
    compressed position must not read positions after the earliest output that uses it. The
    states are shifted right by `k − 1` before downsampling (zeros in front, marked padding),
    so window `i` reads positions `i·s − k + 1 … i·s`, and only the first `n′` windows are
    kept; upsampled position `t` takes window `⌊t/s⌋`, which ends at `⌊t/s⌋·s ≤ t`, and the
    compressed layers are causal among windows. Every output then depends on inputs at its
    own and earlier positions only. The stack has no cache: a model that decodes with a
    cache cannot use it.

    Args:
        block: a `TransformerBlock` (or its serialised config), the template of every layer;
            a causal mixer makes the stack causal (above).
        num_layers: `(L₁, L₂, L₃)`, `L₁, L₃ ≥ 0`, `L₂ ≥ 1`.
        stride: int `s`, the reduction factor.
        kernel_size: int `k ≥ s` of the downsampling convolution (`None`: `s`).
        upsample: `"repeat"` or `"transposed"` (`Upsample`).
        residual: bool, add `H¹` to the upsampled states.
        final_norm: bool; `None` means "yes for a pre-norm template, no otherwise".
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, n, d]`.
        padding_mask: optional boolean `[B, n]`.
        training: bool.

    Returns:
        `[B, n, d]`.

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(2), FeedForward(16), norm_placement="pre")
    >>> stack = CompressedStack(block, num_layers=(1, 2, 1), stride=2)
    >>> y = stack(keras.random.normal((2, 5, 8)))  # (2, 5, 8)
    >>> causal = TransformerBlock(MultiHeadAttention(2, causal=True), FeedForward(16),
    ...                           norm_placement="pre")
    >>> y = CompressedStack(causal, (1, 2, 1), stride=2)(keras.random.normal((2, 5, 8)))
    """

    def __init__(self, block, num_layers, stride=2, kernel_size=None, upsample="repeat",
                 residual=True, final_norm=None, **kwargs):
        super().__init__(**kwargs)
        template = as_layer(block, "block", kind=TransformerBlock)
        self.causal = bool(template.mixer.causal)
        self._block_config = serialize_layer(template)
        self.num_layers = _check_num_layers(num_layers)
        if upsample not in METHODS:
            raise ValueError(f"upsample must be one of {METHODS}. Received: upsample={upsample!r}")
        self.upsample_method = upsample
        self.residual = check_bool("residual", residual)
        if final_norm is not None and not isinstance(final_norm, bool):
            raise ValueError(f"final_norm must be a bool or None. Received: "
                             f"final_norm={final_norm!r}")
        template = clone_layer(self._block_config)
        self.final_norm = (template.norm_placement in FINAL_NORM_PLACEMENTS
                           if final_norm is None else final_norm)
        dtype = self.dtype_policy
        self.downsample = Downsample(stride, kernel_size, dtype=dtype, name="downsample")
        self.upsample = Upsample(stride, upsample, dtype=dtype, name="upsample")
        self.stride, self.kernel_size = self.downsample.stride, self.downsample.kernel_size
        self.stacks = [
            None if count == 0 else TransformerStack(
                self._block_config, count, final_norm=False, dtype=dtype, name=name)
            for count, name in zip(self.num_layers, ("full_stack", "compressed_stack",
                                                     "upsampled_stack"))
        ]
        self.output_norm = None
        if self.final_norm:
            self.output_norm = make_normalization(template.normalization, template.epsilon,
                                                  dtype, "output_norm")

    def build(self, inputs_shape, padding_mask_shape=None):
        inputs_shape = tuple(inputs_shape)
        length = inputs_shape[1]
        compressed = (inputs_shape[0],
                      compressed_length(length, self.stride) if isinstance(length, int) else None,
                      inputs_shape[2])
        for stack, shape in zip(self.stacks, (inputs_shape, compressed, inputs_shape)):
            if stack is not None:
                stack.build(shape)
        self.downsample.build(inputs_shape)
        self.upsample.build(compressed)
        if self.output_norm is not None:
            self.output_norm.build(inputs_shape)

    def call(self, inputs, padding_mask=None, training=None):
        check_sequence_width(inputs, self.downsample.width)
        check_padding_mask(padding_mask, inputs)
        full, middle, upsampled = self.stacks
        states = inputs
        if full is not None:
            states = full(states, padding_mask=padding_mask, training=training)
        compressed, compressed_mask = self._downsample(states, padding_mask)
        compressed = middle(compressed, padding_mask=compressed_mask, training=training)
        outputs = self.upsample(compressed, residual=states if self.residual else None,
                                padding_mask=padding_mask,
                                output_length=inputs.shape[1] if isinstance(
                                    inputs.shape[1], int) else None)
        if upsampled is not None:
            outputs = upsampled(outputs, padding_mask=padding_mask, training=training)
        if self.output_norm is not None:
            outputs = self.output_norm(outputs)
        return outputs

    def _downsample(self, states, padding_mask):
        """`(C, m′)`, `m′` `None` without a padding mask; causal: the states shifted right
        by `k − 1` and the first `⌈n/s⌉` windows kept."""
        source, source_mask = states, padding_mask
        shift = self.kernel_size - 1
        if self.causal and shift > 0:
            source = ops.pad(states, ((0, 0), (shift, 0), (0, 0)))
            if padding_mask is not None:
                source_mask = ops.cast(ops.pad(ops.cast(padding_mask, "int32"),
                                               ((0, 0), (shift, 0))), "bool")
        compressed_mask = None
        if source_mask is None:
            compressed = self.downsample(source)
        else:
            compressed, compressed_mask = self.downsample(source, padding_mask=source_mask)
        if self.causal and shift > 0:
            length = states.shape[1] if isinstance(states.shape[1], int) else ops.shape(
                states)[1]
            windows = compressed_length(length, self.stride)
            compressed = compressed[:, :windows]
            if compressed_mask is not None:
                compressed_mask = compressed_mask[:, :windows]
        return compressed, compressed_mask

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "block": self._block_config,
            "num_layers": list(self.num_layers),
            "stride": self.stride,
            "kernel_size": self.kernel_size,
            "upsample": self.upsample_method,
            "residual": self.residual,
            "final_norm": self.final_norm,
        })
        return config
