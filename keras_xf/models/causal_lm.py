"""Decoder-only language model with cached generation (survey §2.7, §6)."""

import keras
from keras import ops

from keras_xf.generation.compile import CompiledFunctions
from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.compile import trace_decoding_step
from keras_xf.generation.compile import traced_run_loop
from keras_xf.generation.prompts import output_padding_mask
from keras_xf.generation.prompts import pack_prompts
from keras_xf.generation.sampling import get_sampler
from keras_xf.models.backbone import FunctionalModel
from keras_xf.models.presets import preset_config
from keras_xf.models.transformer_backbone import TransformerBackbone


@keras.saving.register_keras_serializable(package="keras_xf")
class CausalLM(FunctionalModel):
    """`P(y_i | y_<i) = Softmax(h_i W_o)`: a causal `TransformerBackbone` and an output layer.

    The output projection is the token embedding reversed (tied, survey §5.4) unless the
    backbone is built with `tie_embeddings=False`. Logits are float32.

    Args:
        backbone: a causal `TransformerBackbone`; or leave it out and pass the backbone's
            arguments (`vocabulary_size`, `num_layers`, `hidden_dim`, `num_heads`,
            `intermediate_dim`, `max_sequence_length`, `block`, `position`, …).
        pad_token_id: int, the padding id used when packing prompts.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}`. Outputs: float32 `[B, T, V]`.

    Example:
    >>> lm = CausalLM(vocabulary_size=100, num_layers=2, hidden_dim=32, num_heads=4,
    ...               intermediate_dim=64, max_sequence_length=64)
    >>> lm.generate([[5, 6, 7]], max_length=12)
    """

    def __init__(self, backbone=None, pad_token_id=0, name=None, dtype=None, trainable=True,
                 **backbone_kwargs):
        if backbone is not None and backbone_kwargs:
            raise ValueError(
                f"Pass either a backbone or backbone arguments. Received both: {sorted(backbone_kwargs)}"
            )
        if backbone is None:
            backbone = TransformerBackbone(causal=True, dtype=dtype, **backbone_kwargs)
        elif not isinstance(backbone, keras.Model):
            backbone = keras.saving.deserialize_keras_object(backbone)
        if not getattr(backbone, "causal", False):
            raise ValueError("CausalLM needs a causal backbone (TransformerBackbone(causal=True)).")

        # Layers
        self.backbone = backbone

        # Functional model
        inputs = {
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
        }
        hidden = backbone(inputs)
        logits = ops.cast(backbone.embeddings(hidden, reverse=True), "float32")
        super().__init__(inputs=inputs, outputs=logits, name=name, dtype=dtype, trainable=trainable)

        # Config
        self.pad_token_id = pad_token_id
        self.sampler = get_sampler("greedy")
        self._generate_functions = CompiledFunctions()

    @classmethod
    def from_preset(cls, preset, **overrides):
        """An untrained model with a named architecture (see `keras_xf.models.presets`)."""
        return cls(**preset_config(preset, "causal_lm", **overrides))

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        weighted_metrics="auto",
        sampler="greedy",
        **kwargs,
    ):
        """Keras `compile` with defaults: AdamW, sparse cross-entropy on logits, accuracy.

        `sampler` (a keras-hub sampler or name) is the default of `generate`.
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        self.sampler = get_sampler(sampler)
        self._generate_functions = CompiledFunctions()
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics, **kwargs)

    # Cached decoding -------------------------------------------------------------------
    def init_cache(self, batch_size, max_length):
        return self.backbone.transformer_stack.init_cache(
            batch_size, max_length, self.backbone.compute_dtype
        )

    def _cached_hidden(self, token_ids, cache, cache_index):
        embedded = self.backbone.embeddings(token_ids, start_index=cache_index)
        return self.backbone.transformer_stack(
            embedded, use_causal_mask=True, cache=cache, cache_index=cache_index
        )

    def call_with_cache(self, token_ids, cache, cache_index):
        """Logits `[B, t, V]`, hidden states and the new cache for `t` new tokens written at
        `cache_index`; equal to the matching slice of the full forward pass."""
        hidden, cache = self._cached_hidden(token_ids, cache, cache_index)
        logits = ops.cast(self.backbone.embeddings(hidden, reverse=True), "float32")
        return logits, hidden, cache

    def _decode_step(self, prompt, cache, index):
        """The cached step of the decoding loop: feeds the token at `index - 1`, returns the
        logits `[B, V]` for position `index`, its hidden state and the new cache."""
        cache_index = index - 1
        last = ops.slice(prompt, (0, cache_index), (ops.shape(prompt)[0], 1))
        logits, hidden, cache = self.call_with_cache(last, cache, cache_index)
        return logits[:, 0], hidden[:, 0], cache

    def generate_step(self, token_ids, padding_mask, stop_token_ids=None, sampler=None,
                      use_cache=True, prefill_length=None):
        """A compilable generation of a packed batch (prompts left-aligned, `padding_mask`
        marking them); returns `(token_ids, padding_mask)`.

        With the cache, one parallel pass fills the cache with the first
        `prefill_length - 1` tokens (`prefill_length` is an int no larger than the shortest
        prompt; by default the whole width, as keras-hub does, except for mixers with a
        recurrent state, which start from the first token), then the loop decodes one token
        per step from position `prefill_length - 1`, keeping prompt tokens where
        `padding_mask` is set. Without the cache, every step runs the full causal
        forward pass over the whole (fixed-shape) sequence.
        """
        sampler = sampler or self.sampler
        batch_size, max_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        padding_mask = ops.cast(padding_mask, "bool")
        index = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))
        cache, hidden = None, None
        if use_cache:
            cache = self.init_cache(batch_size, max_length)
            if prefill_length is None and self._has_recurrent_cache():
                # A recurrent state cannot be filled over the padded width: the loop feeds
                # every token from the first one (prompt tokens are kept).
                prefill_length = 1
            if prefill_length is None:
                hidden, cache = self._cached_hidden(token_ids, cache, 0)
            else:
                # The loop's first step feeds the token at `prefill_length - 1`, so the
                # parallel pass fills the positions before it: every token enters the cache
                # once, which a recurrent state (unlike a positional KV cache) requires.
                filled = prefill_length - 1
                if filled > 0:
                    prefix = ops.slice(token_ids, (0, 0), (batch_size, filled))
                    hidden, cache = self._cached_hidden(prefix, cache, 0)
                    # Samplers that read hidden states expect one per output position.
                    hidden = ops.pad(hidden, ((0, 0), (0, max_length - filled), (0, 0)))
                else:
                    hidden = ops.zeros((batch_size, max_length, self.backbone.hidden_dim),
                                       self.backbone.compute_dtype)
                index = prefill_length
            traced_body = getattr(sampler, "traces_loop_body", False)
            next_logits = self._decode_step if traced_body else self._traced_decode_step
        else:

            def next_logits(prompt, cache, index):
                hidden = self.backbone(
                    {"token_ids": prompt, "padding_mask": ops.ones_like(prompt)}, training=False
                )
                hidden = ops.take(hidden, index - 1, axis=1)
                logits = ops.cast(self.backbone.embeddings(hidden[:, None], reverse=True), "float32")
                return logits[:, 0], hidden, cache

        token_ids = sampler(
            next=next_logits,
            prompt=token_ids,
            cache=cache,
            index=index,
            mask=padding_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden,
            model=self,
        )
        return token_ids, output_padding_mask(token_ids, padding_mask, stop_token_ids)

    def _has_recurrent_cache(self):
        """Whether a block's mixer keeps a recurrent state (`cache_is_recurrent = True`)
        rather than a cache addressed by position, which may be written twice."""
        return any(getattr(block.mixer, "cache_is_recurrent", False)
                   for block in self.backbone.transformer_stack.blocks)

    @property
    def _traced_decode_step(self):
        # One per model (traces are kept per input shapes); reset by `compile`.
        functions = self._generate_functions
        if functions.decode_step is None:
            functions.decode_step = trace_decoding_step(self, self._decode_step)
        return functions.decode_step

    def generate(self, inputs, max_length=None, stop_token_ids=None, sampler=None,
                 use_cache=True):
        """Generates continuations of prompts with a KV cache, in one compiled loop.

        Args:
            inputs: a dict `{"token_ids", "padding_mask"}` (ids padded to the output length,
                mask marking the prompt, left or right padded), a 2-D array of prompts, a 1-D
                prompt, or a list of prompts of different lengths.
            max_length: output length; defaults to the dict's width, else the backbone's
                `max_sequence_length`.
            stop_token_ids: ids that end a sequence (generation stops when every row has one).
            sampler: a keras-hub sampler or name; defaults to the one given to `compile`
                (greedy).
            use_cache: bool; `False` recomputes the whole prefix at every step (a reference
                for the cached path, which gives the same tokens).

        Returns:
            The structure given: a dict with `token_ids` and `padding_mask` (prompts
            left-aligned, the mask covering prompt and generated tokens up to the stop
            token), an array `[B, max_length]`, or lists of ids.
        """
        packed = pack_prompts(
            inputs,
            max_length=max_length,
            default_max_length=self.backbone.max_sequence_length,
            pad_token_id=self.pad_token_id,
        )
        stop = tuple(stop_token_ids) if stop_token_ids is not None else None
        prefill = packed.prefill_length if use_cache else None
        # A sampler named by a string is keyed by its name, so that repeated calls reuse one
        # compiled function instead of compiling a fresh sampler's loop every time.
        key = (sampler if isinstance(sampler, str) else id(sampler or self.sampler), stop,
               use_cache, prefill)
        if key not in self._generate_functions:
            sampler = get_sampler(sampler) if sampler is not None else self.sampler
            if use_cache:
                sampler = traced_run_loop(self, sampler)

            def step(token_ids, padding_mask):
                return self.generate_step(token_ids, padding_mask, stop, sampler, use_cache,
                                          prefill)

            self._generate_functions[key] = compile_generate_function(self, step, sampler)
        token_ids, padding_mask = self._generate_functions[key](
            ops.convert_to_tensor(packed.token_ids), ops.convert_to_tensor(packed.padding_mask)
        )
        return packed.unpack(token_ids, padding_mask)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "backbone": keras.saving.serialize_keras_object(self.backbone),
                "pad_token_id": self.pad_token_id,
            }
        )
        return config
