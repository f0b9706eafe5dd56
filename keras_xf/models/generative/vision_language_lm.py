"""Text generation conditioned on an image: prefix or cross-attention fusion (survey §6.5)."""

import numpy as np
import keras
from keras import ops

from keras_xf.generation.prompts import check_keys
from keras_xf.layers.attention.prefix_attention_mask import PrefixAttentionMask
from keras_xf.layers.blocks.gated_cross_attention_block import GatedCrossAttentionBlock
from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.cloning import clone_layer
from keras_xf.layers.embeddings.patch_embedding import PatchEmbedding
from keras_xf.layers.embeddings.patch_position_embedding import PatchPositionEmbedding
from keras_xf.layers.embeddings.token_and_position_embedding import TokenAndPositionEmbedding
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.functional_model import layer_dtype
from keras_xf.models.backbones.block_factory import default_block
from keras_xf.models.backbones.block_factory import prepare_block
from keras_xf.models.generative.generative_task import GenerativeTask

FUSIONS = ("prefix", "cross_attention")
IMAGE, TEXT = 0, 1  # rows of the modality embedding


def _gated_template(block, position):
    """A `GatedCrossAttentionBlock` around the decoder layer, whose cross-attention and
    feedforward are copies of the layer's own attention and feedforward (none when the layer
    has none)."""
    with_cross = prepare_block(block, position, cross_attention=True)
    feedforward = with_cross.feedforward
    return GatedCrossAttentionBlock(
        prepare_block(block, position),
        cross_attention=clone_layer(with_cross.cross_attention),
        feedforward=None if feedforward is None else clone_layer(feedforward),
    )


def _validate(vocabulary_size, image_shape, patch_size, num_layers, hidden_dim,
              max_sequence_length, fusion, gated_cross_attention, vision_layers):
    for arg, value in (
        ("vocabulary_size", vocabulary_size),
        ("patch_size", patch_size),
        ("num_layers", num_layers),
        ("hidden_dim", hidden_dim),
        ("max_sequence_length", max_sequence_length),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{arg} must be a positive int. Received: {arg}={value}")
    if (not isinstance(image_shape, (tuple, list)) or len(image_shape) != 3
            or not all(isinstance(s, int) and s > 0 for s in image_shape)):
        raise ValueError(
            "image_shape must be (height, width, channels) of positive ints. Received: "
            f"image_shape={image_shape}"
        )
    if image_shape[0] % patch_size or image_shape[1] % patch_size:
        raise ValueError(
            "The image height and width must be divisible by patch_size. Received: "
            f"image_shape={tuple(image_shape)}, patch_size={patch_size}"
        )
    if fusion not in FUSIONS:
        raise ValueError(f"fusion must be one of {FUSIONS}. Received: fusion={fusion!r}")
    if gated_cross_attention and fusion != "cross_attention":
        raise ValueError(
            "gated_cross_attention needs fusion='cross_attention'. Received: "
            f"gated_cross_attention={gated_cross_attention}, fusion={fusion!r}"
        )
    if vision_layers is not None and (
        isinstance(vision_layers, bool) or not isinstance(vision_layers, int) or vision_layers < 0
    ):
        raise ValueError(
            f"vision_layers must be an int >= 0 or None. Received: vision_layers={vision_layers}"
        )


@keras.saving.register_keras_serializable(package="keras_xf")
class VisionLanguageLM(GenerativeTask):
    """`P(y_i | y_<i, image)`: a text decoder conditioned on image patches (survey §6.5).

    The image `[H, W, C]` is cut into `N = HW/P²` patches, each flattened and mapped to `d`
    (§6.4), plus a learned or 2-D sinusoidal patch position, then optionally encoded by `vision_layers`
    bidirectional Transformer layers: `H_img = Enc(PatchEmbed(image) + PE_img)`. Two fusions:

    - `fusion="prefix"` (decoder-only, §6.5, Fig. (c)): `[H_img + m_img; Embed(y) + PE + m_txt]`
      (`m` a modality embedding) is one sequence of a decoder whose mask lets image positions
      attend to each other bidirectionally and text positions attend to the whole image and
      causally to earlier text. Generation fills the cache with the image once, then decodes
      text token by token.
    - `fusion="cross_attention"` (encoder-decoder, §6.5): each decoder layer cross-attends to
      `H_img`, `S' = Layer_ffn(Layer_cross(H_img, Layer_self(S)))`, as `Seq2SeqLM`. With
      `gated_cross_attention=True` the decoder layers are plain language-model layers and a
      Flamingo-style `GatedCrossAttentionBlock` is inserted in front of each,
      `y = x + tanh(α)·CrossAttn(LNorm(x), H_img)` with `α = 0` at the start (a pure LM).

    Args:
        vocabulary_size: int, text vocabulary.
        image_shape: `(height, width, channels)`.
        patch_size: int `P`, dividing height and width.
        num_layers: int, decoder layers.
        hidden_dim: int `d`.
        num_heads, intermediate_dim: ints for the default block.
        max_sequence_length: int, longest text.
        fusion: `"prefix"` or `"cross_attention"`.
        gated_cross_attention: bool (cross-attention fusion only).
        vision_layers: int, image encoder layers; `None` = 0 for `"prefix"` (patches go
            straight into the decoder) and `num_layers` for `"cross_attention"`.
        block: optional block template for the decoder and the image encoder.
        position: text positions, `"sinusoidal"`, `"learned"`, `"rotary"` or `"none"`.
        patch_position: patch positions, `"learned"` or `"sinusoidal_2d"`
            (`PatchPositionEmbedding`).
        num_key_value_heads, activation, norm_placement, normalization, dropout,
        tie_embeddings: as in `TransformerBackbone`.
        embedding_scale: bool, multiply token embeddings by `√d` (survey §2.1). With the
            default Keras embedding initialisation (±0.05) and no scale, the few text tokens
            can be swamped by the image states they attend to in the prefix form; the scale
            keeps the words visible (see `examples/visual_qa.py`).
        pad_token_id: int.
        start_token_id: int, the prompt of `generate` when none is given.
        dtype: a dtype policy.

    Inputs: `{"images": float [B, H, W, C], "token_ids": int [B, T], "padding_mask": [B, T]}`.
    Outputs: float32 logits `[B, T, vocabulary_size]` over the text positions.

    `generate` (from `GenerativeTask`) takes `{"images", "token_ids", "padding_mask"}`:
    `token_ids` a padded 2-D array (`pad_token_id` entries are padding unless
    `padding_mask` is given) or a list of lists, and `[start_token_id]` per image when
    absent; results follow the form of the prompts (a dict when `padding_mask` is given).

    Example:
    >>> model = VisionLanguageLM(vocabulary_size=20, image_shape=(8, 8, 1), patch_size=4,
    ...                          num_layers=1, hidden_dim=16, num_heads=2,
    ...                          intermediate_dim=32, max_sequence_length=8)
    >>> model.generate({"images": np.zeros((2, 8, 8, 1)), "token_ids": [[1], [1]]},
    ...                max_length=4)
    """

    def __init__(
        self,
        vocabulary_size,
        image_shape,
        patch_size,
        num_layers,
        hidden_dim,
        num_heads=None,
        intermediate_dim=None,
        max_sequence_length=512,
        fusion="prefix",
        gated_cross_attention=False,
        vision_layers=None,
        block=None,
        position="sinusoidal",
        patch_position="learned",
        num_key_value_heads=None,
        activation="relu",
        norm_placement="post",
        normalization="layer_norm",
        dropout=0.0,
        tie_embeddings=True,
        embedding_scale=False,
        pad_token_id=0,
        start_token_id=1,
        name=None,
        dtype=None,
        trainable=True,
    ):
        _validate(vocabulary_size, image_shape, patch_size, num_layers, hidden_dim,
                  max_sequence_length, fusion, gated_cross_attention, vision_layers)
        image_shape = tuple(image_shape)
        if block is None:
            block = default_block(
                num_heads, intermediate_dim, num_key_value_heads=num_key_value_heads,
                activation=activation, norm_placement=norm_placement,
                normalization=normalization, dropout=dropout,
            )
        elif not isinstance(block, keras.layers.Layer):
            block = keras.saving.deserialize_keras_object(block)
        encoder_layers = vision_layers
        if encoder_layers is None:
            encoder_layers = 0 if fusion == "prefix" else num_layers
        num_patches = (image_shape[0] // patch_size) * (image_shape[1] // patch_size)
        policy = layer_dtype(dtype)

        # Layers
        self.patch_embedding = PatchEmbedding(
            patch_size, hidden_dim, dtype=policy, name="patch_embedding"
        )
        self.patch_position_embedding = PatchPositionEmbedding(
            (image_shape[0] // patch_size, image_shape[1] // patch_size), kind=patch_position,
            dtype=policy, name="patch_position_embedding",
        )
        self.vision_encoder = None
        if encoder_layers:
            self.vision_encoder = TransformerStack(
                prepare_block(block, "none"), encoder_layers, dtype=policy, name="vision_encoder"
            )
        self.embeddings = TokenAndPositionEmbedding(
            vocabulary_size, hidden_dim, position=position,
            max_sequence_length=max_sequence_length, tie_weights=tie_embeddings,
            scale=embedding_scale,
            dropout=dropout, dtype=policy, name="embeddings",
        )
        self.modality_embedding = None
        self.prefix_mask = None
        if fusion == "prefix":
            self.modality_embedding = keras.layers.Embedding(
                2, hidden_dim, dtype=policy, name="modality_embedding"
            )
            self.prefix_mask = PrefixAttentionMask(num_patches, dtype=policy, name="prefix_mask")
            template = prepare_block(block, position)
        elif gated_cross_attention:
            template = _gated_template(block, position)
        else:
            template = prepare_block(block, position, cross_attention=True)
        self.decoder = TransformerStack(template, num_layers, dtype=policy, name="decoder")
        self.num_patches = num_patches
        self.fusion = fusion

        # Functional model
        inputs = {
            "images": keras.Input(shape=image_shape, dtype="float32", name="images"),
            "token_ids": keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            "padding_mask": keras.Input(shape=(None,), dtype="int32", name="padding_mask"),
        }
        image_states = self.encode_images(inputs["images"])
        hidden = self._decode(image_states, inputs["token_ids"], inputs["padding_mask"])
        super().__init__(inputs=inputs, outputs=self._logits(hidden), pad_token_id=pad_token_id,
                         name=name, dtype=dtype, trainable=trainable)

        record_config(self, locals())

    # Inputs ---------------------------------------------------------------------------
    def _check_images(self, inputs):
        if not isinstance(inputs, dict) or "images" not in inputs:
            keys = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
            raise ValueError(
                "VisionLanguageLM needs a dict with 'images' [batch, height, width, channels] "
                f"and 'token_ids'. Received: {keys}"
            )
        shape = tuple(inputs["images"].shape)
        if len(shape) != 4 or shape[-1] != self.image_shape[-1]:
            raise ValueError(
                f"images must be [batch, height, width, {self.image_shape[-1]}] (channels of "
                f"image_shape={self.image_shape}). Received: images.shape={shape}"
            )
        if shape[1:3] != self.image_shape[:2]:
            raise ValueError(
                f"images must be {self.image_shape[0]}x{self.image_shape[1]} (image_shape="
                f"{self.image_shape}). Received: images.shape={shape}"
            )

    def call(self, inputs, training=None, mask=None):
        self._check_images(inputs)
        return super().call(inputs, training=training, mask=mask)

    # Shared by the functional graph and generation -------------------------------------
    def encode_images(self, images, training=None):
        """Images `[B, H, W, C]` to image states `[B, N, d]` (patches, positions, modality,
        then the vision encoder when there is one)."""
        states = self.patch_embedding(images)
        states = states + self.patch_position_embedding(states)
        if self.modality_embedding is not None:
            ids = ops.zeros_like(ops.cast(states[:, :, 0], "int32")) + IMAGE
            states = states + self.modality_embedding(ids)
        if self.vision_encoder is not None:
            states = self.vision_encoder(states, training=training)
        return states

    def _embed_text(self, token_ids, start_index=0, training=None):
        states = self.embeddings(token_ids, start_index=start_index, training=training)
        if self.modality_embedding is not None:
            states = states + self.modality_embedding(ops.zeros_like(token_ids) + TEXT)
        return states

    def _decode(self, image_states, token_ids, padding_mask, training=None):
        """Text hidden states `[B, T, d]` of the full (uncached) pass."""
        text = self._embed_text(token_ids, training=training)
        text_mask = ops.cast(padding_mask, "bool")
        if self.fusion == "prefix":
            sequence = ops.concatenate([image_states, text], axis=1)
            image_mask = ops.ones_like(ops.cast(image_states[:, :, 0], "bool"))
            hidden = self.decoder(
                sequence,
                padding_mask=ops.concatenate([image_mask, text_mask], axis=1),
                attention_mask=self.prefix_mask(sequence),
                use_causal_mask=False,
                training=training,
            )
            return hidden[:, self.num_patches:]
        return self.decoder(text, padding_mask=text_mask, encoder_outputs=image_states,
                            use_causal_mask=True, training=training)

    # Cached decoding -------------------------------------------------------------------
    def init_cache(self, batch_size, max_length):
        """Per-layer caches for `max_length` text tokens: the prefix form's self-attention
        caches also hold the `N` image positions; the cross-attention form's layers hold
        `(self_cache, image_keys_values)`."""
        dtype = self.decoder.compute_dtype
        if self.fusion == "prefix":
            return self.decoder.init_cache(batch_size, self.num_patches + max_length, dtype)
        return self.decoder.init_cache(batch_size, max_length, dtype,
                                       encoder_length=self.num_patches)

    def call_with_cache(self, token_ids, cache, cache_index, image_states=None):
        """Logits `[B, t, V]`, hidden states and the new cache for `t` text tokens at text
        position `cache_index`. Pass `image_states` on the first call (`cache_index=0`) to
        write the image into the cache; later calls reuse it."""
        hidden, cache = self._cached_hidden(token_ids, cache, cache_index, image_states)
        return self._logits(hidden), hidden, cache

    def _cached_hidden(self, token_ids, cache, cache_index, image_states=None):
        """Text hidden states and the new cache; with the prefix form and `image_states`,
        `token_ids=None` writes the image alone (hidden states `None`)."""
        if self.fusion != "prefix":
            return self.decoder(
                self._embed_text(token_ids, start_index=cache_index),
                encoder_outputs=image_states, use_causal_mask=True, cache=cache,
                cache_index=cache_index,
            )
        if image_states is not None:
            # The image first, at position 0: a cached call attends to the positions written
            # so far, which are the image's own (bidirectional).
            _, cache = self.decoder(image_states, use_causal_mask=False, cache=cache,
                                    cache_index=0)
            if token_ids is None:
                return None, cache
        # After the image, the prefix-LM field of a text query is the causal one.
        return self.decoder(
            self._embed_text(token_ids, start_index=cache_index), use_causal_mask=True,
            cache=cache, cache_index=cache_index + self.num_patches,
        )

    # Hooks of `GenerativeTask` ------------------------------------------------------------
    @property
    def _output_embeddings(self):
        return self.embeddings

    @property
    def _generation_stack(self):
        return self.decoder

    def _generate_inputs(self, inputs, max_length):
        self._check_images(inputs)
        check_keys(inputs, ("images",) + self.prompt_keys, required=("images",))
        images = np.asarray(ops.convert_to_numpy(inputs["images"]), "float32")
        prompts = inputs.get("token_ids")
        if prompts is None:
            prompts = [[self.start_token_id]] * images.shape[0]
        elif "padding_mask" in inputs:
            prompts = {key: inputs[key] for key in self.prompt_keys}
        prompts = self._pack_prompts(prompts, max_length)
        return prompts, {"images": images}, prompts.unpack

    def _generation_context(self, images):
        return self.encode_images(images)

    def _init_generation_cache(self, batch_size, max_length, image_states):
        return self.init_cache(batch_size, max_length)

    def _prefill(self, token_ids, cache, image_states):
        if token_ids is None and self.fusion != "prefix":
            batch_size = ops.shape(image_states)[0]
            return None, self._prefill_cross_attention(cache, batch_size,
                                                       image_states=image_states)
        return self._cached_hidden(token_ids, cache, 0, image_states)

    def _decode_token(self, token_ids, cache, cache_index):
        hidden, cache = self._cached_hidden(token_ids, cache, cache_index)
        return self._logits(hidden)[:, 0], hidden[:, 0], cache

    def _uncached_hidden(self, token_ids, image_states):
        return self._decode(image_states, token_ids, ops.ones_like(token_ids))
