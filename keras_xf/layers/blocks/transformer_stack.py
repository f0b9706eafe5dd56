"""A stack of Transformer layers cloned from one template block (survey §2.1, §5.4)."""

import keras
from keras import ops

from keras_xf.layers.block_contract import PassesMixerArguments
from keras_xf.layers.block_contract import first_positions
from keras_xf.layers.block_contract import mixer_arguments
from keras_xf.layers.block_contract import new_specs
from keras_xf.layers.block_contract import split_results
from keras_xf.layers.blocks import depth_initialization as depth_init
from keras_xf.layers.blocks.depth_options import check_depth_options
from keras_xf.layers.blocks.depth_options import depth_option_layers
from keras_xf.layers.blocks.layer_control import LayerControl
from keras_xf.layers.blocks.layer_runner import LayerRunner
from keras_xf.layers.blocks.layer_sharing import layer_owners
from keras_xf.layers.blocks.layer_sharing import prune_stack
from keras_xf.layers.blocks.stack_templates import attends_over_own_positions
from keras_xf.layers.blocks.stack_templates import check_bias_sharing
from keras_xf.layers.blocks.stack_templates import check_map_sharing
from keras_xf.layers.blocks.stack_templates import serialize_templates
from keras_xf.layers.blocks.stack_templates import without_biases
from keras_xf.layers.blocks.transformer_block import TransformerBlock
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.residual.residual import FINAL_NORM_PLACEMENTS
from keras_xf.layers.residual.residual import make_normalization
from keras_xf.ops.checks import check_output_length
from keras_xf.ops.checks import check_rank


@keras.saving.register_keras_serializable(package="keras_xf")
class TransformerStack(PassesMixerArguments, keras.layers.Layer):
    """`H^l = Block_l(H^{l-1})` for `l = 1 … L`, each block a fresh copy of a template.

    The template's config is cloned `num_layers` times, so every layer has its own weights.
    Pre-norm stacks end with a final normalisation (the residual path of a pre-norm layer is
    never normalised, survey §2.4); post-norm stacks do not need one.

    Attention-map sharing (survey §5.4): with `share_attention_maps=k`, layers `0, k, 2k, …`
    compute their attention weights `α^l = Softmax(Q^l K^lᵀ/√d + M)` and the next `k − 1`
    layers reuse them, `C^{l+i} = Merge(α^l_h V^{l+i}_h) W^{l+i}_c`: they keep their own
    values, output projections and feedforwards but compute no scores. Cached decoding works
    as without sharing (the reused weights span the same cache positions).

    Hybrid stacks: `block` may be a list of templates `[B_0, …, B_{m−1}]`; layer `l` is then
    a fresh copy of `B_{l mod m}` (e.g. recurrent or averaging layers alternating with
    self-attention layers, survey §5.5.2). The final normalisation follows the first template.

    Shared score biases (`share_score_biases=True`): every layer's self-attention uses the
    `ScoreBias` layers of the first layer, so one table serves the whole stack, as T5's
    relative-position bias `b_{h, bucket(j − i)}` does (survey §4.1.3: T5 keeps the table
    in layer 0 and passes the same bias to every layer). A bias that depends on the
    positions alone (`positions_only`, e.g. `RelativePositionBias`) is computed once per
    call of the stack, by its first layer, and reused by the others (all layers attend over
    the same query and key positions; stacks with a rolling-cache pattern recompute it in
    each layer). Cached decoding and generation work as without sharing; there is one set
    of weights to train.

    Depth options (survey §4.2.3, §4.2.4, §4.3, §5.4; `docs/design.md`). A layer's
    increment is `f^l = Block^l(Z^l) − Z^l`, `Z^l` its input, `z^0` the stack's input.
    - Layer fusion (`fusion`): `Z^1 = z^0`, `Z^{l+1} = φ_l(z^0, …, z^l)`, and the output is
      `Z^{L+1}`; `φ` one of the survey's table (`LayerFusion`), `LNorm(φ)` with
      `fusion_normalization`.
    - Layer drop (`layer_drop = p = 1 − ρ`): in training `z^l = Z^l + g·f^l`, `g ~
      Bernoulli(ρ)` per example, a multiplicative gate (every layer is computed; no branch
      on tensors, so it compiles under XLA); at inference `z^l = Z^l + ρ·f^l`, the survey's
      rescaling (`LayerDrop`). `prune(layers)` keeps a subset of the layers (with
      `"average"` or `"weighted_sum"` fusion, or multi-step residuals, restricted to the
      kept layers; not with the other fusions, tied to the layer count).
    - Parameter sharing (`share_layers`): `θ^{l_1} = … = θ^{l_n}` for the layers of a group;
      shared layers are the same block object, counted and saved once.
    - Linear multi-step residuals (`multistep`): `z^l = Σ_i a_i z^{l−i} + Σ_i b_i f^{l−i+1}`
      (`MultiStepResidual`, Adams–Bashforth presets or given coefficients, learned with
      `learn_multistep`).
    All of them work with caches (they act on each position alone) and any mixer.

    Per-layer control (survey §5.6; `docs/design.md`): `run_layers(inputs, control)` runs
    the layers one at a time under a `LayerControl`, which chooses the rows that run each
    layer (a skipped row passes it as the identity, `f^l = 0`), stops rows (their state is
    frozen, and later layers cache it) and reads the state after each layer; the options
    above apply to every layer run, and a layer that no row runs is not computed (its mixer
    sub-layer alone fills its cache). Early exit and layer skipping use it. The stack's own
    call runs the same per-layer step (`LayerRunner`).

    Args:
        block: a `TransformerBlock` or `GatedCrossAttentionBlock` (or its serialised config)
            used as the template, or a non-empty list of templates used in turn; the
            templates themselves are not used and hold no weights of the stack.
        num_layers: int, `L`.
        final_norm: bool; `None` means "yes for a pre-norm template, no otherwise".
        share_attention_maps: int `k ≥ 1`, layers per group sharing one attention map
            (1 = no sharing). `k > 1` needs a `MultiHeadAttention` mixer.
        share_score_biases: bool, all layers use the first layer's score biases (their
            `MultiHeadAttention` mixers must have equally many); `False` gives each layer
            its own copy.
        fusion: `None`, `"average"`, `"weighted_sum"`, `"feedforward"` or `"attention"`.
        fusion_normalization: `None` or a normalisation name (`"layer_norm"`, …).
        layer_drop: float in `[0, 1)`, the probability of skipping a layer in training.
        layer_drop_rescale: `"inference"` (multiply increments by `ρ` at inference, the
            survey's form) or `"training"` (divide kept increments by `ρ` in training).
        layer_drop_seed: optional int seed of the layer-drop gates.
        share_layers: `None`, `"all"`, an int `k` (layer `l` uses the weights of layer
            `l mod k`), or a list of `num_layers` group names (equal names share).
        multistep: `None`, `"adams_bashforth_1"` … `"adams_bashforth_4"`, or
            `{"a": [a_1, …], "b": [b_1, …]}`.
        learn_multistep: bool, the multi-step coefficients are trained.
        depth_initialization: `None` (each layer keeps its own initializers), or a dict
            that re-draws every projection kernel (`Dense`, `EinsumDense`) of each
            `TransformerBlock` when the stack is built, by Xavier with a depth-dependent
            gain (survey §4.2.2; `keras_xf.initializers`): `{"method": "model_depth", "a",
            "b"}` gives `gain = a·L^b`; `{"method": "sub_layer_depth", "a", "b"}` gives
            `gain = a / l^b`, the sub-layers numbered `l = 1, 2, …` over the stack;
            `{"method": "deep_norm", "beta"}` gives DeepNorm's gain β (default `(8L)^{-1/4}`,
            see `deep_norm`) to the value, output and feedforward projections and gain 1 to
            the queries and keys. `"distribution"`: `"uniform"` or `"normal"` (default
            uniform, normal for DeepNorm).
        **kwargs: base `Layer` arguments.

    Call arguments:
        As `TransformerBlock`; `cache` is a tuple with one block cache per layer. Any other
        keyword argument (e.g. `attention_bias`, `attention_multiplier`) reaches every
        layer's mixer unchanged.
        output_length: optional int `n ≤ T`: the stack returns the first `n` positions only,
            `[B, n, d]` (e.g. `n = 1` for a `[CLS]` pooling). Every layer but the last needs
            all positions (the next layer's keys and values); the last one computes its
            queries, residuals, norms and feedforward, and the final norm, on the `n` rows
            alone where its block allows (`TransformerBlock.output_length`, not with shared
            score biases, whose table spans the first layer's `T` queries). The rows equal
            those of the full stack.

    Returns:
        `[B, T, d]` (`[B, n, d]` with `output_length`), or `(outputs, new_caches)` when a
        cache is given. When the blocks return dicts at the caller's request (e.g.
        `return_attention_scores=True`), one dict: `"outputs"`, `"cache"` (the tuple of new
        caches) when a cache is given, and each other entry as a tuple with one value per
        layer (`None` for a layer without it).

    Example:
    >>> block = TransformerBlock(MultiHeadAttention(4), FeedForward(64), norm_placement="pre")
    >>> stack = TransformerStack(block, num_layers=3)
    >>> y = stack(keras.random.normal((2, 5, 16)))
    """

    def __init__(self, block, num_layers, final_norm=None, share_attention_maps=1,
                 share_score_biases=False, fusion=None, fusion_normalization=None,
                 layer_drop=0.0, layer_drop_rescale="inference", layer_drop_seed=None,
                 share_layers=None, multistep=None, learn_multistep=False,
                 depth_initialization=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive int. Received: num_layers={num_layers}")
        self._block_config = serialize_templates(block)
        templates = self._templates()
        built = [clone_layer(config) for config in templates]
        template = built[0]
        self.share_attention_maps = check_map_sharing(share_attention_maps, template)
        for other in built[1:]:
            check_map_sharing(share_attention_maps, other)
        self.share_score_biases = check_bias_sharing(share_score_biases, built)
        self.num_layers = num_layers
        norm_placement = template.norm_placement
        self.final_norm = (norm_placement in FINAL_NORM_PLACEMENTS if final_norm is None
                           else bool(final_norm))
        owners = layer_owners(share_layers, num_layers)
        self.share_layers = list(share_layers) if isinstance(share_layers, (list, tuple)) else (
            share_layers)
        self.blocks = []
        dtype = keras.dtype_policies.serialize(self.dtype_policy)
        for index in range(num_layers):
            if owners[index] != index:  # the same layer object: one set of weights
                self.blocks.append(self.blocks[owners[index]])
                continue
            config = templates[index % len(templates)]
            if self.share_score_biases and index:
                config = without_biases(config)
            self.blocks.append(clone_layer(config, name=f"block_{index}", dtype=dtype))
            if self.share_score_biases and index:
                self.blocks[-1].mixer.share_biases(self.blocks[0].mixer.biases)
        # One evaluation of the shared biases per call, unless a layer's rolling cache
        # gives it key positions of its own.
        self._computes_biases_once = self.share_score_biases and not any(
            attends_over_own_positions(block.mixer) for block in self.blocks)
        self.depth_initialization = depth_init.check_depth_initialization(depth_initialization)
        if self.depth_initialization is not None:
            depth_init.check_blocks(self.blocks)
        self.output_norm = None
        if self.final_norm:
            self.output_norm = make_normalization(
                template.normalization,
                template.epsilon,
                self.dtype_policy,
                "output_norm",
            )
        self.multistep, self.layer_drop_seed = check_depth_options(
            fusion, fusion_normalization, layer_drop, layer_drop_rescale, layer_drop_seed,
            multistep, learn_multistep)
        self.fusion, self.fusion_normalization = fusion, fusion_normalization
        self.layer_drop_rescale, self.learn_multistep = layer_drop_rescale, learn_multistep
        self.fusions, dropper, self.multisteps = depth_option_layers(
            num_layers, template.epsilon, fusion, fusion_normalization, layer_drop,
            layer_drop_rescale, self.layer_drop_seed, self.multistep, learn_multistep,
            self.dtype_policy)
        self.layer_drop = dropper.rate
        # Without layer drop the stack holds no seed generator (no extra variable).
        self.layer_dropper = dropper if self.layer_drop else None

    def _templates(self):
        """The serialised template configs: layer `l` is built from `templates[l % len]`."""
        config = self._block_config
        return config if isinstance(config, list) else [config]

    def build(self, inputs_shape, encoder_outputs_shape=None):
        for block in self.distinct_blocks:
            block.build(inputs_shape, encoder_outputs_shape)
        layers_shape = tuple(inputs_shape[:-1])
        for fusion in self.fusions:
            fusion.build(layers_shape + (fusion.num_inputs, inputs_shape[-1]))
        for index, step in enumerate(self.multisteps):
            steps = layers_shape + (index + 1, inputs_shape[-1])
            step.build(steps, steps)
        if self.output_norm is not None:
            self.output_norm.build(inputs_shape)
        self._initialize_by_depth()

    def _initialize_by_depth(self):
        """Re-draws the blocks' projection kernels by `depth_initialization` (survey §4.2.2)."""
        if self.depth_initialization is not None:
            depth_init.initialize_by_depth(self.blocks, self.depth_initialization)

    @property
    def distinct_blocks(self):
        """The blocks that hold weights: one per group of layers sharing parameters."""
        seen = []
        for block in self.blocks:
            if not any(block is other for other in seen):
                seen.append(block)
        return seen

    @property
    def _combines_layers(self):
        """Whether a layer's output is more than its block's output (layer drop, multi-step
        residuals or fusion), which needs every layer's full outputs."""
        return bool(self.fusions or self.multisteps or self.layer_drop)

    def prune(self, layers):
        """A new stack with the layers `layers` only (sorted, distinct 0-based indices), each
        keeping its weights: the pruning of dropped layers at inference (survey §4.2.4).
        See `layer_sharing.prune_stack`."""
        return prune_stack(self, layers)

    def init_cache(self, batch_size, max_length, dtype=None, encoder_length=None):
        """A tuple with one cache per block."""
        kwargs = {} if encoder_length is None else {"encoder_length": encoder_length}
        return tuple(b.init_cache(batch_size, max_length, dtype, **kwargs) for b in self.blocks)

    def output_state(self, hidden):
        """What the stack returns for the state `hidden` `[B, T, d]` of its last layer, or of
        any layer it stopped at: the final norm applied (pre-norm stacks), or `hidden`."""
        return hidden if self.output_norm is None else self.output_norm(hidden)

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        encoder_outputs=None,
        encoder_padding_mask=None,
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
        runner = LayerRunner(self, padding_mask, attention_mask, encoder_outputs,
                             encoder_padding_mask, use_causal_mask, cache, cache_index, training,
                             mixer_arguments(kwargs, mixer_options),
                             share_bias_terms=self._computes_biases_once)
        # The last block computes the first positions itself, or the stack slices its outputs.
        last_rows = output_length
        if (self._computes_biases_once or self._combines_layers
                or not isinstance(self.blocks[-1], TransformerBlock)):
            last_rows = None
        carry, collected = runner.start(inputs), {}
        for index in range(self.num_layers):
            rows = last_rows if index == self.num_layers - 1 else None
            carry, extras = runner.run_layer(index, carry, output_length=rows)
            for key, value in (extras or {}).items():
                collected.setdefault(key, [None] * self.num_layers)[index] = value
        outputs = carry["hidden"]
        if output_length is not None and last_rows is None:
            outputs = outputs[:, :output_length]
        outputs = self.output_state(outputs)
        new_caches = None if cache is None else runner.new_caches(carry)
        return self._results(outputs, new_caches, collected, cache is not None)

    def run_layers(self, inputs, control=None, padding_mask=None, attention_mask=None,
                   encoder_outputs=None, encoder_padding_mask=None, use_causal_mask=None,
                   cache=None, cache_index=None, training=None, **kwargs):
        """The layers one at a time under a per-layer `control` (a `LayerControl`; survey
        §5.6: run or skip a layer per row, stop rows, read each layer's state), with every
        option of the stack applied to each layer it runs (see `LayerRunner`).

        The call arguments are those of `call` (no `output_length`); the layers' positions-only
        score biases are computed by each layer. Not a Keras call: the blocks' calls are
        recorded one by one, so it also builds a functional graph from symbolic inputs.

        Returns:
            A dict: `"outputs"` `[B, T, d]`, `output_state` of the last state (a stopped
            row's frozen state); `"control"`, the control's final carry; `"cache"`, the
            tuple of new caches when a cache is given.
        """
        check_rank("inputs", inputs, 3, "[batch, length, dim]")
        if not isinstance(inputs, keras.KerasTensor):
            # As `Layer.__call__` does for `call`: arrays become tensors of the compute dtype.
            inputs = ops.convert_to_tensor(inputs, dtype=self.compute_dtype)
        runner = LayerRunner(self, padding_mask, attention_mask, encoder_outputs,
                             encoder_padding_mask, use_causal_mask, cache, cache_index, training,
                             mixer_arguments(kwargs))
        carry, state = runner.run(inputs, LayerControl() if control is None else control)
        result = {"outputs": self.output_state(carry["hidden"]), "control": state}
        if cache is not None:
            result["cache"] = runner.new_caches(carry)
        return result

    def _results(self, outputs, new_caches, collected, has_cache):
        if not collected:
            return (outputs, tuple(new_caches)) if has_cache else outputs
        results = {key: tuple(values) for key, values in collected.items()}
        results["outputs"] = outputs
        if has_cache:
            results["cache"] = tuple(new_caches)
        return results

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, *args, cache=None, mixer_options=None,
                            output_length=None, **kwargs):
        outputs = keras.KerasTensor(first_positions(inputs.shape, output_length),
                                    dtype=self.compute_dtype)
        new_caches = [None] * self.num_layers if cache is None else list(new_specs(tuple(cache)))
        extra = mixer_arguments(kwargs, mixer_options)
        collected = {}
        if extra:
            for index, block in enumerate(self.blocks):
                layer_cache = None if cache is None else cache[index]
                spec = block.compute_output_spec(inputs, cache=layer_cache, **extra)
                extras = split_results(spec, cache is not None)[2]
                for key, value in (extras or {}).items():
                    collected.setdefault(key, [None] * self.num_layers)[index] = value
        return self._results(outputs, new_caches, collected, cache is not None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "block": self._block_config,
                "num_layers": self.num_layers,
                "final_norm": self.final_norm,
                "share_attention_maps": self.share_attention_maps,
                "share_score_biases": self.share_score_biases,
                "fusion": self.fusion,
                "fusion_normalization": self.fusion_normalization,
                "layer_drop": self.layer_drop,
                "layer_drop_rescale": self.layer_drop_rescale,
                "layer_drop_seed": self.layer_drop_seed,
                "share_layers": self.share_layers,
                "multistep": self.multistep,
                "learn_multistep": self.learn_multistep,
                "depth_initialization": None if self.depth_initialization is None
                else dict(self.depth_initialization),
            }
        )
        return config
