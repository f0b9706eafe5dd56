"""The base of the generating tasks: `generate` written once (survey §2.7, §6)."""

import dataclasses
import functools

import keras
import numpy as np
from keras import ops

from keras_xf.export import GenerationSteps
from keras_xf.generation.cache_order import check_use_cache
from keras_xf.generation.cache_order import keeps_recurrent_state
from keras_xf.generation.cache_order import writes_cache_in_order
from keras_xf.generation.compile import CompiledFunctions
from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.generation_variables import GenerationVariables
from keras_xf.generation.prompts import output_padding_mask
from keras_xf.generation.prompts import pack_prompts
from keras_xf.generation.prompts import shortest_prompt
from keras_xf.generation.sampling import SAMPLER_NAMES
from keras_xf.generation.sampling import check_rule_sampler
from keras_xf.generation.sampling import get_sampler
from keras_xf.generation.sampling import limit_length
from keras_xf.generation.sampling import restart_seed
from keras_xf.generation.sampling import sampler_from_arguments
from keras_xf.generation.sampling import with_repetition_penalty
from keras_xf.generation.sampling import sample_with_stop_rule
from keras_xf.generation.sampling import stops_on_tensor
from keras_xf.generation.traced_loop import trace_decoding_step
from keras_xf.generation.traced_loop import traced_run_loop
from keras_xf.generation.traced_loop import traces_whole_loop_body
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.generative.generation_arguments import build_stop_classifier
from keras_xf.models.generative.generation_arguments import check_stop_margin
from keras_xf.models.generative.text_generation import generates_text
from keras_xf.models.generative.generation_arguments import check_generate_inputs
from keras_xf.models.generative.generation_arguments import check_repetition_penalty
from keras_xf.models.generative.generation_arguments import output_length_request
from keras_xf.models.generative.generation_defaults import GenerationDefaults
from keras_xf.models.generative.streaming import StreamingGeneration
from keras_xf.ops.checks import check_positive_int
from keras_xf.training.chunked_cross_entropy import ChunkedCrossEntropy
from keras_xf.training.chunked_loss_model import chunked_loss_metrics


@keras.saving.register_keras_serializable(package="keras_xf")
class GenerativeTask(StreamingGeneration, GenerationDefaults, FunctionalModel):
    """A functional task that generates tokens `y_i ~ P(y_i | y_<i, c)` one at a time with a
    cache, in one compiled loop (keras-hub's `CausalLM` base is the model).

    The base owns `compile` (defaults: AdamW, sparse cross-entropy on logits, accuracy, and
    the `sampler` of `generate`), `generate`, `generate_step`, the compiled loop and its cache
    of compiled functions, samplers, stop tokens, prompt packing, the prefill and the traced
    PyTorch step. `c` is what conditions the text: nothing (`CausalLM`), a source sequence
    (`Seq2SeqLM`) or an image (`VisionLanguageLM`).

    Decoding with the cache: `c` is encoded once; one parallel pass (the prefill) writes
    `c` and the first `p` positions into the cache, `p` the shortest prompt's length rounded
    up to a power of two; then each step, from the shortest prompt's end, feeds the token at
    `i - 1` and chooses the token at `i`, keeping prompt tokens. A cache written in order (a
    recurrent state, which must see every token exactly once, or a rolling cache) has `p`
    rounded down: the pass writes `p - 1` tokens and the steps start at `p`. Without the
    cache each step reruns the full forward pass over the fixed-width sequence: the
    reference the cached path equals.

    A subclass supplies only these hooks:
    - `prompt_keys`: the names of its prompt ids and mask (default `token_ids`,
      `padding_mask`);
    - `_generate_inputs(inputs, max_length)`: `(PackedPrompts, extras, unpack)`: the user's
      inputs as packed prompts and a dict of numpy extra inputs (`encoder_token_ids`,
      `images`, …), and a function giving results back in the user's structure;
    - `_generation_context(**extras)`: `c` encoded (batch-major tensors, or `()`);
    - `_init_generation_cache(batch_size, max_length, context)`: the empty cache;
    - `_prefill(token_ids, cache, context)`: `(hidden [B, t, d] or None, cache)`, the cache
      filled with `c` and the prompt tokens `token_ids [B, t]` (`None`: `c` alone);
    - `_decode_token(token_ids, cache, cache_index)`: one token `[B, 1]` at `cache_index` to
      `(logits [B, V], hidden [B, d], cache)`;
    - `_uncached_hidden(token_ids, context)`: the full pass, `[B, L, d]`;
    - `_output_embeddings`: the token embedding whose reverse gives the logits;
    - `_generation_stack`: the decoder `TransformerStack` that the cache belongs to.

    `export_endpoints()` declares these steps to `keras_xf.export` (`GenerationSteps`). A
    task whose logits are its output embedding reversed and nothing more can also be a
    `keras_xf.training.ChunkedLossModel` (`CausalLM`), and then train with
    `ChunkedCrossEntropy`.

    Args:
        *args, **kwargs: the functional `keras.Model` arguments of the subclass.
        pad_token_id: int, the id that pads prompts.
    """

    prompt_keys = ("token_ids", "padding_mask")

    def __init__(self, *args, pad_token_id=0, **kwargs):
        pad_token_id = check_positive_int("pad_token_id", pad_token_id, minimum=0)
        super().__init__(*args, **kwargs)
        self.pad_token_id = pad_token_id
        self._default_stop_token_ids = ()
        self._set_sampler("greedy")

    def token_vocabulary_sizes(self):
        """`FunctionalModel.token_vocabulary_sizes`: the prompt ids (`prompt_keys[0]`) index
        the output vocabulary."""
        return {**super().token_vocabulary_sizes(),
                self.prompt_keys[0]: self._output_embeddings.vocabulary_size}

    def compile(self, optimizer="auto", loss="auto", weighted_metrics="auto", sampler="greedy",
                **kwargs):
        """Keras `compile` with defaults: AdamW, sparse cross-entropy on logits, accuracy.

        `sampler` (a keras-hub sampler or its name) is the default of `generate`.

        `loss=ChunkedCrossEntropy(...)` (or `"chunked_cross_entropy"`) trains and evaluates
        without the `[B, T, V]` logits: the forward pass of `fit` and `evaluate` stops at
        the hidden states and the loss forms the logits chunk by chunk (see
        `ChunkedCrossEntropy`); `predict`, `generate` and calls still give logits. Metrics
        on the logits cannot be computed then: `weighted_metrics="auto"` becomes none, and
        other metrics or `loss_weights` raise a `ValueError`.
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
        if isinstance(loss, str) and loss == "chunked_cross_entropy":
            loss = ChunkedCrossEntropy()
        if isinstance(loss, ChunkedCrossEntropy):
            weighted_metrics = chunked_loss_metrics(self, weighted_metrics, **kwargs)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        self._set_sampler(sampler)
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)

    def _set_sampler(self, sampler):
        # A known name is resolved when first used: importing keras-hub takes seconds and
        # hundreds of MB, which a model that never generates need not pay.
        if not (isinstance(sampler, str) and sampler in SAMPLER_NAMES):
            sampler = get_sampler(sampler)
        self._sampler = sampler
        # A default given by name shares its compiled functions with calls naming it.
        self._default_sampler_key = sampler
        self._generate_functions = CompiledFunctions()

    @property
    def sampler(self):
        """The default keras-hub sampler of `generate` (set by `compile`; greedy)."""
        if isinstance(self._sampler, str):
            self._sampler = get_sampler(self._sampler)
        return self._sampler

    # Generation -----------------------------------------------------------------------
    @generates_text
    def generate(self, inputs, max_length=None, stop_token_ids="auto", sampler=None,
                 use_cache=True, stop_classifier=None, stop_margin=0.0, *, max_new_tokens=None,
                 temperature=None, top_k=None, top_p=None, seed=None, repetition_penalty=None):
        """Generates continuations of prompts with a cache, in one compiled loop.

        Args:
            inputs: the prompts, in the forms the task's docstring lists. Prompt ids come as
                a dict with the ids and an optional padding mask (ids padded to the output
                length, left or right), a padded 2-D array or a 1-D prompt (entries equal to
                `pad_token_id` are padding), or a list of lists (ragged, every entry a
                token): all give the same tokens.
            max_length: the output length; defaults to a prompt dict's width, else the
                model's `max_sequence_length`. Not with `max_new_tokens`.
            stop_token_ids: ids that end a row (generation stops when every row has one);
                its mask ends after the first one generated. `"auto"` (the default): the
                model's own `stop_token_ids` (a checkpoint's end ids); `None` or `()`: none.
            sampler: a keras-hub sampler or its name (`"top_p"` keeps p = 0.9); defaults to
                the one given to `compile` (greedy).
            use_cache: bool; `False` reruns the full forward pass at every step (the
                reference for the cached path, which gives the same tokens).
            stop_classifier: optional `StopClassifier` `f_stop` (survey §5.6): after each
                step it reads the top-layer state `s_i` of the newest generated token, and
                the row ends at `i` (padding after it, as after a stop id) once
                `Pr(stop|s_i) ≥ Pr(nonstop|s_i) + stop_margin`. Works with stop ids (a row
                ends at whichever comes first) and every sampler but beam and contrastive
                search.
            stop_margin: float `θ_stop` in [-1, 1], the margin of that rule (equivalently
                `Pr(stop|s_i) ≥ (1 + θ_stop) / 2`); only with `stop_classifier`.
            max_new_tokens: int, the output length as the longest prompt's length plus this
                many tokens (transformers' argument); not with `max_length`.
            temperature, top_k, top_p: sample instead of the default sampler, as
                transformers' arguments do: top-p (nucleus) sampling when `top_p` is given
                (among the `top_k` most likely tokens when that is given too), else top-k
                sampling when `top_k` is, else sampling from the whole distribution;
                `temperature` (default 1) divides the logits. `sampler` may name the kind
                (`"random"`, `"top_k"`, `"top_p"`) but not be a sampler object then.
            seed: int; the random sampler's generators restart from it at this call, so
                equal seeds give equal tokens (as a fresh `TopKSampler(seed=seed)` would).
                Without it draws go on from the sampler's state.
            repetition_penalty: float > 0 (transformers' `repetition_penalty`): the logits
                of tokens already in the row (prompt or generated) are divided by it where
                positive and multiplied by it where negative, before the sampler reads
                them; > 1 discourages repeats.

        Calls share compiled programs: one per sampler (name, object, the compile default,
        or the values of `temperature`, `top_k`, `top_p`; not the seed), stop ids, prefill
        length (the shortest prompt's length rounded to a power of two), stop
        classifier and repetition penalty, and per output-length bucket: outputs are
        computed in a buffer of the next power of two (at least 8, at most
        `max_sequence_length` when the output fits), the loop stops at the length asked,
        and the results are cut back to it (`generate_compile_count` counts the programs).

        Returns:
            The prompts' structure: a dict with ids and mask (prompts left-aligned, the mask
            covering prompt and generated tokens up to the stop token), an array
            `[B, max_length]`, a 1-D array, or lists of ids.

        Raises:
            ValueError, naming the argument: for prompts or extra inputs of the wrong rank,
                shape or batch size, empty prompts, prompt ids outside `[0,
                vocabulary_size)`, prompts longer than `max_length`, an output longer than a
                learned position table (`max_sequence_length`), both `max_length` and
                `max_new_tokens`, stop ids outside the vocabulary, an unknown sampler,
                sampling arguments that do not fit the sampler, a `seed` without a random
                sampler, a `repetition_penalty` that is not a positive number, a
                `stop_classifier` that is not a `StopClassifier` of the model's width or a
                `stop_margin` outside [-1, 1].

        Example:
        >>> lm = CausalLM(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2,
        ...               intermediate_dim=32, max_sequence_length=16)
        >>> lm.stop_token_ids = [2]                 # the model's default stop id
        >>> tokens = lm.generate([[5, 6, 7]], max_new_tokens=4)
        >>> sampled = lm.generate([[5, 6, 7]], max_new_tokens=4, top_p=0.9, temperature=0.7,
        ...                       seed=1, stop_token_ids=None)
        >>> len(sampled[0])
        7
        """
        check_use_cache(use_cache, self._generation_stack)
        stop_margin = check_stop_margin(stop_classifier, stop_margin)
        if stop_classifier is not None:
            self._build_stop_classifier(stop_classifier)
        sampler = sampler_from_arguments(sampler, temperature, top_k, top_p)
        repetition_penalty = check_repetition_penalty(repetition_penalty)
        stop_token_ids = self._check_stop_token_ids(stop_token_ids)
        prompts, extras, unpack = self._generate_inputs(
            inputs, output_length_request(max_length, max_new_tokens))
        self._check_generate_inputs(prompts, extras)
        length = prompts.token_ids.shape[1]
        packed = self._bucketed_inputs(prompts, extras)
        function = self.make_generate_function(
            sampler, stop_token_ids, use_cache,
            prefill_length=self._prefill_length(prompts, packed) if use_cache else None,
            stop_classifier=stop_classifier, stop_margin=stop_margin,
            repetition_penalty=repetition_penalty)
        if seed is not None:
            restart_seed(self._resolve_sampler(sampler), seed)
        self._generate_functions.count_program(function, packed.values())
        outputs = function({key: ops.convert_to_tensor(value) for key, value in packed.items()},
                           ops.convert_to_tensor(length, "int32"))
        ids_key, mask_key = self.prompt_keys
        return unpack(ops.convert_to_numpy(outputs[ids_key])[:, :length],
                      ops.convert_to_numpy(outputs[mask_key])[:, :length])

    def _check_generate_inputs(self, prompts, extras):
        check_generate_inputs(self.prompt_keys[0], prompts, extras, self._output_embeddings)

    def make_generate_function(self, sampler=None, stop_token_ids=None, use_cache=True,
                               prefill_length=None, stop_classifier=None, stop_margin=0.0,
                               repetition_penalty=None):
        """The compiled `generate_step` for these settings, made once and kept (reset by
        `compile`): keyed by the sampler (its name, `SamplerSpec`, the object, or the compile
        default), the stop ids, the cache flag, the prefill length, the stop classifier and
        margin, and the repetition penalty. The function takes the packed inputs and the
        output length (an int32 scalar tensor, at most their width: the loop stops there)."""
        sampler_key = self._default_sampler_key if sampler is None else sampler
        key = (sampler_key, stop_token_ids, use_cache, prefill_length)
        if stop_classifier is not None:
            key += (stop_classifier, stop_margin)
        if repetition_penalty is not None:
            key += (("repetition_penalty", repetition_penalty),)
        if key not in self._generate_functions:
            resolved = self._resolve_sampler(sampler)
            owner = self._loop_variables(stop_classifier)
            if stop_classifier is not None:
                check_rule_sampler(resolved)
            if use_cache:
                resolved = traced_run_loop(owner, resolved)

            # A partial rather than a closure: TensorFlow counts traces per function code,
            # so the closures of every model and setting would add up to a retracing warning.
            step = functools.partial(self._bounded_generate_step, stop_token_ids=stop_token_ids,
                                     sampler=resolved, use_cache=use_cache,
                                     prefill_length=prefill_length,
                                     stop_classifier=stop_classifier, stop_margin=stop_margin,
                                     repetition_penalty=repetition_penalty)
            self._generate_functions[key] = compile_generate_function(owner, step, resolved)
        return self._generate_functions[key]

    def _bounded_generate_step(self, inputs, output_length, **settings):
        return self.generate_step(inputs, output_length=output_length, **settings)

    def generate_step(self, inputs, stop_token_ids=None, sampler=None, use_cache=True,
                      prefill_length=None, stop_classifier=None, stop_margin=0.0,
                      output_length=None, repetition_penalty=None):
        """A compilable generation of one packed batch.

        Args:
            inputs: a dict of tensors: the prompt ids and mask under `prompt_keys` (prompts
                left-aligned, the mask marking them) and the task's extra inputs.
            stop_token_ids: a tuple of ids, or `None`; or a 1-D int tensor, possibly empty
                (exported generation: the loop checks it with `stops_on_tensor`).
            sampler: a keras-hub sampler; defaults to the compile one.
            use_cache: bool.
            prefill_length: an int: a parallel pass writes the first `prefill_length`
                positions (at most the width) and the loop starts at the shortest prompt's
                end or at `prefill_length`, whichever comes first; positions the pass wrote
                past the loop's start are written again before any query reads them. Where a
                cache must be written in order (a recurrent state, a rolling cache) it must
                be no larger than the shortest prompt: the pass then covers the tokens
                before it and the loop starts there (`PackedPrompts.prefill_length` picks
                it). `None`:
                the pass covers the whole width and the loop starts at the shortest prompt
                (as keras-hub does), except where a layer keeps a recurrent state (then 1). A
                scalar int tensor (exported generation, where the prompts are inputs): the
                pass covers the whole width and the loop starts there.
            stop_classifier: optional built `StopClassifier`; with it a row also ends where
                `stop_by_margin(Pr(stop|s_i), stop_margin)` holds at a generated position.
            stop_margin: float, `θ_stop`.
            output_length: `None` (the inputs' width), or an int32 scalar tensor at most
                that width: the loop ends there and the positions past it stay unwritten
                (outputs computed in a wider compile bucket).
            repetition_penalty: `None`, or a float > 0 applied to the logits of the tokens
                already in each row (`keras_xf.generation.penalize_repetition`).

        Returns:
            A dict with the ids and the output mask under `prompt_keys`.
        """
        sampler = self.sampler if sampler is None else sampler
        ids_key, mask_key = self.prompt_keys
        token_ids = inputs[ids_key]
        padding_mask = ops.cast(inputs[mask_key], "bool")
        extras = {key: value for key, value in inputs.items() if key not in self.prompt_keys}
        batch_size, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        index = shortest_prompt(padding_mask)
        context = self._generation_context(**extras)
        hidden = None
        if use_cache:
            cache, hidden, index = self._prefilled_cache(token_ids, context, prefill_length,
                                                         index)
            # A sampler whose whole loop body is traced needs no trace of the step inside it.
            traced_body = traces_whole_loop_body(sampler)
            next_logits = self._decode_step if traced_body else self._traced_decode_step
        else:
            # `c` travels as the loop state so that beam search repeats it with the rows.
            cache = context
            next_logits = self._uncached_step
        if repetition_penalty is not None:
            next_logits = with_repetition_penalty(next_logits, repetition_penalty)
        if output_length is not None:
            sampler = limit_length(sampler, ops.cast(output_length, "int32"))
        tensor_stops = stop_token_ids is not None and not isinstance(stop_token_ids, tuple)
        # With a stop classifier the rule's loop condition checks the stop ids itself.
        loop_stops = None if tensor_stops or stop_classifier is not None else stop_token_ids
        if tensor_stops and stop_classifier is None:
            sampler = stops_on_tensor(sampler, stop_token_ids)
        if loop_stops:
            # The loop ends once every row holds a stop id past its prompt, so the positions
            # still to generate must hold none: an id that is no stop id fills them.
            filler = next((i for i in (self.pad_token_id, *range(len(stop_token_ids) + 1))
                           if i not in stop_token_ids), self.pad_token_id)
            token_ids = ops.where(padding_mask, token_ids, ops.cast(filler, token_ids.dtype))
        arguments = dict(next=next_logits, prompt=token_ids, cache=cache, index=index,
                         mask=padding_mask, hidden_states=hidden)
        if stop_classifier is None:
            token_ids = sampler(stop_token_ids=loop_stops, model=self, **arguments)
        else:
            token_ids, lengths = sample_with_stop_rule(
                sampler, stop_probability=lambda state: stop_classifier.stop_probability(
                    state[:, None, :])[:, 0],
                margin=stop_margin, stop_token_ids=stop_token_ids,
                model=self._loop_variables(stop_classifier), **arguments)
        output_mask = output_padding_mask(token_ids, padding_mask, stop_token_ids)
        if stop_classifier is not None:
            output_mask = ops.logical_and(
                output_mask, ops.arange(max_length)[None, :] < lengths[:, None])
        if tensor_stops or stop_token_ids or stop_classifier is not None:
            # Past its end (a stop id, or the rule) a row holds padding, whatever the other
            # rows went on to do.
            token_ids = ops.where(output_mask, token_ids, ops.cast(self.pad_token_id, token_ids.dtype))
        return {ids_key: token_ids, mask_key: output_mask}

    def _prefilled_cache(self, token_ids, context, prefill_length, index):
        """The loop's starting state `(cache, hidden, index)`: the empty cache filled by one
        parallel pass over `c` and the first prompt tokens (see `generate_step`'s
        `prefill_length`; `index` is the shortest prompt's length, the start when
        `prefill_length` is `None`, or `None` where the caller starts the loop itself)."""
        batch_size, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        hidden = None
        cache = self._init_generation_cache(batch_size, max_length, context)
        if prefill_length is None and self._has_recurrent_cache():
            prefill_length = 1
        if prefill_length is None or not isinstance(prefill_length, (int, np.integer)):
            # Positions past the loop's start are written again by the loop.
            hidden, cache = self._prefill(token_ids, cache, context)
            if prefill_length is not None:
                index = ops.cast(prefill_length, "int32")
            return cache, hidden, index
        # The loop's first step feeds the token before its start. A recurrent state must
        # see it once and a rolling cache must be written in order, so the pass stops before
        # it; a full cache takes the same entry again.
        in_order = writes_cache_in_order(self._generation_stack)
        filled = prefill_length - 1 if in_order else prefill_length
        prefix = ops.slice(token_ids, (0, 0), (batch_size, filled)) if filled else None
        hidden, cache = self._prefill(prefix, cache, context)
        width = self._output_embeddings.embedding_dim
        if hidden is None:
            hidden = ops.zeros((batch_size, max_length, width),
                               self._generation_stack.compute_dtype)
        else:
            # Samplers that read hidden states expect one per output position.
            hidden = ops.pad(hidden, ((0, 0), (0, max_length - filled), (0, 0)))
        if not (index is None or in_order):
            prefill_length = ops.minimum(index, prefill_length)
        return cache, hidden, prefill_length

    def _decode_step(self, prompt, cache, index):
        """The cached step of the loop: feeds the token at `index - 1`; returns the logits
        `[B, V]` for position `index`, its hidden state and the new cache."""
        cache_index = index - 1
        last = ops.slice(prompt, (0, cache_index), (ops.shape(prompt)[0], 1))
        return self._decode_token(last, cache, cache_index)

    @property
    def _traced_decode_step(self):
        # One per model (traces are kept per input shapes); reset by `compile`.
        functions = self._generate_functions
        if functions.decode_step is None:
            functions.decode_step = trace_decoding_step(self, self._decode_step)
        return functions.decode_step

    def _uncached_step(self, prompt, context, index):
        """The reference step: the full forward pass, read at position `index - 1`."""
        hidden = ops.take(self._uncached_hidden(prompt, context), index - 1, axis=1)
        return self._logits(hidden[:, None])[:, 0], hidden, context

    def _logits(self, hidden):
        """float32 logits `[B, T, V]` of hidden states `[B, T, d]`."""
        return ops.cast(self._output_embeddings(hidden, reverse=True), "float32")

    def _has_recurrent_cache(self):
        return keeps_recurrent_state(self._generation_stack)

    def _prefill_cross_attention(self, cache, batch_size, **encoder_inputs):
        """The cache of a cross-attending decoder with only the cross-attention keys and
        values written: each layer's cache is `(own cache, cross-attention cache)`; one pad
        token run at position 0 fills the cross parts, and the own parts are kept as they
        were (a recurrent state must not see that token)."""
        token = ops.full((batch_size, 1), self.pad_token_id, "int32")
        _, _, filled = self.call_with_cache(token, cache, 0, **encoder_inputs)
        return tuple((own, cross) for (own, _), (_, cross) in zip(cache, filled))

    def _pack_prompts(self, prompts, max_length):
        """The task's prompts packed to `max_length` (see `pack_prompts`)."""
        return pack_prompts(
            prompts,
            max_length=max_length,
            default_max_length=self._output_embeddings.max_sequence_length,
            pad_token_id=self.pad_token_id,
            keys=self.prompt_keys,
        )

    def _loop_variables(self, stop_classifier):
        """What the compiled loop takes its variables from: the model, and the stop
        classifier's weights beside it when there is one."""
        return self if stop_classifier is None else GenerationVariables(self, stop_classifier)

    def _build_stop_classifier(self, stop_classifier):
        """Checks that `stop_classifier` is a `StopClassifier` for the model's top-layer
        states, building it for their width when it is not built yet."""
        return build_stop_classifier(stop_classifier, self._output_embeddings.embedding_dim)

    # What the model exports ----------------------------------------------------------------
    def export_endpoints(self):
        """`FunctionalModel.export_endpoints` with the task's `GenerationSteps`: the cached
        loop (`generate_step`) that the SavedModel's `generate` endpoint runs, and the steps
        that the PyTorch programs hold (`export_prefill`: context, empty cache and prefill;
        `export_decode_step`: one cached token)."""
        steps = GenerationSteps(
            prompt_keys=tuple(self.prompt_keys),
            pad_token_id=self.pad_token_id,
            default_sampler=self._sampler,
            generate_step=self.generate_step,
            recurrent_state=self._has_recurrent_cache(),
            encode_context=self._generation_context,
            init_cache=self._init_generation_cache,
            prefill=self._prefill,
            decode_token=self._decode_token,
            max_length=self._output_embeddings.max_sequence_length,
        )
        return dataclasses.replace(super().export_endpoints(), generation=steps)

    def get_config(self):
        config = super().get_config()
        config["pad_token_id"] = self.pad_token_id
        return config
