"""The keras_xf models and their keras-hub anchors, built with the sizes of `config.py`."""

import keras

from benchmarks import config as c


def xf_causal_lm(dtype=None):
    """A `CausalLM` configured like keras-hub's `GPT2Backbone`: pre-norm, tanh-GELU, learned
    positions, tied embeddings, biases, layer norm ε = 1e-5."""
    from keras_xf.models import CausalLM

    return CausalLM(
        vocabulary_size=c.VOCAB,
        num_layers=c.LAYERS,
        hidden_dim=c.WIDTH,
        num_heads=c.HEADS,
        intermediate_dim=c.FFN,
        max_sequence_length=c.SEQUENCE + c.NEW_TOKENS,
        position="learned",
        activation="gelu_tanh",
        norm_placement="pre",
        dropout=c.DROPOUT,
        tie_embeddings=True,
        dtype=dtype,
    )


def hub_causal_lm(dtype=None):
    """keras-hub's `GPT2Backbone` with its tied head (`GPT2CausalLM` without preprocessor)."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=c.VOCAB,
        num_layers=c.LAYERS,
        num_heads=c.HEADS,
        hidden_dim=c.WIDTH,
        intermediate_dim=c.FFN,
        dropout=c.DROPOUT,
        max_sequence_length=c.SEQUENCE + c.NEW_TOKENS,
        dtype=dtype,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def xf_text_encoder():
    """A `TextEncoder` configured like `BertBackbone`: post-norm, GELU, learned positions,
    first-token pooling."""
    from keras_xf.models import TextEncoder

    return TextEncoder(
        vocabulary_size=c.VOCAB,
        num_layers=c.LAYERS,
        hidden_dim=c.WIDTH,
        num_heads=c.HEADS,
        intermediate_dim=c.FFN,
        max_sequence_length=c.ENCODER_SEQUENCE,
        position="learned",
        activation="gelu",
        norm_placement="post",
        dropout=c.DROPOUT,
        pooling="cls",
        projection_dim=c.WIDTH,
        normalize=False,
    )


def hub_text_encoder():
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=c.VOCAB,
        num_layers=c.LAYERS,
        num_heads=c.HEADS,
        hidden_dim=c.WIDTH,
        intermediate_dim=c.FFN,
        dropout=c.DROPOUT,
        max_sequence_length=c.ENCODER_SEQUENCE,
    )


def compile_for_training(model, chunked_loss=False):
    """AdamW and sparse cross-entropy on the logits; with `chunked_loss`, keras_xf's
    `ChunkedCrossEntropy` (the same value, without the `[tokens, V]` logits)."""
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if chunked_loss:
        from keras_xf.training import ChunkedCrossEntropy

        loss = ChunkedCrossEntropy(chunk_size=c.LOSS_CHUNK)
    model.compile(
        optimizer=keras.optimizers.AdamW(c.LEARNING_RATE, weight_decay=0.01),
        loss=loss,
        weighted_metrics=None,
    )
    return model


def training_flops_per_token(sequence=None):
    """Matmul FLOPs of one training token: 6·N (forward 2·N, backward 4·N) over the weight
    matrices, tied output projection included, plus 12·L·T·d for the attention scores and
    weighted sums (forward and backward, the causal half not discounted); T is `sequence`,
    `config.SEQUENCE` by default."""
    sequence = c.SEQUENCE if sequence is None else sequence
    per_layer = 4 * c.WIDTH * c.WIDTH + 2 * c.WIDTH * c.FFN
    weights = c.LAYERS * per_layer + c.VOCAB * c.WIDTH
    return 6 * weights + 12 * c.LAYERS * sequence * c.WIDTH
