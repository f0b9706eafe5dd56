"""The generation settings a `GenerativeTask` keeps: its default stop ids, the samplers its
compiled functions use, the shapes they compile for (output bucket, prefill length) and the
count of the programs they compiled."""

from keras_xf.generation.cache_order import writes_cache_in_order
from keras_xf.generation.sampling import get_sampler
from keras_xf.models.generative.generation_arguments import bucketed_inputs
from keras_xf.models.generative.generation_arguments import check_stop_token_ids


class GenerationDefaults:
    """Part of `GenerativeTask`: the default stop ids (`stop_token_ids`, saved in the config
    and set on the built model by `from_config`), the sampler objects that sampler keys
    resolve to, the inputs' output bucket and prefill length, and `generate_compile_count`."""

    @property
    def stop_token_ids(self):
        """The model's default stop ids, a tuple (empty: none): what `generate` and `stream`
        use when `stop_token_ids` is left at `"auto"`. `from_huggingface` sets the
        checkpoint's end ids here; it is saved with the model (`get_config`). Settable:
        `model.stop_token_ids = [2]` (ids in `[0, vocabulary_size)`), `()` or `None` for
        none."""
        return self._default_stop_token_ids

    @stop_token_ids.setter
    def stop_token_ids(self, stop_token_ids):
        self._default_stop_token_ids = check_stop_token_ids(
            stop_token_ids, self._output_embeddings.vocabulary_size) or ()

    @property
    def generate_compile_count(self):
        """How many generation programs this model has compiled since it was built or last
        compiled: one per distinct setting (sampler, stop ids, cache flag, prefill length,
        ...) and input shape, the shapes being output lengths rounded up to their bucket
        (`bucket_length`). A chat of varied prompts reads it to see how often it compiled."""
        return self._generate_functions.program_count

    def _check_stop_token_ids(self, stop_token_ids):
        """A tuple of ints inside the vocabulary, or `None` for none; `"auto"`: the model's
        `stop_token_ids`."""
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            return self.stop_token_ids or None
        return check_stop_token_ids(stop_token_ids, self._output_embeddings.vocabulary_size)

    def _resolve_sampler(self, sampler):
        """The keras-hub sampler of a sampler key: the compile default for `None`, else one
        object per name, `SamplerSpec` or sampler, kept with the compiled functions."""
        if sampler is None:
            return self.sampler
        samplers = self._generate_functions.samplers
        if sampler not in samplers:
            samplers[sampler] = get_sampler(sampler)
        return samplers[sampler]

    def _bucketed_inputs(self, prompts, extras):
        return bucketed_inputs(prompts, extras, self.prompt_keys, self.pad_token_id,
                               self._output_embeddings.max_sequence_length)

    def _prefill_length(self, prompts, packed):
        """The prefill length of `prompts` widened to `packed` (`_bucketed_inputs`), for this
        model's caches (`PackedPrompts.prefill_length`)."""
        return prompts.prefill_length(packed[self.prompt_keys[0]].shape[1],
                                      in_order=writes_cache_in_order(self._generation_stack))

    def get_config(self):
        config = super().get_config()
        config["stop_token_ids"] = list(self.stop_token_ids)
        return config

    @classmethod
    def from_config(cls, config):
        # The default stop ids are a generation setting kept beside the hyperparameters:
        # set on the built model, so that the subclasses' constructors need not take them.
        config = dict(config)
        stop_token_ids = config.pop("stop_token_ids", ())
        model = super().from_config(config)
        model.stop_token_ids = stop_token_ids
        return model
