"""`GenerativeTask.stream`: the tokens of `generate` handed over as they are produced."""

import functools

import numpy as np
from keras import ops

from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.sampling import check_stream_sampler
from keras_xf.generation.sampling import penalize_repetition
from keras_xf.generation.sampling import restart_seed
from keras_xf.generation.sampling import sampler_from_arguments
from keras_xf.models.generative.generation_arguments import check_repetition_penalty
from keras_xf.models.generative.generation_arguments import output_length_request
from keras_xf.models.generative.text_generation import TextPieces
from keras_xf.models.generative.text_generation import text_prompts
from keras_xf.preprocessing import is_text


def _text_stream(tokens, pieces, single):
    """The text pieces of a token stream (`TextPieces`): a string per non-empty piece for
    one prompt (`single`), else a list of strings per position."""
    for step in tokens:
        texts = pieces.add(step)
        if not single:
            yield texts
        elif texts[0]:
            yield texts[0]
    rest = pieces.rest()
    if single and rest[0]:
        yield rest[0]
    elif not single and any(rest):
        yield rest


class StreamingGeneration:
    """The streaming half of `GenerativeTask`: `stream` and its two compiled functions, built
    from the task's own prefill (`_prefilled_cache`) and cached decoding step
    (`_decode_step`) and kept with `generate`'s compiled functions."""

    def stream(self, inputs, max_length=None, stop_token_ids="auto", sampler=None, *,
               max_new_tokens=None, temperature=None, top_k=None, top_p=None, seed=None,
               repetition_penalty=None):
        """Yields the tokens of `generate` as they are produced, one position at a time;
        for text prompts (a task with a preprocessor), the text each position adds.

        Takes `generate`'s arguments (cached decoding only, no stop classifier) and gives
        the same tokens: the prompts are prefilled by one compiled pass, then one compiled
        step per position (the task's cached decoding step and the sampler's choice,
        `sampler.get_next_token(sampler.compute_probabilities(logits))`) runs and its token
        is handed over before the next step starts. Both programs are compiled once per
        prefill length and output bucket, as `generate`'s loop is.

        Yields:
            For each position from the shortest prompt's end to the output length, an int32
            numpy array `[B]`: each row's token there. A row whose prompt is longer than the
            shortest still gives its prompt token until its own prompt ends; a row that has
            ended (a stop id) gives `pad_token_id` after its stop id. The stream ends once
            every row has ended, or at the output length. The prompt followed by the yielded
            tokens (and `pad_token_id` up to the output length) is `generate`'s array.

            For a string prompt, strings instead: each piece of text as soon as it is
            decoded (steps that complete no character give none), `generate`'s text being
            the prompt's own text (decoded from its ids; for a seq2seq model, nothing)
            followed by the pieces. For a list of prompts, a list of strings per position,
            one piece per prompt (`""` where a row adds nothing). Text arguments default as
            `generate`'s do on text (`max_length`, the tokenizer's end token).

        Raises:
            ValueError: as `generate`, and for beam or contrastive search (whose choice is
                known only after the last step).

        Example:
        >>> lm = CausalLM(vocabulary_size=50, num_layers=1, hidden_dim=16, num_heads=2,
        ...               intermediate_dim=32, max_sequence_length=16)
        >>> pieces = [tokens for tokens in lm.stream([[5, 6, 7]], max_new_tokens=4)]
        >>> np.concatenate([[[5, 6, 7]], np.stack(pieces, axis=1)], axis=1).tolist() == (
        ...     lm.generate([[5, 6, 7]], max_new_tokens=4))
        True
        """
        inputs_given, text = inputs, is_text(inputs)
        if text:
            arguments = {"max_length": max_length, "max_new_tokens": max_new_tokens,
                         "stop_token_ids": stop_token_ids}
            prompt_rows = inputs = text_prompts(self, inputs, arguments)
            max_length, stop_token_ids = arguments["max_length"], arguments["stop_token_ids"]
        sampler = sampler_from_arguments(sampler, temperature, top_k, top_p)
        repetition_penalty = check_repetition_penalty(repetition_penalty)
        stop_token_ids = self._check_stop_token_ids(stop_token_ids)
        resolved = self._resolve_sampler(sampler)
        check_stream_sampler(resolved)
        prompts, extras, _ = self._generate_inputs(
            inputs, output_length_request(max_length, max_new_tokens))
        self._check_generate_inputs(prompts, extras)
        if seed is not None:
            restart_seed(resolved, seed)
        tokens = self._stream_tokens(prompts, extras, sampler, stop_token_ids,
                                     repetition_penalty)
        if not text:
            return tokens
        # The rows start as the stream does, each prompt up to the shortest one's end; the
        # text counted as handed over is the whole prompt's (the decoder's, for seq2seq).
        lengths = prompts.padding_mask.sum(axis=1)
        pieces = TextPieces(self.preprocessor, prompts.token_ids[:, :lengths.min()],
                            prompt_rows, [row[:n] for row, n in zip(prompts.token_ids, lengths)])
        return _text_stream(tokens, pieces, single=isinstance(inputs_given, (str, bytes)))

    def _stream_tokens(self, prompts, extras, sampler, stop_token_ids, repetition_penalty):
        """The generator of `stream`, once its arguments are checked."""
        ids_key, mask_key = self.prompt_keys
        packed = self._bucketed_inputs(prompts, extras)
        prefill_length = self._prefill_length(prompts, packed)
        prefill = self._stream_function(("stream_prefill", prefill_length), functools.partial(
            self._stream_prefill, prefill_length=prefill_length), None)
        step = self._stream_function(
            ("stream_step", self._default_sampler_key if sampler is None else sampler,
             repetition_penalty),
            functools.partial(self._stream_step, sampler=self._resolve_sampler(sampler),
                              repetition_penalty=repetition_penalty),
            self._resolve_sampler(sampler))
        tensors = {key: ops.convert_to_tensor(value) for key, value in packed.items()}
        self._generate_functions.count_program(prefill, packed.values())
        self._generate_functions.count_program(step, packed.values())
        cache = prefill(tensors)
        token_ids, mask = tensors[ids_key], tensors[mask_key]
        lengths = prompts.padding_mask.sum(axis=1)
        stops = np.asarray(stop_token_ids or (), "int32")
        ended = np.zeros(len(lengths), bool)
        # As `generate_step`'s loop: from the shortest prompt's end or the prefill's.
        for index in range(min(prompts.shortest, prefill_length), prompts.token_ids.shape[1]):
            token_ids, cache, tokens = step(token_ids, cache, ops.convert_to_tensor(
                index, "int32"), mask)
            if index < lengths.min():
                continue  # every row is still in its prompt
            tokens = np.asarray(ops.convert_to_numpy(tokens)).astype("int32")
            yield np.where(ended, self.pad_token_id, tokens).astype("int32")
            ended |= (index >= lengths) & np.isin(tokens, stops)
            if ended.all():
                return

    def _stream_function(self, key, function, sampler):
        """A compiled function of `stream`, made once per key and kept with `generate`'s."""
        if key not in self._generate_functions:
            sampler = sampler if sampler is not None else self.sampler
            self._generate_functions[key] = compile_generate_function(self, function, sampler)
        return self._generate_functions[key]

    def _stream_prefill(self, inputs, prefill_length):
        """The cache of `stream` before its first step: `c` encoded and the first prompt
        tokens written (`generate_step`'s `prefill_length`), as `generate_step` starts its
        loop."""
        extras = {key: value for key, value in inputs.items() if key not in self.prompt_keys}
        context = self._generation_context(**extras)
        cache, _, _ = self._prefilled_cache(inputs[self.prompt_keys[0]], context,
                                            prefill_length, None)
        return cache

    def _stream_step(self, token_ids, cache, index, mask, sampler, repetition_penalty):
        """One position of keras-hub's sampling loop body: the cached step at `index`, the
        sampler's token (prompt tokens kept) written into `token_ids`. Returns the new ids,
        the cache and the tokens `[B]`."""
        # The step traced once per shape on PyTorch (`trace_decoding_step`), itself elsewhere.
        logits, _, cache = self._traced_decode_step(token_ids, cache, index)
        if repetition_penalty is not None:
            logits = penalize_repetition(logits, token_ids, index, repetition_penalty)
        tokens = sampler.get_next_token(sampler.compute_probabilities(logits))
        tokens = ops.cast(tokens, token_ids.dtype)
        tokens = ops.where(ops.take(ops.cast(mask, "bool"), index, axis=1),
                           ops.take(token_ids, index, axis=1), tokens)
        token_ids = ops.slice_update(token_ids, (0, index), tokens[:, None])
        return token_ids, cache, tokens
