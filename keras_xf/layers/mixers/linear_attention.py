"""Kernelised linear attention with running sums, decay and gates (survey §5.3.2, §5.5.2)."""

import math

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.head_projections import INTO_HEADS
from keras_xf.layers.head_projections import OUT_OF_HEADS
from keras_xf.layers.head_projections import head_projection
from keras_xf.layers.head_projections import project
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer
from keras_xf.ops.checks import check_per_head_fractions
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_seed
from keras_xf.ops.checks import get_initializer
from keras_xf.ops.linear_attention import FEATURE_MAPS
from keras_xf.ops.linear_attention import causal_key_convolution
from keras_xf.ops.linear_attention import decay_logits
from keras_xf.ops.linear_attention import feature_map_of
from keras_xf.ops.linear_attention import feature_size
from keras_xf.ops.linear_attention import normalized_linear_attention

DECAY_MODES = ("learned", "gated")


@keras.saving.register_keras_serializable(package="keras_xf")
class LinearAttention(SequenceMixer):
    """Multi-head linear attention: `Att = D⁻¹ Q′(K′ᵀV)` with `Q′ = φ(Q)`, `K′ = φ(K)`.

    Survey §5.3.2 ("Reducing d": the kernelised attention `α_ij ≈ φ(q_i)φ(k_j)ᵀ /
    Σ_j′ φ(q_i)φ(k_j′)ᵀ`) and §5.5.2 (linear attention as a recurrent model). Per head:

    - non-causal: `c_i = q′_i μ_n / q′_i ν_n` with `μ_n = Σ_j k′_jᵀ v_j`, `ν_n = Σ_j k′_jᵀ`;
    - causal: `μ_j = μ_{j−1} + k′_jᵀ v_j`, `ν_j = ν_{j−1} + k′_jᵀ`, `c_j = q′_j μ_j / q′_j ν_j`;
    - decayed (causal): `μ_j = a·μ_{j−1} + (1−a)·k′_jᵀ v_j`, `ν_j = a·ν_{j−1} + (1−a)·k′_jᵀ`,
      with `a` fixed, a learned scalar per head, or a gate `a_j = σ(W x_j + b)` per head.

    Key convolution (`key_convolution=K`): the keys are first mixed over the last `K`
    positions by a causal depthwise convolution, `k̃_t = Σ_{o<K} w_o ⊙ k_{t−o}` (one weight per
    offset and key channel, §5.5.1), as the short convolutions of H3 and Mamba. Then the key
    written at position `t` can carry the token before it: in associative recall, the value
    `v_t` is stored under the key `k_{t−1}` that precedes it, and a later query of that key
    reads it back. Without it, that binding has to be built from the block's input, where a
    shifted token and the current one overlap.

    Feature maps `φ` (`keras_xf.ops.linear_attention.feature_map_of`): `"elu"` (`elu(x) + 1`),
    `"relu"`, `"identity"` (only with `normalize=False`), `"taylor"` (Based's second-order
    Taylor expansion of `exp(q·k/√d_h)`, `φ(q)·φ(k) = 1 + s + s²/2 > 0`, with
    `m = 1 + d_h + d_h(d_h+1)/2` features: a larger state that keeps more associations
    apart), and `"random_features"` (Performer's FAVOR+, `φ(q)·φ(k) ≈ exp(q·k/√d_h)`);
    `ω ∈ R^{d_h×m}` is a non-trainable weight drawn from `N(0, 1)` (saved with the model), or
    redrawn at every training call when `redraw=True` (from the layer's `SeedGenerator`, whose
    state advances inside compiled train steps; the last draw is written back into the
    weight, which inference uses).

    The causal form is computed chunk-parallel (`causal_linear_attention`): a masked quadratic
    form inside a chunk of `chunk_size` positions, the carried state `(μ, ν)` across chunks
    (a running sum, or a linear recurrence when there is a decay). The state is the cache:
    decoding one token updates `(μ, ν)` in `O(m·d_h)` per head, independent of the context
    length (with a key convolution, the cache also holds the last `K − 1` projected keys).
    States and sums are accumulated in float32 under mixed precision; the denominator is
    `max(q′ν, ε)`, so rows without any valid key give zeros.

    Special cases: `decay=0.97` (or one value per head, fixed), `feature_map="identity"` and
    `normalize=False` give retention (RetNet's `S_j = γ S_{j−1} + k_jᵀ v_j`, `o_j = q_j S_j`,
    up to the constant factor `1−γ`, without its xPos rotation and group norm);
    `decay="gated"` is the gated random-feature attention of Peng et al. (RFA-Gate) and, with
    `feature_map="identity"` and `normalize=False`, gated linear attention with one
    data-dependent scalar gate per head.

    Args:
        num_heads: int, heads `τ`.
        head_dim: int, width `d_h` of each head; defaults to `hidden_dim // num_heads`.
        output_dim: int, output width; defaults to the input width.
        feature_map: one of `"elu"`, `"relu"`, `"taylor"`, `"random_features"`, `"identity"`.
        num_features: int `m`, random features per head (only for `"random_features"`;
            defaults to `2·d_h`).
        redraw: bool, redraw `ω` at every training call (only for `"random_features"`).
        decay: `None` (plain running sums); a float in (0, 1) or a list of one per head
            (fixed `a`); `"learned"` (a trained scalar per head, `a = σ(θ_h)`); or `"gated"`
            (`a_j = σ(W x_j + b)` per head).
        decay_init: float in (0, 1) or list per head, initial `a` for `"learned"` and the
            initial bias `σ(b)` of `"gated"`.
        normalize: bool, divide by `q′ν` (`D⁻¹`); `False` returns `q′μ`.
        key_convolution: `None` or int `K ≥ 1`, the size of the causal depthwise convolution
            of the projected keys.
        key_convolution_initializer: initializer of its kernel `w [K, H, d_h]` (default
            uniform in `±1/√K`, the default of a depthwise convolution of `K` taps).
        causal: bool, default for `use_causal_mask`.
        chunk_size: positive int, positions per chunk of the causal form.
        use_bias: bool, biases in the projections.
        epsilon: float > 0, lower bound of the denominator.
        seed: optional int, seed of the random features (initial draw and redraws).
        kernel_initializer, bias_initializer: initializers of the projections.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]`.
        padding_mask: boolean `[B, T]`; padded keys contribute nothing (in the causal form the
            state passes through a padded position unchanged).
        attention_mask: must be `None` (an arbitrary `[T, S]` mask has no linear-time form).
        use_causal_mask: bool, `None` means `causal`.
        cache: `(μ, ν)` from `init_cache` (`(μ, ν, last keys)` with a key convolution); the
            tokens continue from this state (causal form).
        cache_index: int or scalar int tensor, position of the first token (the state needs
            no index; accepted for the cache protocol).
        training: bool.

    Returns:
        `[B, T, output_dim]`, or `(outputs, new_cache)` when a cache is given.

    Example:
    >>> layer = LinearAttention(num_heads=2, feature_map="elu", decay="gated", causal=True)
    >>> y = layer(keras.random.normal((2, 6, 16)))  # (2, 6, 16)
    >>> state = layer.init_cache(2, 6)
    >>> y0, state = layer(keras.random.normal((2, 1, 16)), cache=state, cache_index=0)
    """

    # The cache is a running state, not addressed by position: each token enters it once.
    cache_is_recurrent = True
    no_attention_mask = (
        "an arbitrary [T, S] mask has no linear-time form; use padding_mask and use_causal_mask"
    )

    def __init__(
        self,
        num_heads,
        head_dim=None,
        output_dim=None,
        feature_map="elu",
        num_features=None,
        redraw=False,
        decay=None,
        decay_init=0.9,
        normalize=True,
        key_convolution=None,
        key_convolution_initializer=None,
        causal=False,
        chunk_size=64,
        use_bias=True,
        epsilon=1e-6,
        seed=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("chunk_size", chunk_size)
        for name, value in (("head_dim", head_dim), ("output_dim", output_dim),
                            ("key_convolution", key_convolution)):
            if value is not None:
                check_positive_int(name, value)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"feature_map must be one of {FEATURE_MAPS}. Received: feature_map={feature_map!r}"
            )
        if num_features is not None:
            if feature_map != "random_features":
                raise ValueError(
                    "num_features is used by feature_map='random_features' only. Received: "
                    f"num_features={num_features}, feature_map={feature_map!r}"
                )
            check_positive_int("num_features", num_features)
        if redraw and feature_map != "random_features":
            raise ValueError(
                "redraw is used by feature_map='random_features' only. Received: "
                f"redraw={redraw}, feature_map={feature_map!r}"
            )
        if feature_map == "identity" and normalize:
            raise ValueError(
                "feature_map='identity' can give a zero or negative denominator q′ν; use it "
                "with normalize=False. Received: feature_map='identity', normalize=True"
            )
        if decay is not None and decay not in DECAY_MODES:
            check_per_head_fractions("decay", decay, num_heads)
        check_per_head_fractions("decay_init", decay_init, num_heads)
        check_positive_number("epsilon", epsilon)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.output_dim = output_dim
        self.feature_map = feature_map
        self.num_features = num_features
        self.redraw = bool(redraw)
        self.decay = list(decay) if isinstance(decay, tuple) else decay
        self.decay_init = list(decay_init) if isinstance(decay_init, tuple) else decay_init
        self.normalize = bool(normalize)
        self.key_convolution = key_convolution
        if key_convolution_initializer is None and key_convolution is not None:
            bound = 1.0 / math.sqrt(key_convolution)
            key_convolution_initializer = keras.initializers.RandomUniform(-bound, bound)
        self.key_convolution_initializer = (
            None if key_convolution_initializer is None
            else get_initializer("key_convolution_initializer", key_convolution_initializer)
        )
        self.causal = bool(causal)
        self.chunk_size = chunk_size
        self.use_bias = use_bias
        self.epsilon = float(epsilon)
        self.seed = check_seed(seed)
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        # Redraws follow a stream other than the initial draw's (which uses `seed` itself).
        redraw_seed = None if seed is None else seed + 1
        self.seed_generator = keras.random.SeedGenerator(redraw_seed) if self.redraw else None

    # Weights -----------------------------------------------------------------------------
    def _projection(self, name, equation, output_shape, bias_axes):
        return head_projection(
            name, equation, output_shape, bias_axes, use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer, bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
        )

    @property
    def state_features(self):
        """`m`, the width of `φ(x)` (the rows of `μ`)."""
        return feature_size(self.feature_map, self.head_dim, self.num_features)

    def build(self, inputs_shape):
        hidden_dim = self.check_inputs_shape(inputs_shape)
        if self.head_dim is None:
            if hidden_dim % self.num_heads:
                raise ValueError(
                    "num_heads must divide hidden_dim when head_dim is not given. Received: "
                    f"num_heads={self.num_heads}, hidden_dim={hidden_dim}"
                )
            self.head_dim = hidden_dim // self.num_heads
        heads, dim = self.num_heads, self.head_dim
        out_dim = self.output_dim or hidden_dim
        self.query_dense = self._projection("query", INTO_HEADS, (None, heads, dim), "hk")
        self.key_dense = self._projection("key", INTO_HEADS, (None, heads, dim), "hk")
        self.value_dense = self._projection("value", INTO_HEADS, (None, heads, dim), "hk")
        self.output_dense = self._projection("attention_output", OUT_OF_HEADS, (None, out_dim), "d")
        for dense in (self.query_dense, self.key_dense, self.value_dense):
            dense.build(inputs_shape)
        self.output_dense.build((inputs_shape[0], inputs_shape[1], heads, dim))
        self.projection = None
        if self.feature_map == "random_features":
            self.projection = self.add_weight(
                name="projection",
                shape=(dim, self.state_features),
                initializer=keras.initializers.RandomNormal(0.0, 1.0, seed=self.seed),
                trainable=False,
                dtype="float32",
                autocast=False,  # the features are computed in float32
            )
        self.key_convolution_kernel = None
        if self.key_convolution is not None:
            self.key_convolution_kernel = self.add_weight(
                name="key_convolution_kernel",
                shape=(self.key_convolution, heads, dim),
                initializer=clone_initializer(self.key_convolution_initializer),
            )
        init = check_per_head_fractions("decay_init", self.decay_init, heads)
        logits = decay_logits(init)
        self.decay_logit = None
        self.gate_dense = None
        if self.decay == "learned":
            self.decay_logit = self.add_weight(
                name="decay_logit",
                shape=(heads,),
                initializer=keras.initializers.Constant(logits),
                dtype="float32",
                autocast=False,
            )
        elif self.decay == "gated":
            self.gate_dense = keras.layers.EinsumDense(
                "btd,dh->bth",
                output_shape=(None, heads),
                bias_axes="h",
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=keras.initializers.Constant(logits),
                dtype=self.dtype_policy,
                name="gate",
            )
            self.gate_dense.build(inputs_shape)
        self.built = True

    def check_cache_ready(self):
        if self.head_dim is None:
            raise ValueError(
                "init_cache needs head_dim: pass head_dim to LinearAttention or build it first."
            )

    def cache_shapes(self, batch_size):
        """The zero state `(μ [B, H, m, d_h], ν [B, H, m])`, float32 whatever `dtype` (the sums
        are accumulated in float32), plus the last `K − 1` projected keys `[B, K − 1, H, d_h]`
        with a key convolution; its size does not depend on `max_length`."""
        shape = (batch_size, self.num_heads, self.state_features)
        shapes = [shape + (self.head_dim,), shape]
        if self.key_convolution is not None:
            shapes.append((batch_size, self.key_convolution - 1, self.num_heads, self.head_dim))
        return shapes

    def _log_decay(self, inputs):
        """`(log a_j, 1 − a_j)`, each `[B, T, H]` or `[H]` in float32; `None` without decay."""
        if self.decay is None:
            return None
        if self.decay == "learned":
            logit = ops.cast(self.decay_logit, "float32")
        elif self.decay == "gated":
            logit = ops.cast(self.gate_dense(inputs), "float32")
        else:
            values = check_per_head_fractions("decay", self.decay, self.num_heads)
            logit = ops.convert_to_tensor(decay_logits(values), "float32")
        # log σ(θ) = −softplus(−θ), 1 − σ(θ) = σ(−θ): stable for large |θ|.
        return -ops.softplus(-logit), ops.sigmoid(-logit)

    def causal_form(self, use_causal_mask, cache):
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        if cache is not None and use_causal_mask is not None and not use_causal_mask:
            raise ValueError(
                "A cache holds the causal running state; it cannot be used with "
                "use_causal_mask=False. Received: use_causal_mask=False with a cache"
            )
        causal = causal or cache is not None
        if self.decay is not None and not causal:
            raise ValueError(
                "decay applies to the causal (recurrent) form. Received: "
                f"decay={self.decay!r} with use_causal_mask=False"
            )
        return causal

    def mix(self, inputs, padding_mask, causal, cache, training):
        projection = self.projection
        if self.redraw and training:
            projection = keras.random.normal(
                tuple(self.projection.shape), seed=self.seed_generator, dtype="float32"
            )
            self.projection.assign(projection)
        q = project(self.query_dense, inputs)
        k = project(self.key_dense, inputs)
        v = project(self.value_dense, inputs)
        key_window = None
        if self.key_convolution is not None:
            if padding_mask is not None:  # a padded position passes no key to the next ones
                k = k * ops.cast(padding_mask, k.dtype)[:, :, None, None]
            k, key_window = causal_key_convolution(k, self.key_convolution_kernel,
                                                   None if cache is None else cache[2])
        qf = feature_map_of(q, self.feature_map, projection, stabilize=self.normalize)
        kf = feature_map_of(k, self.feature_map, projection)

        decay = self._log_decay(inputs)
        log_decay = scale = None
        if decay is not None:
            log_decay, scale = decay
            shape = ops.shape(kf)[:3]
            log_decay = log_decay + ops.zeros(shape, "float32")
            scale = scale + ops.zeros(shape, "float32")
        if padding_mask is not None:
            mask = ops.cast(padding_mask, "float32")[:, :, None]
            kf = kf * mask[..., None]
            if log_decay is not None:  # the state passes a padded position unchanged
                log_decay = log_decay * mask
        outputs, sums = normalized_linear_attention(
            qf, kf, v, causal, log_decay, scale, None if cache is None else cache[:2],
            normalize=self.normalize, epsilon=self.epsilon, chunk_size=self.chunk_size,
        )
        new_cache = None
        if cache is not None:
            new_cache = sums if key_window is None else sums + (key_window,)
        outputs = project(self.output_dense, ops.cast(outputs, self.compute_dtype))
        return outputs, new_cache

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape[:-1]) + (self.output_dim or inputs_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self.head_dim,
                "output_dim": self.output_dim,
                "feature_map": self.feature_map,
                "num_features": self.num_features,
                "redraw": self.redraw,
                "decay": self.decay,
                "decay_init": self.decay_init,
                "normalize": self.normalize,
                "key_convolution": self.key_convolution,
                "key_convolution_initializer": (
                    None if self.key_convolution_initializer is None
                    else keras.initializers.serialize(self.key_convolution_initializer)
                ),
                "causal": self.causal,
                "chunk_size": self.chunk_size,
                "use_bias": self.use_bias,
                "epsilon": self.epsilon,
                "seed": self.seed,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
