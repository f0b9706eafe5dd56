"""Seq2SeqLM and Seq2SeqBackbone: encoder-decoder Transformers, shared or separate embeddings."""

import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.models import Seq2SeqBackbone
from keras_xf.models import Seq2SeqLM
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import LENGTH
from tests.models.tiny import SIZES
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.models.tiny import dtype_name
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_batch
from tests.models.tiny import seq2seq_lm
from tests.layer_checks import to_numpy

SOURCE_VOCAB = 20


def seq2seq_params(vocabulary_size, num_layers, hidden_dim, intermediate_dim,
                   source_vocabulary_size=None, share_embeddings=True, **_):
    """Weights of a post-norm, sinusoidal, tied encoder-decoder (Vaswani et al. 2017)."""
    d, f = hidden_dim, intermediate_dim
    embeddings = vocabulary_size * d
    if not share_embeddings:
        embeddings += (source_vocabulary_size or vocabulary_size) * d
    return (embeddings + num_layers * block_params(d, f)
            + num_layers * block_params(d, f, cross=True))


def logits_of(model, batch):
    return to_numpy(model(batch, training=False))


def test_keyword_form(rng):
    model = Seq2SeqLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, num_heads=HEADS,
                      intermediate_dim=FFN, max_sequence_length=LENGTH)
    batch = seq2seq_batch(rng, source_lengths=[8, 5])
    logits = model(batch)
    assert tuple(logits.shape) == (2, 6, VOCAB)
    assert dtype_name(logits) == "float32"
    assert model.count_params() == seq2seq_params(VOCAB, 1, WIDTH, FFN)
    decoder_block = model.backbone.decoder.blocks[0]
    assert decoder_block.cross_attention is not None
    assert model.backbone.encoder.blocks[0].cross_attention is None


def test_shared_and_separate_embeddings(rng):
    shared = seq2seq_lm()
    separate = seq2seq_lm(share_embeddings=False, source_vocabulary_size=SOURCE_VOCAB)
    backbone = shared.backbone
    assert backbone.encoder_embeddings is backbone.decoder_embeddings
    assert separate.backbone.encoder_embeddings is not separate.backbone.decoder_embeddings
    assert separate.count_params() - shared.count_params() == SOURCE_VOCAB * WIDTH
    assert separate.count_params() == seq2seq_params(
        VOCAB, 1, WIDTH, FFN, source_vocabulary_size=SOURCE_VOCAB, share_embeddings=False)
    batch = seq2seq_batch(rng)
    batch["encoder_token_ids"] = batch["encoder_token_ids"] % SOURCE_VOCAB
    assert logits_of(separate, batch).shape == (2, 6, VOCAB)
    # The source table is the encoder's own: changing it changes the logits.
    table = separate.backbone.encoder_embeddings.token_embedding.embeddings
    before = logits_of(separate, batch)
    table.assign(to_numpy(table) * 3.0)
    assert not np.allclose(logits_of(separate, batch), before, atol=1e-5)


def test_shared_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="source_vocabulary_size"):
        seq2seq_lm(source_vocabulary_size=SOURCE_VOCAB)


def test_decoder_is_causal_and_sees_the_source(rng):
    model = randomize_embeddings(seq2seq_lm())
    batch = seq2seq_batch(rng)
    before = logits_of(model, batch)
    future = {k: v.copy() for k, v in batch.items()}
    future["decoder_token_ids"][0, 4] = (future["decoder_token_ids"][0, 4] + 1) % VOCAB
    after = logits_of(model, future)
    np.testing.assert_allclose(after[:, :4], before[:, :4], atol=1e-5)
    assert not np.allclose(after[:, 4:], before[:, 4:], atol=1e-4)
    source = {k: v.copy() for k, v in batch.items()}
    source["encoder_token_ids"][0, 0] = (source["encoder_token_ids"][0, 0] + 1) % VOCAB
    assert not np.allclose(logits_of(model, source)[:, 0], before[:, 0], atol=1e-4)


def test_source_padding_is_ignored(rng):
    model = randomize_embeddings(seq2seq_lm())
    batch = seq2seq_batch(rng, source_lengths=[8, 5])
    padded = dict(batch)
    padded["encoder_token_ids"] = np.pad(batch["encoder_token_ids"], ((0, 0), (0, 4)),
                                         constant_values=7)
    padded["encoder_padding_mask"] = np.pad(batch["encoder_padding_mask"], ((0, 0), (0, 4)))
    np.testing.assert_allclose(logits_of(model, padded), logits_of(model, batch), atol=1e-5)


def test_logits_are_the_tied_projection_of_the_decoder_states(rng):
    model = randomize_embeddings(seq2seq_lm())
    batch = seq2seq_batch(rng)
    outputs = model.backbone(batch)
    hidden = to_numpy(outputs["decoder_sequence_output"])
    table = to_numpy(model.backbone.decoder_embeddings.token_embedding.embeddings)
    np.testing.assert_allclose(logits_of(model, batch), hidden @ table.T, atol=1e-4, rtol=1e-5)


def test_backbone_outputs_and_encode(rng):
    backbone = Seq2SeqBackbone(**SIZES, num_layers=1, num_decoder_layers=2)
    batch = seq2seq_batch(rng, source_lengths=[8, 5])
    outputs = backbone(batch)
    assert set(outputs) == {"encoder_sequence_output", "decoder_sequence_output"}
    assert tuple(outputs["encoder_sequence_output"].shape) == (2, 8, WIDTH)
    assert tuple(outputs["decoder_sequence_output"].shape) == (2, 6, WIDTH)
    assert len(backbone.encoder.blocks) == 1 and len(backbone.decoder.blocks) == 2
    encoded = backbone.encode(batch["encoder_token_ids"], batch["encoder_padding_mask"])
    np.testing.assert_allclose(to_numpy(encoded), to_numpy(outputs["encoder_sequence_output"]),
                               atol=1e-5)
    # The encoder does not look at the target.
    changed = dict(batch, decoder_token_ids=(batch["decoder_token_ids"] + 1) % VOCAB)
    np.testing.assert_allclose(to_numpy(backbone(changed)["encoder_sequence_output"]),
                               to_numpy(outputs["encoder_sequence_output"]), atol=1e-6)


def test_block_template_gets_a_cross_attention_copy_for_the_decoder(rng):
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=4, head_dim=4),
        feedforward=FeedForward(hidden_dim=FFN, activation="gelu"),
        norm_placement="pre",
    )
    model = Seq2SeqLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                      max_sequence_length=LENGTH, position="learned")
    logits = model(seq2seq_batch(rng))
    assert tuple(logits.shape) == (2, 6, VOCAB)
    decoder_block = model.backbone.decoder.blocks[0]
    assert decoder_block.cross_attention.num_heads == 4
    assert decoder_block.norm_placement == "pre"
    attention = dict(heads=4, head_dim=4)
    assert model.count_params() == (
        VOCAB * WIDTH + LENGTH * WIDTH  # shared token table, one learned position table
        + block_params(**attention) + block_params(cross=True, **attention)
        + 2 * 2 * WIDTH  # final LayerNorms of the pre-norm encoder and decoder
    )


def test_config_round_trip():
    model = seq2seq_lm(share_embeddings=False, source_vocabulary_size=SOURCE_VOCAB,
                       start_token_id=2, pad_token_id=0)
    config = model.get_config()
    clone = Seq2SeqLM.from_config(config)
    assert clone.get_config() == config
    assert clone.start_token_id == 2
    assert clone.count_params() == model.count_params()


class _PresetArguments(Seq2SeqLM):
    """Records what `from_preset` passes to the constructor without building the (60 M and
    200 M weight) models; their architecture is checked at small width below."""

    def __init__(self, **kwargs):
        object.__setattr__(self, "arguments", kwargs)


PAPER = {  # Vaswani et al. 2017, Table 3 (survey §2.5)
    "transformer_base": dict(num_layers=6, hidden_dim=512, num_heads=8, intermediate_dim=2048,
                             dropout=0.1, params=60_522_496),
    "transformer_big": dict(num_layers=6, hidden_dim=1024, num_heads=16, intermediate_dim=4096,
                            dropout=0.3, params=209_125_376),
}


@pytest.mark.parametrize("preset", sorted(PAPER))
def test_transformer_presets(preset):
    expected = dict(PAPER[preset])
    params = expected.pop("params")
    arguments = _PresetArguments.from_preset(preset).arguments
    assert {k: arguments[k] for k in expected} == expected
    assert arguments["vocabulary_size"] == 32000
    assert arguments["position"] == "sinusoidal"
    assert arguments["norm_placement"] == "post"
    assert arguments["activation"] == "relu"
    assert arguments["share_embeddings"] and arguments["tie_embeddings"]
    assert arguments["embedding_scale"]
    assert seq2seq_params(**arguments) == params
    # The same architecture at width 16 has exactly the weights the formula counts.
    small = dict(vocabulary_size=VOCAB, hidden_dim=WIDTH, num_heads=HEADS, intermediate_dim=FFN,
                 max_sequence_length=LENGTH, num_layers=1)
    model = Seq2SeqLM.from_preset(preset, **small)
    config = model.backbone.get_config()
    assert {k: config[k] for k in ("position", "norm_placement", "activation", "dropout",
                                   "share_embeddings", "embedding_scale")} == {
        k: arguments[k] for k in ("position", "norm_placement", "activation", "dropout",
                                  "share_embeddings", "embedding_scale")}
    assert model.count_params() == seq2seq_params(**{**arguments, **small})


def test_unknown_or_mismatched_preset_raises():
    with pytest.raises(ValueError, match="Unknown preset"):
        Seq2SeqLM.from_preset("transformer_huge")
    with pytest.raises(ValueError, match="gpt2_small"):
        Seq2SeqLM.from_preset("gpt2_small")
