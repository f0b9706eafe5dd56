"""Encoder-decoder language model with cached generation and beam search (survey §2.1, §2.7)."""

import keras
from keras import ops

from keras_xf.generation.compile import CompiledFunctions
from keras_xf.generation.compile import compile_generate_function
from keras_xf.generation.compile import traced_run_loop
from keras_xf.generation.prompts import output_padding_mask
from keras_xf.generation.prompts import pack_prompts
from keras_xf.generation.sampling import get_sampler
from keras_xf.models.backbone import FunctionalModel
from keras_xf.models.presets import preset_config
from keras_xf.models.seq2seq_backbone import Seq2SeqBackbone


@keras.saving.register_keras_serializable(package="keras_xf")
class Seq2SeqLM(FunctionalModel):
    """`P(y_i | y_<i, x) = Softmax(s_i W_o)` over a `Seq2SeqBackbone` (survey §2.1).

    Args:
        backbone: a `Seq2SeqBackbone`, or leave it out and pass its arguments.
        pad_token_id: int.
        start_token_id: int, the first decoder token of generated targets.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids`,
    `decoder_padding_mask`. Outputs: float32 decoder logits `[B, T, V]`.

    Example:
    >>> model = Seq2SeqLM(vocabulary_size=20, num_layers=1, hidden_dim=16, num_heads=2,
    ...                   intermediate_dim=32, max_sequence_length=16, start_token_id=1)
    >>> model.generate({"encoder_token_ids": [[3, 4, 5]]}, max_length=6, sampler="beam")
    """

    def __init__(self, backbone=None, pad_token_id=0, start_token_id=1, name=None, dtype=None,
                 trainable=True, **backbone_kwargs):
        if backbone is not None and backbone_kwargs:
            raise ValueError(
                f"Pass either a backbone or backbone arguments. Received both: {sorted(backbone_kwargs)}"
            )
        if backbone is None:
            backbone = Seq2SeqBackbone(dtype=dtype, **backbone_kwargs)
        elif not isinstance(backbone, keras.Model):
            backbone = keras.saving.deserialize_keras_object(backbone)

        # Layers
        self.backbone = backbone

        # Functional model
        inputs = {
            name_: keras.Input(shape=(None,), dtype="int32", name=name_)
            for name_ in (
                "encoder_token_ids",
                "encoder_padding_mask",
                "decoder_token_ids",
                "decoder_padding_mask",
            )
        }
        hidden = backbone(inputs)["decoder_sequence_output"]
        logits = ops.cast(backbone.decoder_embeddings(hidden, reverse=True), "float32")
        super().__init__(inputs=inputs, outputs=logits, name=name, dtype=dtype, trainable=trainable)

        # Config
        self.pad_token_id = pad_token_id
        self.start_token_id = start_token_id
        self.sampler = get_sampler("greedy")
        self._generate_functions = CompiledFunctions()

    @classmethod
    def from_preset(cls, preset, **overrides):
        """An untrained model with a named architecture, e.g. `"transformer_base"`."""
        return cls(**preset_config(preset, "seq2seq_lm", **overrides))

    def compile(self, optimizer="auto", loss="auto", weighted_metrics="auto", sampler="greedy",
                **kwargs):
        """Keras `compile` with defaults (AdamW, sparse cross-entropy on logits, accuracy)."""
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
    def init_cache(self, batch_size, max_length, encoder_length):
        return self.backbone.decoder.init_cache(
            batch_size, max_length, self.backbone.compute_dtype, encoder_length=encoder_length
        )

    def call_with_cache(self, decoder_token_ids, cache, cache_index, encoder_outputs=None,
                        encoder_padding_mask=None):
        """Decoder logits for tokens written at `cache_index`. Pass `encoder_outputs` on the
        first call to fill the cross-attention caches; later calls reuse them."""
        embedded = self.backbone.decoder_embeddings(decoder_token_ids, start_index=cache_index)
        hidden, cache = self.backbone.decoder(
            embedded,
            encoder_outputs=encoder_outputs,
            encoder_padding_mask=encoder_padding_mask,
            use_causal_mask=True,
            cache=cache,
            cache_index=cache_index,
        )
        logits = ops.cast(self.backbone.decoder_embeddings(hidden, reverse=True), "float32")
        return logits, hidden, cache

    def generate_step(self, encoder_token_ids, encoder_padding_mask, decoder_token_ids,
                      decoder_padding_mask, stop_token_ids=None, sampler=None, use_cache=True):
        """A compilable generation: encodes once, fills the cross-attention caches once, then
        decodes with the self-attention caches. Without the cache, each step reruns the
        decoder over the whole (fixed-shape) target."""
        sampler = sampler or self.sampler
        encoder_mask = ops.cast(encoder_padding_mask, "bool")
        decoder_mask = ops.cast(decoder_padding_mask, "bool")
        encoded = self.backbone.encode(encoder_token_ids, encoder_mask)
        batch_size = ops.shape(decoder_token_ids)[0]
        index = ops.min(ops.sum(ops.cast(decoder_mask, "int32"), axis=-1))
        hidden = None
        if use_cache:
            cache = self.init_cache(
                batch_size, ops.shape(decoder_token_ids)[1], ops.shape(encoder_token_ids)[1]
            )
            _, hidden, cache = self.call_with_cache(
                decoder_token_ids, cache, 0, encoder_outputs=encoded,
                encoder_padding_mask=encoder_mask,
            )
        else:
            cache = encoded
        # The encoder padding mask travels with the cache so that beam search repeats it too.
        cache = (cache, encoder_mask)

        def next_logits(prompt, state, index):
            layer_caches, mask = state
            cache_index = index - 1
            if not use_cache:
                hidden = self.backbone.decoder(
                    self.backbone.decoder_embeddings(prompt),
                    encoder_outputs=layer_caches,
                    encoder_padding_mask=mask,
                    use_causal_mask=True,
                )
                hidden = ops.take(hidden, cache_index, axis=1)
                logits = self.backbone.decoder_embeddings(hidden[:, None], reverse=True)
                return ops.cast(logits[:, 0], "float32"), hidden, state
            last = ops.slice(prompt, (0, cache_index), (ops.shape(prompt)[0], 1))
            logits, hidden, layer_caches = self.call_with_cache(
                last, layer_caches, cache_index, encoder_padding_mask=mask
            )
            return logits[:, 0], hidden[:, 0], (layer_caches, mask)

        decoder_token_ids = sampler(
            next=next_logits,
            prompt=decoder_token_ids,
            cache=cache,
            index=index,
            mask=decoder_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden,
            model=self,
        )
        return decoder_token_ids, output_padding_mask(
            decoder_token_ids, decoder_mask, stop_token_ids
        )

    def generate(self, inputs, max_length=None, stop_token_ids=None, sampler=None,
                 use_cache=True):
        """Translates / transduces source sequences with a KV cache in one compiled loop.

        Args:
            inputs: a dict with `encoder_token_ids` (and optionally `encoder_padding_mask`,
                `decoder_token_ids`, `decoder_padding_mask` as target prompts; by default the
                target prompt is `[start_token_id]`), or source token ids alone (a 2-D array,
                or a list of lists).
            max_length: target length; defaults to the decoder prompt's width or
                `max_sequence_length`.
            stop_token_ids: ids that end a sequence.
            sampler: keras-hub sampler or name (`"greedy"`, `"beam"`, `"top_k"`, …).
            use_cache: bool; `False` reruns the decoder over the whole prefix at each step.

        Returns:
            A dict with `decoder_token_ids` and `decoder_padding_mask` when given a dict;
            otherwise the target ids in the form of the source ids.
        """
        source = inputs
        target = None
        if isinstance(inputs, dict):
            source = {"token_ids": inputs["encoder_token_ids"]}
            if "encoder_padding_mask" in inputs:
                source["padding_mask"] = inputs["encoder_padding_mask"]
            if "decoder_token_ids" in inputs:
                target = {"token_ids": inputs["decoder_token_ids"]}
                if "decoder_padding_mask" in inputs:
                    target["padding_mask"] = inputs["decoder_padding_mask"]
        source = pack_prompts(source, default_max_length=None, max_length=None
                              if isinstance(source, dict) else _width(source),
                              pad_token_id=self.pad_token_id)
        batch = source.token_ids.shape[0]
        if target is None:
            target = [[self.start_token_id]] * batch
        target = pack_prompts(
            target,
            max_length=max_length,
            default_max_length=self.backbone.max_sequence_length,
            pad_token_id=self.pad_token_id,
        )
        stop = tuple(stop_token_ids) if stop_token_ids is not None else None
        # A sampler named by a string is keyed by its name, so that repeated calls reuse one
        # compiled function instead of compiling a fresh sampler's loop every time.
        key = (sampler if isinstance(sampler, str) else id(sampler or self.sampler), stop,
               use_cache)
        if key not in self._generate_functions:
            sampler = get_sampler(sampler) if sampler is not None else self.sampler
            if use_cache:
                sampler = traced_run_loop(self, sampler)

            def step(*tensors):
                return self.generate_step(
                    *tensors, stop_token_ids=stop, sampler=sampler, use_cache=use_cache
                )

            self._generate_functions[key] = compile_generate_function(self, step, sampler)
        token_ids, padding_mask = self._generate_functions[key](
            *(ops.convert_to_tensor(t) for t in (
                source.token_ids, source.padding_mask, target.token_ids, target.padding_mask))
        )
        if isinstance(inputs, dict):
            result = target.unpack(token_ids, padding_mask)
            if target.form == "dict":
                return {"decoder_token_ids": result["token_ids"],
                        "decoder_padding_mask": result["padding_mask"]}
            return {"decoder_token_ids": ops.convert_to_numpy(token_ids),
                    "decoder_padding_mask": ops.convert_to_numpy(padding_mask)}
        target.form = source.form
        return target.unpack(token_ids, padding_mask)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "backbone": keras.saving.serialize_keras_object(self.backbone),
                "pad_token_id": self.pad_token_id,
                "start_token_id": self.start_token_id,
            }
        )
        return config


def _width(prompts):
    """Width of the longest source sequence."""
    if hasattr(prompts, "shape"):
        return prompts.shape[-1]
    return max(len(row) for row in prompts) if prompts and hasattr(prompts[0], "__len__") else len(prompts)
