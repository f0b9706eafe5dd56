"""A Keras LSTM or GRU used as a sequence mixer, for recurrent hybrid stacks (survey §5.5.2)."""

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import get_initializer

CELLS = ("lstm", "gru")


@keras.saving.register_keras_serializable(package="keras_xf")
class RecurrentMixer(SequenceMixer):
    """A recurrent network (Keras `LSTM` or `GRU`) in the place of self-attention.

    Survey §5.5.2: the linear model `z_i = f(a·z_{i−1} + b·s_i)` (Eq. linear-base-model)
    extended to a standard RNN `z_i = f(z_{i−1} W_z + s_i W_s)`, "we can use LSTM and GRUs in
    building some of the Transformer layers to combine the merits of both recurrent models
    and self-attentive models" (Chen et al. 2018). Per position `i` the mixer computes

        LSTM:  [i, f, c̃, o] = [σ, σ, tanh, σ](s_i W + h_{i−1} U + b),
               c_i = f ⊙ c_{i−1} + i ⊙ c̃,   h_i = o ⊙ tanh(c_i)
        GRU:   z, r = σ(s_i W_{z,r} + b_{z,r} + h_{i−1} U_{z,r} + b'_{z,r}),
               h̃ = tanh(s_i W_h + b_h + r ⊙ (h_{i−1} U_h + b'_h)),
               h_i = z ⊙ h_{i−1} + (1 − z) ⊙ h̃                  (Keras `reset_after=True`)

    and returns `o_i = h_i W_o + b_o` (the projection only when the recurrent width, `units`
    or `2·units` when bidirectional, differs from the output width), else `o_i = h_i`.

    The unidirectional mixer is causal whatever `use_causal_mask` says, and its cache is the
    recurrent state (`(h, c)` for an LSTM, `h` for a GRU): decoding token by token from the
    state equals the full pass. The bidirectional mixer concatenates a forward and a
    backward RNN (`[h→_i ; h←_i]`); it sees the whole sequence, so it is non-causal and takes
    no cache. Padding follows Keras RNN masking: a padded position leaves the state
    unchanged, and its output is zero.

    Args:
        cell: `"lstm"` or `"gru"`.
        units: int, the recurrent state width; defaults to the input width (half of it,
            rounded up, when bidirectional).
        bidirectional: bool, a forward and a backward RNN, concatenated (non-causal).
        output_dim: int, the output width; defaults to the input width.
        use_bias: bool, biases of the RNN and the output projection.
        kernel_initializer, recurrent_initializer, bias_initializer: initializers of the RNN
            (the output projection uses `kernel_initializer` and `bias_initializer`).
        use_cudnn: `"auto"`, `True` or `False`, passed to the Keras layer: `"auto"` takes the
            backend's fused kernel where it has one. On PyTorch without CUDA, Keras's fused
            LSTM loop indexes one precomputed `[T, B, 4u]` projection per step, and the
            gradient of each index is a zero tensor of the whole projection's size, so its
            backward pass grows like `T²`; `False` takes Keras's generic loop instead (slower
            per step at short lengths, linear backward).
        **kwargs: base `Layer` arguments (`name`, `dtype`, …).

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded positions leave the state unchanged and give
            zero outputs.
        attention_mask: must be `None` (a recurrent network has no pairwise mask).
        use_causal_mask: `None` or `False`, or `True` for a unidirectional mixer (which is
            causal anyway); `True` is refused by a bidirectional one.
        cache: the state from `init_cache` (or a previous call), unidirectional only; the
            tokens continue from it.
        cache_index: accepted for the cache protocol; the state needs no position.
        training: bool.

    Returns:
        `[B, T, output_dim]`, or `(outputs, new_state)` when a cache is given; the state is
        a tuple `(h, c)` of float32 `[B, units]` for an LSTM, a tuple `(h,)` for a GRU.

    Example:
    >>> mixer = RecurrentMixer("lstm", units=24)
    >>> y = mixer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    >>> state = mixer.init_cache(2, 6)
    >>> y0, state = mixer(keras.random.normal((2, 1, 16)), cache=state, cache_index=0)
    >>> block = TransformerBlock(RecurrentMixer("gru"), FeedForward(64))
    """

    # The cache is a running state, not addressed by position: each token enters it once.
    cache_is_recurrent = True
    no_attention_mask = "a recurrent network has no pairwise mask; use padding_mask"

    def __init__(
        self,
        cell="lstm",
        units=None,
        bidirectional=False,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer="zeros",
        use_cudnn="auto",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"cell must be one of {CELLS}. Received: cell={cell!r}")
        for name, value in (("units", units), ("output_dim", output_dim)):
            if value is not None:
                check_positive_int(name, value)
        check_bool("bidirectional", bidirectional)
        if use_cudnn not in ("auto", True, False):
            raise ValueError(
                f"use_cudnn must be 'auto', True or False. Received: use_cudnn={use_cudnn!r}"
            )
        self.cell = cell
        self.use_cudnn = use_cudnn
        self.units = units
        self.bidirectional = bidirectional
        self.output_dim = output_dim
        self.use_bias = use_bias
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.recurrent_initializer = get_initializer(
            "recurrent_initializer", recurrent_initializer
        )
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.supports_masking = True

    def _state_units(self, width):
        if self.units is not None:
            return self.units
        return (width + 1) // 2 if self.bidirectional else width

    def build(self, inputs_shape):
        width = self.check_inputs_shape(inputs_shape)
        self.state_units = self._state_units(width)
        layer_class = keras.layers.LSTM if self.cell == "lstm" else keras.layers.GRU
        rnn = layer_class(
            self.state_units,
            return_sequences=True,
            return_state=True,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            recurrent_initializer=clone_initializer(self.recurrent_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            use_cudnn=self.use_cudnn,
            dtype=self.dtype_policy,
            name=self.cell,
        )
        if self.bidirectional:
            rnn = keras.layers.Bidirectional(
                rnn, merge_mode="concat", dtype=self.dtype_policy, name="bidirectional"
            )
        self.rnn = rnn
        self.rnn.build(inputs_shape)
        recurrent_width = self.state_units * (2 if self.bidirectional else 1)
        out_dim = self.output_dim or width
        self.output_dense = None
        if recurrent_width != out_dim:
            self.output_dense = keras.layers.Dense(
                out_dim,
                use_bias=self.use_bias,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
                name="output",
            )
            self.output_dense.build(tuple(inputs_shape[:-1]) + (recurrent_width,))
        self.built = True

    def check_cache_ready(self):
        if self.bidirectional:
            raise ValueError(
                "A bidirectional RecurrentMixer reads the whole sequence and has no cache. "
                "Received: bidirectional=True"
            )
        super().check_cache_ready()

    def cache_shapes(self, batch_size):
        """The state, float32 whatever `dtype`: `(h, c)` for an LSTM, `(h,)` for a GRU, each
        `[B, units]`; its size does not depend on `max_length`. `None` when bidirectional."""
        if self.bidirectional:
            return None
        return [(batch_size, self.state_units)] * (2 if self.cell == "lstm" else 1)

    def causal_form(self, use_causal_mask, cache):
        if self.bidirectional and (cache is not None or use_causal_mask):
            raise ValueError(
                "A bidirectional RecurrentMixer is non-causal: it takes neither a cache nor "
                f"use_causal_mask=True. Received: use_causal_mask={use_causal_mask}, "
                f"cache={'given' if cache is not None else None}"
            )
        return not self.bidirectional

    def mix(self, inputs, padding_mask, causal, cache, training):
        # The padding mask is checked by `call`: Keras's RNN on PyTorch runs over the mask's
        # length, and the output masking would broadcast a longer mask over a shorter sequence.
        mask = None if padding_mask is None else ops.cast(padding_mask, "bool")
        kwargs = {"mask": mask, "training": training}
        if cache is not None:
            kwargs["initial_state"] = [ops.cast(s, self.compute_dtype) for s in cache]
        results = self.rnn(inputs, **kwargs)
        outputs, states = results[0], results[1:]
        if self.output_dense is not None:
            outputs = self.output_dense(outputs)
        if mask is not None:
            outputs = outputs * ops.cast(mask, outputs.dtype)[:, :, None]
        if cache is None:
            return outputs, None
        return outputs, tuple(ops.cast(s, "float32") for s in states)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "cell": self.cell,
                "units": self.units,
                "bidirectional": self.bidirectional,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": keras.initializers.serialize(self.recurrent_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "use_cudnn": self.use_cudnn,
            }
        )
        return config
