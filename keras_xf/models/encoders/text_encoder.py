"""Encoder-only model producing one embedding per sequence (survey §6)."""

import keras
import numpy as np
from keras import ops

from keras_xf.layers.heads.pooling import Pooling
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.arguments import task_backbone
from keras_xf.models.backbones.arguments import token_inputs
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.presets import preset_config
from keras_xf.models.backbones.task_preprocessing import preprocessed
from keras_xf.models.backbones.transformer_backbone import TransformerBackbone
from keras_xf.models.backbones.transformer_backbone import pooled_states
from keras_xf.ops.checks import check_positive_int
from keras_xf.ops.checks import get_activation
from keras_xf.preprocessing import TextClassifierPreprocessor
from keras_xf.preprocessing import text_list


@keras.saving.register_keras_serializable(package="keras_xf")
class TextEncoder(FunctionalModel):
    """`e = normalize(act(W_p · Pool(Encoder(x)) + b_p))`: a pooled, optionally projected
    and L2-normalised sequence embedding.

    BERT's pooler is `pooling="cls"`, `projection_dim=d`, `projection_activation="tanh"`,
    `normalize=False`.

    Args:
        backbone: a `TransformerBackbone` (non-causal), or its arguments as keywords.
        pooling: `"mean"` (default), `"cls"` or `"max"` over the padding mask. With
            `"cls"` the backbone's last layer computes the first position alone (its keys
            and values still span the sequence; the embedding is the same).
        projection_dim: optional int, a projection `W_p · p + b_p` after pooling.
        projection_activation: optional activation of that projection (linear by default).
        normalize: bool, L2-normalise the embedding (cosine similarity = dot product).
        preprocessor: optional `keras_xf.preprocessing.TextClassifierPreprocessor`; with it
            `predict`, `fit`, `evaluate` and `similarity` also take texts, and `encode`
            embeds a list of strings. `None` (default): ids.
        prompts: optional dict `{name: text}` of the texts `encode` can put before its
            inputs (sentence-transformers' prompts, such as `{"query": "query: "}`).
        default_prompt_name: optional key of `prompts`, the prompt `encode` uses when given
            none.
        **kwargs: backbone arguments, or `name` / `dtype`.

    Inputs: `{"token_ids", "padding_mask"}`, and `"segment_ids"` when the backbone takes
    them. Outputs: float32 `[B, projection_dim or d]`.

    Example:
    >>> encoder = TextEncoder(vocabulary_size=100, num_layers=1, hidden_dim=16, num_heads=2,
    ...                       intermediate_dim=32)
    >>> encoder.similarity(batch_a, batch_b)  # cosine similarities [B]
    """

    preprocessor_class = TextClassifierPreprocessor

    def __init__(self, backbone=None, pooling="mean", projection_dim=None, normalize=True,
                 projection_activation=None, preprocessor=None, prompts=None,
                 default_prompt_name=None, name=None, dtype=None, trainable=True,
                 **backbone_kwargs):
        check_model_arguments(locals())
        prompts, default_prompt_name = check_prompts(prompts, default_prompt_name)
        if projection_activation is not None:
            projection_activation = keras.activations.serialize(
                get_activation("projection_activation", projection_activation))
        if projection_activation is not None and projection_dim is None:
            raise ValueError("projection_activation needs a projection (projection_dim). "
                             f"Received: projection_activation={projection_activation!r}, "
                             "projection_dim=None")
        backbone = task_backbone(backbone, TransformerBackbone, dtype, backbone_kwargs)
        if backbone.causal:
            raise ValueError("TextEncoder needs a non-causal backbone (causal=False).")

        # Layers
        self.backbone = backbone
        self.pooling = Pooling(pooling, dtype=backbone.dtype_policy, name="pooling")
        self.projection = None
        if projection_dim is not None:
            self.projection = keras.layers.Dense(
                projection_dim, activation=projection_activation, dtype=backbone.dtype_policy,
                name="projection"
            )

        # Functional model
        inputs = token_inputs(segments=backbone.uses_segment_ids)
        pooled = pooled_states(backbone, self.pooling, inputs)
        if self.projection is not None:
            pooled = self.projection(pooled)
        embedding = ops.cast(pooled, "float32")
        if normalize:
            embedding = embedding / ops.maximum(
                ops.sqrt(ops.sum(embedding * embedding, axis=-1, keepdims=True)), 1e-12
            )
        super().__init__(inputs=inputs, outputs=embedding, name=name, dtype=dtype,
                         trainable=trainable)

        # Config
        record_config(self, locals(), attributes={"backbone": None, "pooling": "pooling_mode"})
        self.preprocessor = preprocessor

    @classmethod
    def from_preset(cls, preset, **overrides):
        """An untrained encoder with a named architecture, e.g. `"bert_base"`."""
        return cls(**preset_config(preset, "text_encoder", **overrides))

    def encode(self, texts, batch_size=32, prompt_name=None, prompt=None):
        """The embeddings of texts, computed in batches on the host: sentence-transformers'
        `encode`.

        A prompt is put before every text: `prompt` itself, else `prompts[prompt_name]`,
        else the default prompt (`prompts[default_prompt_name]`), else none.

        Each batch of at most `batch_size` texts goes through the preprocessor (packed to its
        `sequence_length`) and the model; a last, smaller batch is padded with copies of its
        first text to the size of the others, so every batch has one shape and compiles once.

        Args:
            texts: a string, or a list, tuple or 1-D array of strings.
            batch_size: positive int, the most texts run at once.
            prompt_name: optional key of the model's `prompts`.
            prompt: optional text to put before each text (not with `prompt_name`).

        Returns:
            float32 NumPy embeddings: `[N, d]` for N texts, `[d]` for a single string (`d`
            the model's output width: `projection_dim`, else the hidden width).

        Raises:
            ValueError: without a preprocessor, naming `preprocessor`; for `texts` that are
                not strings, a `batch_size` that is not a positive int, a `prompt_name` the
                model has no prompt for, or both `prompt` and `prompt_name`, naming them.

        Example:
        >>> import keras_hub
        >>> from keras_xf.preprocessing import TextClassifierPreprocessor
        >>> encoder = TextEncoder(
        ...     vocabulary_size=256, num_layers=1, hidden_dim=16, num_heads=2,
        ...     intermediate_dim=32, preprocessor=TextClassifierPreprocessor(
        ...         keras_hub.tokenizers.ByteTokenizer(), sequence_length=32))
        >>> encoder.encode(["To be, or not to be", "that is the question"]).shape
        (2, 16)
        """
        if self.preprocessor is None:
            raise ValueError(
                "encode takes text only with a preprocessor (a TextClassifierPreprocessor: "
                "preprocessor=, or a folder with tokenizer.json); for token ids, call "
                "predict. Received: preprocessor=None"
            )
        prefix = self._prompt(prompt_name, prompt)
        rows = [prefix + row for row in text_list(texts)]
        batch_size = min(check_positive_int("batch_size", batch_size), len(rows))
        embeddings = []
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            # The last batch, padded to the others' size: one shape, one compiled function.
            padded = batch + [batch[0]] * (batch_size - len(batch))
            inputs, _, _ = preprocessed(self.preprocessor, padded)
            output = ops.convert_to_numpy(self.predict_on_batch(inputs))
            embeddings.append(np.asarray(output, "float32")[: len(batch)])
        embeddings = np.concatenate(embeddings)
        return embeddings[0] if isinstance(texts, (str, bytes)) else embeddings

    def _prompt(self, prompt_name, prompt):
        """The text `encode` puts before each input (see `encode`)."""
        if prompt is not None and prompt_name is not None:
            raise ValueError("Pass prompt or prompt_name, not both. Received: "
                             f"prompt={prompt!r}, prompt_name={prompt_name!r}")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"prompt must be a string. Received: prompt of type "
                                 f"{type(prompt).__name__}")
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            raise ValueError(f"prompt_name must be one of the model's prompts "
                             f"{sorted(self.prompts)}. Received: prompt_name={name!r}")
        return self.prompts[name]

    def similarity(self, inputs_a, inputs_b):
        """Cosine similarity of the embeddings of two batches (ids, or texts with a
        preprocessor), `[B]` (numpy)."""
        inputs_a, _, _ = preprocessed(self.preprocessor, inputs_a)
        inputs_b, _, _ = preprocessed(self.preprocessor, inputs_b)
        a = ops.convert_to_numpy(self.predict_on_batch(inputs_a))
        b = ops.convert_to_numpy(self.predict_on_batch(inputs_b))
        return cosine_similarity(a, b)


def check_prompts(prompts, default_prompt_name):
    """`prompts` as a dict of strings by name (`{}` for `None`), and `default_prompt_name`
    one of its keys or `None`; a `ValueError` naming the argument otherwise."""
    prompts = {} if prompts is None else prompts
    if not isinstance(prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"prompts must be a dict of prompt texts by name (strings). "
                         f"Received: prompts={prompts!r}")
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ValueError(f"default_prompt_name must be a key of prompts {sorted(prompts)}. "
                         f"Received: default_prompt_name={default_prompt_name!r}")
    return dict(prompts), default_prompt_name


def cosine_similarity(a, b, axis=-1):
    """`a·b / (|a| |b|)` along `axis`, with a floor on the norms."""
    a, b = ops.cast(a, "float32"), ops.cast(b, "float32")
    norm = ops.sqrt(ops.sum(a * a, axis=axis)) * ops.sqrt(ops.sum(b * b, axis=axis))
    return ops.convert_to_numpy(ops.sum(a * b, axis=axis) / ops.maximum(norm, 1e-12))
