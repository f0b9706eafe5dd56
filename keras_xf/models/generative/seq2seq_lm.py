"""Encoder-decoder language model with cached generation and beam search (survey §2.1, §2.7)."""

import keras
from keras import ops

from keras_xf.generation.prompts import check_keys
from keras_xf.generation.prompts import pack_prompts
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.generative.generative_task import GenerativeTask
from keras_xf.models.backbones.presets import preset_config
from keras_xf.models.backbones.seq2seq_backbone import Seq2SeqBackbone
from keras_xf.ops.checks import check_positive_number
from keras_xf.preprocessing import Seq2SeqLMPreprocessor

ENCODER_KEYS = ("encoder_token_ids", "encoder_padding_mask")


@keras.saving.register_keras_serializable(package="keras_xf")
class Seq2SeqLM(GenerativeTask):
    """`P(y_i | y_<i, x) = Softmax(s_i W_o)` over a `Seq2SeqBackbone` (survey §2.1).

    Args:
        backbone: a `Seq2SeqBackbone`, or leave it out and pass its arguments.
        pad_token_id: int.
        start_token_id: int, the first decoder token of generated targets.
        logit_scale: positive float `c`, logits `Softmax(c · s_i W_o)`: the decoder states
            are multiplied by `c` before the output projection (T5 with tied embeddings uses
            `c = d^-0.5`); 1.0 leaves them as they are.
        preprocessor: optional `keras_xf.preprocessing.Seq2SeqLMPreprocessor`; with it
            `generate` takes source texts and returns texts, and `fit` takes
            `{"encoder_text", "decoder_text"}`. `None` (default): ids.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids`,
    `decoder_padding_mask`. Outputs: float32 decoder logits `[B, T, V]`.

    `generate` (from `GenerativeTask`) encodes the sources once, writes the cross-attention
    keys and values into the cache once, then decodes; the decoder prompts are
    `[start_token_id]` unless given. Sources: a dict with `encoder_token_ids` (and optionally
    `encoder_padding_mask`, `decoder_token_ids`, `decoder_padding_mask`), a padded 2-D array
    (`pad_token_id` entries are padding), one 1-D source, or a list of lists; a dict gives a
    dict with `decoder_token_ids` and `decoder_padding_mask`, other forms give the targets in
    their own form.

    Example:
    >>> model = Seq2SeqLM(vocabulary_size=20, num_layers=1, hidden_dim=16, num_heads=2,
    ...                   intermediate_dim=32, max_sequence_length=16, start_token_id=1)
    >>> model.generate({"encoder_token_ids": [[3, 4, 5]]}, max_length=6, sampler="beam")
    """

    preprocessor_class = Seq2SeqLMPreprocessor

    def __init__(self, backbone=None, pad_token_id=0, start_token_id=1, logit_scale=1.0,
                 preprocessor=None, name=None, dtype=None, trainable=True, **backbone_kwargs):
        check_positive_number("logit_scale", logit_scale)
        self.logit_scale = float(logit_scale)
        backbone = task_backbone(backbone, Seq2SeqBackbone, dtype, backbone_kwargs)

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
        logits = self._logits(backbone(inputs)["decoder_sequence_output"])
        super().__init__(inputs=inputs, outputs=logits, pad_token_id=pad_token_id, name=name,
                         dtype=dtype, trainable=trainable)

        # Config
        self.start_token_id = start_token_id
        self.preprocessor = preprocessor

    @classmethod
    def from_preset(cls, preset, **overrides):
        """An untrained model with a named architecture, e.g. `"transformer_base"`."""
        return cls(**preset_config(preset, "seq2seq_lm", **overrides))

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
        return self._logits(hidden), hidden, cache

    def _logits(self, hidden):
        """float32 logits `[B, T, V]` of decoder states `[B, T, d]` scaled by `logit_scale`."""
        if self.logit_scale != 1.0:
            hidden = hidden * ops.cast(self.logit_scale, hidden.dtype)
        return super()._logits(hidden)

    # Hooks of `GenerativeTask` ------------------------------------------------------------
    prompt_keys = ("decoder_token_ids", "decoder_padding_mask")

    @property
    def _output_embeddings(self):
        return self.backbone.decoder_embeddings

    @property
    def _generation_stack(self):
        return self.backbone.decoder

    def _generate_inputs(self, inputs, max_length):
        targets = None
        if isinstance(inputs, dict):
            check_keys(inputs, ENCODER_KEYS + self.prompt_keys, required=ENCODER_KEYS[:1])
            if self.prompt_keys[0] in inputs:
                targets = {key: inputs[key] for key in self.prompt_keys if key in inputs}
            inputs = {key: inputs[key] for key in ENCODER_KEYS if key in inputs}
        sources = pack_prompts(inputs, pad_token_id=self.pad_token_id, keys=ENCODER_KEYS)
        if targets is None:
            targets = [[self.start_token_id]] * sources.token_ids.shape[0]
        targets = self._pack_prompts(targets, max_length)
        form = "dict" if isinstance(inputs, dict) else sources.form

        def unpack(token_ids, padding_mask):
            return targets.unpack(token_ids, padding_mask, form=form, keys=self.prompt_keys)

        extras = dict(zip(ENCODER_KEYS, (sources.token_ids, sources.padding_mask)))
        return targets, extras, unpack

    def _generation_context(self, encoder_token_ids, encoder_padding_mask):
        mask = ops.cast(encoder_padding_mask, "bool")
        return self.backbone.encode(encoder_token_ids, mask), mask

    def _init_generation_cache(self, batch_size, max_length, context):
        encoded, mask = context
        # The encoder mask travels with the cache so that beam search repeats it too.
        return self.init_cache(batch_size, max_length, ops.shape(encoded)[1]), mask

    def _prefill(self, token_ids, cache, context):
        (encoded, mask), (layers, _) = context, cache
        if token_ids is None:
            layers = self._prefill_cross_attention(
                layers, ops.shape(encoded)[0], encoder_outputs=encoded, encoder_padding_mask=mask)
            return None, (layers, mask)
        _, hidden, layers = self.call_with_cache(token_ids, layers, 0, encoder_outputs=encoded,
                                                 encoder_padding_mask=mask)
        return hidden, (layers, mask)

    def _decode_token(self, token_ids, cache, cache_index):
        layers, mask = cache
        logits, hidden, layers = self.call_with_cache(token_ids, layers, cache_index,
                                                      encoder_padding_mask=mask)
        return logits[:, 0], hidden[:, 0], (layers, mask)

    def _uncached_hidden(self, token_ids, context):
        encoded, mask = context
        return self.backbone.decoder(
            self.backbone.decoder_embeddings(token_ids), encoder_outputs=encoded,
            encoder_padding_mask=mask, use_causal_mask=True,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "backbone": keras.saving.serialize_keras_object(self.backbone),
                "start_token_id": self.start_token_id,
                "logit_scale": self.logit_scale,
            }
        )
        return config
