"""Mixture of expert feedforward networks with sparse top-k dispatch (survey §4.4, §5.6)."""

import math

import keras
from keras import ops

from keras_xf.layers.cloning import clone_initializer
from keras_xf.layers.feedforward.expert_weights import ExpertWeights
from keras_xf.layers.feedforward.feed_forward import ACTIVATIONS
from keras_xf.layers.feedforward.feed_forward import GATED
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.layers.feedforward.feed_forward import apply_activation
from keras_xf.layers.feedforward.feedforward_layer import FeedForwardLayer
from keras_xf.layers.feedforward.moe_statistics import RouterStatistics
from keras_xf.layers.feedforward.router import Router
from keras_xf.layers.feedforward.router import validate_routing
from keras_xf.ops import moe as dispatch
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_token_mask
from keras_xf.ops.checks import check_width
from keras_xf.ops.checks import get_initializer


@keras.saving.register_keras_serializable(package="keras_xf")
class MixtureOfExperts(FeedForwardLayer):
    """`H_out = Σ_{i∈π} g_i(H_in) · FFN_i(H_in)` with top-k routing (survey §4.4, §5.6).

    A `Router` picks the `k` experts `π` of each token and their gates `g_i`; each token is
    then processed by those `k` experts only (sparse dispatch: `k·N` expert evaluations for
    `N` tokens, not `M·N`). With `capacity_factor` set, every expert has a fixed buffer of
    `C = ceil(capacity_factor · k · N / M)` rows filled by a cumulative sum over the
    assignments (all first choices before second choices); assignments beyond `C` are
    dropped and contribute zero, so the residual connection carries those tokens. With
    `capacity_factor=None` (dropless) each expert's rows are padded to whole blocks of
    `block_size` rows and every assignment is computed; the experts' weights are gathered
    per block. Padding tokens (`padding_mask`) take no rows and give zeros, unless
    `route_padding=True`: then they are routed and computed like every other token (as
    Mixtral and most checkpoint families do, so that padded positions carry the same values),
    taking expert rows (and capacity) but still left out of the losses and statistics.

    Each expert is a feedforward `σ(h W_h^i + b_h^i) W_f^i + b_f^i` with any `FeedForward`
    activation (GLU variants add `W_g^i`). `slices=True` gives the slice form of §4.4: one
    feedforward of width `intermediate_dim` whose `W_h` (and `W_f`) are split into `M`
    slices, each an expert of width `intermediate_dim / M`, with one shared output bias.
    `num_shared_experts` always-on experts (each of the experts' width) are added to every
    token with weight 1. The expert weights are `ExpertWeights` layers (`experts_in`,
    `experts_gate`, `experts_out`) holding stacked variables with a leading expert axis named
    `expert_*` (kernels `[M, d, f]`, `[M, f, d]`, biases `[M, f]`), so `model.quantize("int8")`
    or `"int4"` quantises every expert (one scale per expert and output column) and the
    router's `Dense` gate. `expert_kernel_in`, `expert_kernel_gate`, `expert_kernel_out` and
    `expert_bias_*` name those variables.

    Auxiliary losses (added with `add_loss`, over non-padding tokens): the Switch
    load-balancing loss `M · Σ_i f_i · P_i` (`f_i`: fraction of the `k·N` assignments routed
    to expert `i`, `P_i`: mean router probability of expert `i`) times
    `load_balance_weight`, and the router z-loss `mean(logsumexp(logits)²)` times
    `z_loss_weight`. Router statistics are Keras metrics reported by `fit` and `evaluate`
    (see `RouterStatistics`): `<path>/drop_rate` and `<path>/load_<i>` per expert.

    Args:
        num_experts: int, `M`.
        intermediate_dim: int, the width of each expert (of the whole sliced feedforward
            when `slices=True`, then divisible by `M`).
        top_k: int in `[1, M]`.
        activation: one of `FeedForward`'s activations.
        capacity_factor: float > 0, or `None` for dropless dispatch.
        num_shared_experts: int >= 0, always-on experts.
        slices: bool, the slice form of §4.4.
        load_balance_weight, z_loss_weight: floats >= 0, weights of the auxiliary losses.
        router_order, normalize_top_k, noise_std, router_bias: `Router` options.
        block_size: int, rows per block in dropless mode.
        route_padding: bool, route padding tokens to their experts like real tokens
            (`False`: they take no rows and give zeros).
        use_bias: bool, biases in the experts.
        dropout: float in [0, 1), dropout on the experts' hidden layer.
        kernel_initializer, bias_initializer: initializers.
        seed: int, seed of the router noise.
        **kwargs: base `Layer` arguments.

    Call arguments:
        inputs: `[B, T, d]` (or any `[..., d]`).
        padding_mask: optional boolean `[B, T]`; padding tokens take no expert rows and
            give zeros (plus the shared experts' output), or with `route_padding=True` are
            computed as real tokens; either way they stay out of the losses and statistics.
        training: bool.

    Returns:
        `[..., d]`.

    Example:
    >>> moe = MixtureOfExperts(num_experts=4, intermediate_dim=32, top_k=2)
    >>> y = moe(keras.random.normal((2, 5, 16)))  # (2, 5, 16)
    """

    def __init__(
        self,
        num_experts,
        intermediate_dim,
        top_k=2,
        activation="relu",
        capacity_factor=1.25,
        num_shared_experts=0,
        slices=False,
        load_balance_weight=0.01,
        z_loss_weight=0.001,
        router_order="softmax_then_topk",
        normalize_top_k=True,
        noise_std=0.0,
        router_bias=False,
        block_size=128,
        route_padding=False,
        use_bias=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_routing(num_experts, top_k, router_order, noise_std, "router_order")
        check_positive_int("intermediate_dim", intermediate_dim)
        if slices and intermediate_dim % num_experts:
            raise ValueError(
                "With slices=True, num_experts must divide intermediate_dim. Received: "
                f"intermediate_dim={intermediate_dim}, num_experts={num_experts}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}. Received: activation={activation!r}"
            )
        if capacity_factor is not None:  # None: dropless
            check_positive_number("capacity_factor", capacity_factor)
        check_positive_int("num_shared_experts", num_shared_experts, minimum=0)
        for name, value in (("load_balance_weight", load_balance_weight),
                            ("z_loss_weight", z_loss_weight)):
            check_positive_number(name, value, allow_zero=True)
        check_positive_int("block_size", block_size)
        if not isinstance(route_padding, bool):
            raise ValueError(
                f"route_padding must be a bool. Received: route_padding={route_padding!r}")
        check_rate("dropout", dropout)
        self.num_experts = num_experts
        self.intermediate_dim = intermediate_dim
        self.top_k = top_k
        self.activation = activation
        self.capacity_factor = None if capacity_factor is None else float(capacity_factor)
        self.num_shared_experts = num_shared_experts
        self.slices = bool(slices)
        self.load_balance_weight = float(load_balance_weight)
        self.z_loss_weight = float(z_loss_weight)
        self.router_order = router_order
        self.normalize_top_k = bool(normalize_top_k)
        self.noise_std = float(noise_std)
        self.router_bias = router_bias
        self.block_size = block_size
        self.route_padding = route_padding
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = get_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = get_initializer("bias_initializer", bias_initializer)
        self.seed = seed
        self.expert_dim = intermediate_dim // num_experts if slices else intermediate_dim
        self.router = Router(
            num_experts, top_k, order=router_order, normalize_top_k=normalize_top_k,
            noise_std=noise_std, use_bias=router_bias, seed=seed,
            dtype=self.dtype_policy, name="router",
        )
        self.shared_experts = None
        if num_shared_experts:
            self.shared_experts = FeedForward(
                num_shared_experts * self.expert_dim, activation=activation, use_bias=use_bias,
                dropout=dropout, kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer, dtype=self.dtype_policy,
                name="shared_experts",
            )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.statistics = RouterStatistics(self, name=f"{self.name}_router_statistics")

    # The block passes its padding mask to a feedforward that declares it uses one.
    uses_padding_mask = True

    def _expert_layer(self, name, units, init_slices, use_bias=None):
        return ExpertWeights(
            self.num_experts, units, use_bias=self.use_bias if use_bias is None else use_bias,
            kernel_initializer=self.kernel_initializer, bias_initializer=self.bias_initializer,
            init_slices=init_slices if self.slices else None, dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(
                f"MixtureOfExperts needs a known last dimension. Received: "
                f"inputs_shape={inputs_shape}"
            )
        self.width = width
        f = self.expert_dim
        self.router.build(inputs_shape)
        self.experts_in = self._expert_layer("experts_in", f, "columns")
        self.experts_gate = None
        if self.activation in GATED:
            self.experts_gate = self._expert_layer("experts_gate", f, "columns")
        # The slice form shares one output bias instead of one per expert.
        self.experts_out = self._expert_layer("experts_out", width, "rows",
                                              use_bias=self.use_bias and not self.slices)
        for layer, rows in ((self.experts_in, width), (self.experts_gate, width),
                            (self.experts_out, f)):
            if layer is not None:
                layer.build((None, None, rows))
        self.output_bias = None
        if self.use_bias and self.slices:
            self.output_bias = self.add_weight(
                name="output_bias", shape=(width,),
                initializer=clone_initializer(self.bias_initializer))
        if self.shared_experts is not None:
            self.shared_experts.build(inputs_shape)
        self.router_assignments, self.router_dropped, self.router_total = (
            self.statistics.make_variables(self))

    @property
    def expert_kernel_in(self):
        return self.experts_in.expert_kernel

    @property
    def expert_kernel_gate(self):
        return None if self.experts_gate is None else self.experts_gate.expert_kernel

    @property
    def expert_kernel_out(self):
        return self.experts_out.expert_kernel

    @property
    def expert_bias_in(self):
        return self.experts_in.expert_bias

    @property
    def expert_bias_gate(self):
        return None if self.experts_gate is None else self.experts_gate.expert_bias

    @property
    def expert_bias_out(self):
        return self.experts_out.expert_bias

    def _experts(self, rows, block_expert=None, training=None):
        """The expert feedforwards on `rows [G, R, d]`: group `g` is expert `g`, or expert
        `block_expert[g]` (weights gathered per block)."""
        hidden = self.experts_in(rows, expert_index=block_expert)
        if self.experts_gate is not None:
            gate = self.experts_gate(rows, expert_index=block_expert)
            hidden = apply_activation(self.activation, gate) * hidden
        else:
            hidden = apply_activation(self.activation, hidden)
        hidden = self.dropout_layer(hidden, training=training)
        return self.experts_out(hidden, expert_index=block_expert)

    def call(self, inputs, padding_mask=None, training=None):
        width = self.width
        check_width(inputs, width)
        check_token_mask(padding_mask, inputs)
        lead = ops.shape(inputs)[:-1]
        tokens = ops.reshape(inputs, (-1, width))
        num_tokens = ops.shape(tokens)[0]
        valid = ops.ones((num_tokens,), "bool")
        if padding_mask is not None:
            valid = ops.reshape(ops.cast(padding_mask, "bool"), (-1,))
        expert_index, gates, probabilities, logits = self.router(tokens, training=training)
        valid_k = ops.broadcast_to(valid[:, None], ops.shape(expert_index))
        # The assignments that take expert rows: the valid ones, or all with route_padding.
        routed_k = ops.ones_like(valid_k) if self.route_padding else valid_k
        m = self.num_experts
        if self.capacity_factor is not None:
            capacity = dispatch.expert_capacity(num_tokens, m, self.top_k, self.capacity_factor)
            slots, kept, counts = dispatch.capacity_slots(expert_index, routed_k, m, capacity)
            rows, _ = dispatch.gather_rows(tokens, slots, m * capacity)
            outputs = self._experts(ops.reshape(rows, (m, capacity, width)), training=training)
            outputs = ops.reshape(outputs, (m * capacity, width))
        else:
            block = self.block_size
            if isinstance(num_tokens, int):
                block = min(block, num_tokens)
                num_blocks = math.ceil((self.top_k * num_tokens + m * (block - 1)) / block)
            else:
                num_blocks = (self.top_k * num_tokens + m * (block - 1) + block - 1) // block
            slots, block_expert, counts = dispatch.dropless_slots(
                expert_index, routed_k, m, block, num_blocks)
            kept = dispatch.choice_major(routed_k)
            rows, _ = dispatch.gather_rows(tokens, slots, num_blocks * block)
            outputs = self._experts(ops.reshape(rows, (num_blocks, block, width)),
                                    block_expert, training=training)
            outputs = ops.reshape(outputs, (num_blocks * block, width))
        outputs = dispatch.combine_rows(outputs, slots, gates)
        if self.output_bias is not None:
            outputs = outputs + self.output_bias
        if self.shared_experts is not None:
            outputs = outputs + self.shared_experts(tokens, training=training)
        outputs = ops.reshape(outputs, tuple(lead) + (width,))
        if self.route_padding:  # the losses and statistics count real tokens only
            kept = ops.logical_and(kept, dispatch.choice_major(valid_k))
            counts = dispatch.expert_counts(expert_index, valid_k, m)
        self._add_router_losses(probabilities, logits, counts, valid)
        self.statistics.record(counts, kept, valid_k)
        return outputs

    def _add_router_losses(self, probabilities, logits, counts, valid):
        weights = ops.cast(valid, "float32")
        num_valid = ops.maximum(ops.sum(weights), 1.0)
        if self.load_balance_weight > 0:
            fraction = ops.cast(counts, "float32") / (num_valid * self.top_k)
            mean_probability = ops.sum(probabilities * weights[:, None], axis=0) / num_valid
            balance = self.num_experts * ops.sum(fraction * mean_probability)
            self.add_loss(self.load_balance_weight * balance)
        if self.z_loss_weight > 0:
            z = ops.square(ops.logsumexp(logits, axis=-1))
            self.add_loss(self.z_loss_weight * ops.sum(z * weights) / num_valid)

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, padding_mask=None, training=None):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_experts": self.num_experts,
                "intermediate_dim": self.intermediate_dim,
                "top_k": self.top_k,
                "activation": self.activation,
                "capacity_factor": self.capacity_factor,
                "num_shared_experts": self.num_shared_experts,
                "slices": self.slices,
                "load_balance_weight": self.load_balance_weight,
                "z_loss_weight": self.z_loss_weight,
                "router_order": self.router_order,
                "normalize_top_k": self.normalize_top_k,
                "noise_std": self.noise_std,
                "router_bias": self.router_bias,
                "block_size": self.block_size,
                "route_padding": self.route_padding,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "seed": self.seed,
            }
        )
        return config
