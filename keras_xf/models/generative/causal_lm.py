"""Decoder-only language model with cached generation (survey §2.7, §6)."""

import keras
from keras import ops

from keras_xf.generation.prompts import check_keys
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.generative.generative_task import GenerativeTask
from keras_xf.models.backbones.presets import preset_config
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.preprocessing import CausalLMPreprocessor
from keras_xf.training.chunked_loss_model import ChunkedLossModel


@keras.saving.register_keras_serializable(package="keras_xf")
class CausalLM(ChunkedLossModel, GenerativeTask):
    """`P(y_i | y_<i) = Softmax(h_i W_o)`: a causal `TransformerBackbone` and an output layer.

    The output projection is the token embedding reversed (tied, survey §5.4) unless the
    backbone is built with `tie_embeddings=False`. Logits are float32. `generate`,
    `compile` and the decoding loop come from `GenerativeTask`; compiled with
    `loss=ChunkedCrossEntropy(...)` it trains without forming the `[B, T, V]` logits.

    Args:
        backbone: a causal `TransformerBackbone`; or leave it out and pass the backbone's
            arguments (`vocabulary_size`, `num_layers`, `hidden_dim`, `num_heads`,
            `intermediate_dim`, `max_sequence_length`, `block`, `position`, …).
        pad_token_id: int, the padding id used when packing prompts.
        preprocessor: optional `keras_xf.preprocessing.CausalLMPreprocessor`; with it
            `generate`, `fit`, `evaluate` and `predict` also take text (`generate("text")`
            returns a string, a list of prompts a list of strings). `None` (default): ids.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids": [B, T], "padding_mask": [B, T]}`. Outputs: float32 `[B, T, V]`.

    Prompts of `generate`: `{"token_ids", "padding_mask"}` (the mask optional), a padded 2-D
    array, one 1-D prompt, or a list of lists; results come back in the same structure.

    Example:
    >>> lm = CausalLM(vocabulary_size=100, num_layers=2, hidden_dim=32, num_heads=4,
    ...               intermediate_dim=64, max_sequence_length=64)
    >>> lm.generate([[5, 6, 7]], max_length=12)
    """

    preprocessor_class = CausalLMPreprocessor

    def __init__(self, backbone=None, pad_token_id=0, preprocessor=None, name=None, dtype=None,
                 trainable=True, **backbone_kwargs):
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs,
                                 causal=True)
        if not backbone.causal:
            raise ValueError(
                "backbone must be causal (TransformerBackbone(causal=True)). Received: "
                "backbone with causal=False"
            )
        if backbone.uses_segment_ids:
            raise ValueError(
                "CausalLM generates without segment ids: its backbone takes num_segments=None "
                f"or 1. Received: num_segments={backbone.num_segments}"
            )

        # Layers
        self.backbone = backbone

        # Functional model
        inputs = {
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
        }
        outputs = self._functional_outputs(inputs)
        super().__init__(inputs=inputs, outputs=outputs, pad_token_id=pad_token_id, name=name,
                         dtype=dtype, trainable=trainable)
        self.preprocessor = preprocessor

    def _functional_outputs(self, inputs):
        """The outputs of the functional graph on its `keras.Input`s: the logits `[B, T, V]`
        (a subclass with other outputs, such as every exit's logits, overrides it)."""
        return self._logits(self.backbone(inputs))

    @classmethod
    def from_preset(cls, preset, **overrides):
        """An untrained model with a named architecture (see `keras_xf.models.backbones.presets`)."""
        return cls(**preset_config(preset, "causal_lm", **overrides))

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
        return self._logits(hidden), hidden, cache

    # Hooks of `GenerativeTask` ------------------------------------------------------------
    @property
    def _output_embeddings(self):
        return self.backbone.embeddings

    @property
    def _generation_stack(self):
        return self.backbone.transformer_stack

    def _generate_inputs(self, inputs, max_length):
        if isinstance(inputs, dict):
            check_keys(inputs, self.prompt_keys, required=self.prompt_keys[:1])
        prompts = self._pack_prompts(inputs, max_length)
        return prompts, {}, prompts.unpack

    def _generation_context(self):
        return ()

    def _init_generation_cache(self, batch_size, max_length, context):
        return self.init_cache(batch_size, max_length)

    def _prefill(self, token_ids, cache, context):
        if token_ids is None:
            return None, cache
        return self._cached_hidden(token_ids, cache, 0)

    def _decode_token(self, token_ids, cache, cache_index):
        logits, hidden, cache = self.call_with_cache(token_ids, cache, cache_index)
        return logits[:, 0], hidden[:, 0], cache

    # What `ChunkedLossModel` declares ------------------------------------------------------
    def final_hidden_states(self, inputs, training=None):
        """The backbone's outputs `h` `[B, T, d]`, whose logits are `_logits(h)`: the output
        embedding reversed and nothing more."""
        return self.backbone(inputs, training=training)

    def output_table(self):
        """The output embedding as a `[V, d]` table `E` in the compute dtype, so that
        `_logits(h) = float32(h · Eᵀ)`: the token embedding, or the separate output matrix
        transposed when the weights are not tied."""
        # With LoRA on the output head, the merged `W_out + (α/r)·A·B`; of a quantised
        # model, the dequantised table.
        return self.backbone.embeddings.token_embedding.output_table()

    def _uncached_hidden(self, token_ids, context):
        return self.backbone({"token_ids": token_ids, "padding_mask": ops.ones_like(token_ids)},
                             training=False)

    def get_config(self):
        config = super().get_config()
        config["backbone"] = keras.saving.serialize_keras_object(self.backbone)
        return config
