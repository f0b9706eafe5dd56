"""Decoder-only language model with early exits and token-level adaptive depth (survey §5.6)."""

import contextlib
import functools

import keras
from keras import ops

from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.sampling import restart_seed
from keras_xf.generation.sampling import sampler_from_arguments
from keras_xf.layers.blocks.layer_state_reader import LayerStateReader
from keras_xf.layers.heads.early_exit_heads import EarlyExitHeads
from keras_xf.models.adaptive.early_exit_control import EarlyExitControl
from keras_xf.models.backbones.arguments import check_adaptive_backbone
from keras_xf.models.backbones.arguments import check_exit_heads
from keras_xf.models.backbones.arguments import check_exit_layers
from keras_xf.models.backbones.arguments import check_exit_loss_weights
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.models.generative.causal_lm import CausalLM
from keras_xf.models.generative.generation_arguments import check_repetition_penalty
from keras_xf.models.generative.generation_arguments import output_length_request
from keras_xf.models.generative.text_generation import generates_text
from keras_xf.ops.exit_criteria import check_exit_rule
from keras_xf.training.chunked_cross_entropy import ChunkedCrossEntropy
from keras_xf.training.early_exit_loss import EarlyExitLoss
from keras_xf.training.early_exit_loss import final_exit_accuracy


class _ExitScope:
    """The exit rule `(criterion, threshold)` (or `None`) and the generated positions
    (bool `[B, T]`) of an adaptive `generate`."""

    def __init__(self, rule, generated):
        self.rule = rule
        self.generated = generated


@keras.saving.register_keras_serializable(package="keras_xf")
class EarlyExitCausalLM(CausalLM):
    """`p_i^l = Softmax(Norm(s_i^l) · W_o^l)` at each exit layer `l` of a causal LM.

    A `CausalLM` whose chosen layers each carry an early-exit classifier over the vocabulary
    (survey §5.6, token-level depth-adaptive models): the state `s_i^l` after layer `l`
    goes through the stack's final norm (pre-norm stacks) and an output layer. The model's
    output is every exit's logits; `fit` trains on the weighted sum of the exits' token
    cross-entropies (`EarlyExitLoss`, the default of `compile`), the padding mask given as
    `sample_weight`.

    `generate(..., exit_criterion, exit_threshold)` decodes with token-level adaptive depth:
    each generated token runs the layers until its criterion holds at an exit (entropy,
    maximum probability, state similarity or patience, `keras_xf.ops.exit_criteria`; the
    last exit always stops) and takes that exit's prediction; the layers above are skipped
    for it. The keys and values those layers would have cached come from the exit state
    copied upward (the survey's "duplicate the layer from which we exit"): layer `m > l`
    caches its keys and values of `s_i^l`, as if `s_i^m = s_i^l`. Prompt tokens run every
    layer (in the prefill as in the loop); the token that predicts a generated position
    exits adaptively. The layers run through the stack's runner under an
    `EarlyExitControl` (`TransformerStack.run_layers`), so every option of the stack
    applies (shared and hybrid layers, layer drop, multi-step residuals, fusion, shared
    attention maps; `s_i^l` is the input of the next layer). Under static shapes each
    layer runs inside `keras.ops.cond`, which skips it when every row has exited (the
    skipped branch fills the layer's cache from the frozen states by its mixer sub-layer
    alone); a row that exits while others continue is frozen. See `docs/design.md`.

    Args:
        backbone: a causal `TransformerBackbone` whose stack is a `TransformerStack` (any
            options; not reversible), or its arguments as keywords.
        exit_layers: optional list of increasing layer numbers `1 … L` carrying an exit,
            ending with the last layer `L`. Default: every layer.
        exit_heads: `"shared"` (default: every exit uses the LM's output layer, the tied
            token embedding unless the backbone has `tie_embeddings=False`) or
            `"per_layer"` (an output layer `W_o^l` per exit; the last exit keeps the LM's
            own, so the final prediction is `CausalLM`'s).
        exit_loss_weights: optional list of non-negative floats, one per exit (`None`: 1
            each).
        pad_token_id: int, the padding id used when packing prompts.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}`. Outputs: float32 logits of
    every exit, `[B, E, T, V]`, the last exit last.

    Example:
    >>> lm = EarlyExitCausalLM(vocabulary_size=100, num_layers=4, hidden_dim=32,
    ...                        num_heads=4, intermediate_dim=64, norm_placement="pre",
    ...                        exit_layers=[2, 4])
    >>> lm.compile()  # EarlyExitLoss over the 2 exits
    >>> ids, exits = lm.generate([[5, 6, 7]], max_length=12, exit_criterion="entropy",
    ...                          exit_threshold=0.5, return_exit_layers=True)
    """

    # The `_ExitScope` of the adaptive `generate` that is running (set by `_exit_scope` for
    # the length of its generation function's trace or run, which the decoding hooks read);
    # `None` otherwise. One adaptive generation runs at a time per model.
    _active_exit_scope = None

    def __init__(self, backbone=None, exit_layers=None, exit_heads="shared",
                 exit_loss_weights=None, pad_token_id=0, preprocessor=None, name=None,
                 dtype=None, trainable=True, **backbone_kwargs):
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs,
                                 causal=True)
        check_adaptive_backbone(backbone, causal=True)
        exit_layers = check_exit_layers(exit_layers, backbone.num_layers)
        self.exit_layers = exit_layers
        self.exit_heads = check_exit_heads(exit_heads)
        self.exit_loss_weights = check_exit_loss_weights(exit_loss_weights, len(exit_layers))
        # The exits before the last own their output layers with "per_layer".
        self.heads = None
        if exit_heads == "per_layer" and len(exit_layers) > 1:
            self.heads = EarlyExitHeads(len(exit_layers) - 1,
                                        backbone.embeddings.vocabulary_size,
                                        dtype=backbone.dtype_policy, name="exit_heads")
        super().__init__(backbone=backbone, pad_token_id=pad_token_id,
                         preprocessor=preprocessor, name=name, dtype=dtype, trainable=trainable)

    def _functional_outputs(self, inputs):
        mask = ops.cast(inputs["padding_mask"], "bool")
        hidden = self.backbone.embeddings(inputs["token_ids"])
        reader = LayerStateReader(
            self.exit_layers,
            lambda exit_index, state: self.exit_logits(exit_index, self.exit_state(state)))
        result = self.backbone.transformer_stack.run_layers(hidden, reader, padding_mask=mask,
                                                            use_causal_mask=True)
        return ops.stack(result["control"]["values"], axis=1)

    @property
    def blocks(self):
        """The decoder's layers, in order."""
        return self.backbone.transformer_stack.blocks

    def exit_state(self, hidden):
        """`Norm(s^l)`: the stack's final norm on a layer output (pre-norm stacks), as the
        last layer's output gets it."""
        return self.backbone.transformer_stack.output_state(hidden)

    def exit_logits(self, exit_index, state):
        """Float32 logits `[B, T, V]` of exit number `exit_index` (0-based) on `Norm(s^l)`."""
        if self.heads is None or exit_index == len(self.exit_layers) - 1:
            return self._logits(state)
        return self.heads(state, exit_index=exit_index)

    def compile(self, optimizer="auto", loss="auto", weighted_metrics="auto", sampler="greedy",
                **kwargs):
        """`GenerativeTask.compile` with `EarlyExitLoss` (with `exit_loss_weights`) and the
        last exit's accuracy as defaults. `ChunkedCrossEntropy` is refused: the outputs are
        every exit's logits, not one output layer's."""
        if isinstance(loss, ChunkedCrossEntropy) or (
                isinstance(loss, str) and loss == "chunked_cross_entropy"):
            raise ValueError(
                "loss cannot be a ChunkedCrossEntropy for an EarlyExitCausalLM: its outputs "
                "are the logits of every exit. Received: loss=ChunkedCrossEntropy"
            )
        if isinstance(loss, str) and loss == "auto":
            loss = EarlyExitLoss(weights=self.exit_loss_weights)
        if isinstance(weighted_metrics, str) and weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.MeanMetricWrapper(final_exit_accuracy,
                                                                name="accuracy")]
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
                        sampler=sampler, **kwargs)

    # Adaptive-depth generation ------------------------------------------------------------
    @generates_text
    def generate(self, inputs, max_length=None, stop_token_ids="auto", sampler=None,
                 use_cache=True, exit_criterion=None, exit_threshold=None,
                 return_exit_layers=False, *, max_new_tokens=None, temperature=None,
                 top_k=None, top_p=None, seed=None, repetition_penalty=None):
        """`CausalLM.generate`, with token-level adaptive depth when `exit_criterion` is given.

        Args:
            inputs, max_length, stop_token_ids, sampler, use_cache, max_new_tokens,
                temperature, top_k, top_p, seed, repetition_penalty: as `CausalLM.generate`
                (text too, with a preprocessor: a string gives a string, a list a list),
                adaptive depth included (compiled once per output-length bucket).
            exit_criterion: `None` (every token runs every layer: `CausalLM.generate`),
                `"entropy"`, `"max_probability"`, `"state_similarity"` or `"patience"`.
            exit_threshold: the criterion's threshold (entropy in nats, a probability, a
                cosine, or for `"patience"` an int `k ≥ 1`).
            return_exit_layers: bool; also return the exit layer of every token.

        Returns:
            The tokens as `CausalLM.generate` gives them; with `return_exit_layers=True` a
            pair `(tokens, exit_layers)`: int32 exit layers (1 … L) aligned with the
            left-aligned output ids, `[B, max_length]` for dict and array prompts (a list
            per row, or one array, aligned with list and 1-D results), 0 on prompt tokens
            and on positions past a row's end. Text prompts give `(text, exit_layers)`: the
            exit layers of each prompt's ids (a list per text, one list for a string),
            aligned with the generated ids the text is decoded from.

        Raises:
            ValueError, naming the argument: as `CausalLM.generate`; for an unknown
                criterion, a threshold that does not suit it or without a criterion,
                `use_cache=False` with adaptive depth, `return_exit_layers` that is not a
                bool or with beam search.
        """
        rule = None
        if exit_criterion is not None:
            rule = check_exit_rule(exit_criterion, exit_threshold, "exit_criterion",
                                   "exit_threshold")
        elif exit_threshold is not None:
            raise ValueError("exit_threshold needs an exit_criterion. Received: "
                             f"exit_threshold={exit_threshold!r}, exit_criterion=None")
        if not isinstance(return_exit_layers, bool):
            raise ValueError("return_exit_layers must be a bool. Received: "
                             f"return_exit_layers={return_exit_layers!r}")
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                        repetition_penalty=repetition_penalty)
        if rule is None and not return_exit_layers:
            return super().generate(inputs, max_length=max_length,
                                    stop_token_ids=stop_token_ids, sampler=sampler,
                                    use_cache=use_cache, max_new_tokens=max_new_tokens,
                                    **sampling)
        if use_cache is not True:
            raise ValueError(
                "use_cache must be True with an exit_criterion or return_exit_layers: adaptive "
                f"depth fills the skipped layers' caches. Received: use_cache={use_cache!r}"
            )
        sampler = sampler_from_arguments(sampler, temperature, top_k, top_p)
        repetition_penalty = check_repetition_penalty(repetition_penalty)
        resolved = self._resolve_sampler(sampler)
        if return_exit_layers and _is_beam_search(resolved):
            raise ValueError(
                "return_exit_layers=True cannot follow beam search, whose final beams are "
                "chosen after the loop. Received: return_exit_layers=True with sampler="
                f"{type(resolved).__name__}"
            )
        stop_token_ids = self._check_stop_token_ids(stop_token_ids)
        prompts, extras, unpack = self._generate_inputs(
            inputs, output_length_request(max_length, max_new_tokens))
        self._check_generate_inputs(prompts, extras)
        length = prompts.token_ids.shape[1]
        packed = self._bucketed_inputs(prompts, extras)
        function = self._exit_generate_function(
            rule, sampler, stop_token_ids, self._prefill_length(prompts, packed),
            return_exit_layers, repetition_penalty)
        if seed is not None:
            restart_seed(resolved, seed)
        self._generate_functions.count_program(function, packed.values())
        outputs = function({key: ops.convert_to_tensor(value) for key, value in packed.items()},
                           ops.convert_to_tensor(length, "int32"))
        # Computed in the output-length bucket, cut back to the length asked.
        outputs = {key: ops.convert_to_numpy(value)[:, :length] for key, value in
                   outputs.items()}
        tokens = unpack(outputs["token_ids"], outputs["padding_mask"])
        if not return_exit_layers:
            return tokens
        form = "array" if prompts.form == "dict" else None
        return tokens, prompts.unpack(outputs["exit_layers"], outputs["padding_mask"], form=form)

    def _exit_generate_function(self, rule, sampler, stop_token_ids, prefill_length,
                                return_exit_layers, repetition_penalty):
        """The compiled adaptive generation for these settings, kept with the model's other
        generation functions (reset by `compile`). No TorchScript trace of the loop body on
        PyTorch: a trace would freeze the Python branch of each layer's `keras.ops.cond`."""
        sampler_key = self._default_sampler_key if sampler is None else sampler
        key = ("early_exit", rule, sampler_key, stop_token_ids, prefill_length,
               return_exit_layers, repetition_penalty)
        if key not in self._generate_functions:
            resolved = self._resolve_sampler(sampler)
            step = functools.partial(self._exit_generate_step, rule=rule,
                                     stop_token_ids=stop_token_ids, sampler=resolved,
                                     prefill_length=prefill_length,
                                     return_exit_layers=return_exit_layers,
                                     repetition_penalty=repetition_penalty)
            self._generate_functions[key] = compile_generate_function(self, step, resolved)
        return self._generate_functions[key]

    def _exit_generate_step(self, inputs, output_length, rule, stop_token_ids, sampler,
                            prefill_length, return_exit_layers, repetition_penalty):
        """`generate_step` under the exit rule, up to `output_length` (an int32 scalar
        tensor); with `return_exit_layers`, adds
        `"exit_layers"` `[B, L]` to its outputs (read from the loop's final cache within the
        same trace)."""
        generated = ops.logical_not(ops.cast(inputs["padding_mask"], "bool"))
        final = {}
        if return_exit_layers:
            sampler = _recording_sampler(sampler, final)
        with self._exit_scope(rule, generated):
            outputs = self.generate_step(inputs, stop_token_ids=stop_token_ids,
                                         sampler=sampler, use_cache=True,
                                         prefill_length=prefill_length,
                                         output_length=output_length,
                                         repetition_penalty=repetition_penalty)
        if not return_exit_layers:
            return outputs
        kept = ops.logical_and(ops.cast(outputs["padding_mask"], "bool"), generated)
        exit_layers = ops.where(kept, final["cache"]["exit_layers"], 0)
        return dict(outputs, exit_layers=exit_layers)

    @contextlib.contextmanager
    def _exit_scope(self, rule, generated):
        """Within this context the generation hooks decode with adaptive depth under `rule`;
        `generated`: bool `[B, T]`, the positions to generate."""
        previous = self._active_exit_scope
        self._active_exit_scope = _ExitScope(rule, generated)
        try:
            yield
        finally:
            self._active_exit_scope = previous

    def _current_exit_scope(self):
        return self._active_exit_scope

    def _init_generation_cache(self, batch_size, max_length, context):
        cache = super()._init_generation_cache(batch_size, max_length, context)
        scope = self._current_exit_scope()
        if scope is None:
            return cache
        # Loop state next to the layer caches: which positions are generated, and the exit
        # layer of each generated token.
        return {"layers": cache, "generated": scope.generated,
                "exit_layers": ops.zeros((batch_size, max_length), "int32")}

    def _prefill(self, token_ids, cache, context):
        if self._current_exit_scope() is None:
            return super()._prefill(token_ids, cache, context)
        hidden, layers = super()._prefill(token_ids, cache["layers"], context)
        return hidden, dict(cache, layers=layers)

    @property
    def _traced_decode_step(self):
        # Eager PyTorch runs `keras.ops.cond` as a Python branch, which a trace would freeze.
        if self._current_exit_scope() is not None:
            return self._decode_step
        return super()._traced_decode_step

    def _decode_token(self, token_ids, cache, cache_index):
        scope = self._current_exit_scope()
        if scope is None:
            return super()._decode_token(token_ids, cache, cache_index)
        return self._adaptive_decode_token(token_ids, cache, cache_index, scope.rule)

    def _adaptive_decode_token(self, token_ids, cache, cache_index, rule):
        """One token `[B, 1]` at `cache_index` through the layers until each row exits; the
        logits `[B, V]` of each row's exit, its `Norm(s^l)` `[B, d]` and the new cache."""
        generated = cache["generated"]
        positions = ops.arange(ops.shape(generated)[1], dtype="int32")[None, :]
        # The position this token predicts; a lookahead past the end matches none.
        predicted = ops.equal(positions, ops.cast(cache_index, "int32") + 1)
        adaptive = ops.any(ops.logical_and(generated, predicted), axis=1)
        hidden = self.backbone.embeddings(token_ids, start_index=cache_index)

        def read_state(hidden):
            return ops.cast(self.exit_state(hidden)[:, 0], "float32")

        def read_exit(exit_index, hidden):
            state = self.exit_state(hidden)
            return (self.exit_logits(exit_index, state)[:, 0],
                    ops.cast(state[:, 0], "float32"))

        control = EarlyExitControl(self.exit_layers, len(self.blocks),
                                   self._output_embeddings.vocabulary_size, read_exit,
                                   read_state, rule=rule, eligible=adaptive)
        result = self.backbone.transformer_stack.run_layers(
            hidden, control, use_causal_mask=True, cache=tuple(cache["layers"]),
            cache_index=cache_index)
        carry = result["control"]
        record = ops.logical_and(predicted, adaptive[:, None])
        exit_layers = ops.where(record, carry["exit_layer"][:, None], cache["exit_layers"])
        new_cache = dict(cache, layers=result["cache"], exit_layers=exit_layers)
        return carry["logits"], result["outputs"][:, 0], new_cache

    def get_config(self):
        config = super().get_config()
        config.update({"exit_layers": list(self.exit_layers), "exit_heads": self.exit_heads,
                       "exit_loss_weights": self.exit_loss_weights})
        return config


def _is_beam_search(sampler):
    import keras_hub

    return isinstance(sampler, keras_hub.samplers.BeamSampler)


def _recording_sampler(sampler, final):
    """A copy of a keras-hub `sampler` that keeps its loop's final cache in
    `final["cache"]` (the second loop variable of every keras-hub sampler)."""
    import copy

    run_loop = sampler.run_loop

    def recording_run_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        loop_vars = run_loop(cond, body, model=model, loop_vars=loop_vars,
                             maximum_iterations=maximum_iterations)
        final["cache"] = loop_vars[1]
        return loop_vars

    recording = copy.copy(sampler)
    recording.run_loop = recording_run_loop
    return recording
