"""CausalLM: a causal TransformerBackbone with a tied or untied output projection."""

import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import TransformerBlock
from keras_xf.models import CausalLM
from keras_xf.models import TransformerBackbone
from tests.models.tiny import FFN
from tests.models.tiny import LAYERS
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import block_params
from tests.models.tiny import causal_lm
from tests.models.tiny import dtype_name
from tests.models.tiny import randomize_embeddings
from tests.layer_checks import to_numpy
from tests.models.tiny import token_batch


ABAB = {"token_ids": np.array([[7, 9] * 4, [9, 7] * 4], "int32"),
        "padding_mask": np.ones((2, 8), "int32")}


def logits_of(model, batch):
    return to_numpy(model(batch, training=False))


def assert_causal(model, rng):
    """Changing the token at position t changes no logits before t."""
    batch = token_batch(rng)
    changed = {k: v.copy() for k, v in batch.items()}
    changed["token_ids"][0, 5] = (changed["token_ids"][0, 5] + 1) % VOCAB
    before, after = logits_of(model, batch), logits_of(model, changed)
    np.testing.assert_allclose(after[:, :5], before[:, :5], atol=1e-5)
    assert not np.allclose(after[:, 5:], before[:, 5:], atol=1e-4)


def test_keyword_form_builds_a_post_norm_relu_model(rng):
    model = CausalLM(vocabulary_size=VOCAB, num_layers=LAYERS, hidden_dim=WIDTH, num_heads=2,
                     intermediate_dim=FFN, max_sequence_length=LENGTH)
    batch = token_batch(rng, lengths=[8, 4])
    logits = model(batch)
    assert tuple(logits.shape) == (2, 8, VOCAB)
    assert dtype_name(logits) == "float32"
    # Tied output, sinusoidal positions: token table plus the blocks, nothing else.
    assert model.count_params() == VOCAB * WIDTH + LAYERS * block_params()
    blocks = model.backbone.transformer_stack.blocks
    assert len(blocks) == LAYERS
    assert blocks[0].norm_placement == "post"
    assert blocks[0].feedforward.activation == "relu"
    assert blocks[0].mixer.num_heads == 2
    assert blocks[0].feedforward.hidden_dim == FFN
    assert model.backbone.causal and model.backbone.position == "sinusoidal"


def test_block_form_uses_the_template_for_every_layer(rng):
    model = CausalLM(
        vocabulary_size=VOCAB,
        num_layers=LAYERS,
        hidden_dim=WIDTH,
        block=TransformerBlock(
            mixer=MultiHeadAttention(num_heads=4, head_dim=4),
            feedforward=FeedForward(hidden_dim=FFN, activation="gelu"),
            norm_placement="pre",
        ),
        max_sequence_length=LENGTH,
        position="learned",
    )
    logits = model(token_batch(rng))
    assert tuple(logits.shape) == (2, 8, VOCAB)
    expected = (
        VOCAB * WIDTH  # tied token table
        + LENGTH * WIDTH  # learned positions
        + LAYERS * block_params(heads=4, head_dim=4)
        + 2 * WIDTH  # the final LayerNorm of a pre-norm stack
    )
    assert model.count_params() == expected
    blocks = model.backbone.transformer_stack.blocks
    assert [b.norm_placement for b in blocks] == ["pre"] * LAYERS
    assert [b.feedforward.activation for b in blocks] == ["gelu"] * LAYERS
    assert [(b.mixer.num_heads, b.mixer.head_dim) for b in blocks] == [(4, 4)] * LAYERS
    # Fresh weights per layer, not shared with each other.
    kernels = [to_numpy(b.feedforward.weights[0]) for b in blocks]
    assert not np.allclose(kernels[0], kernels[1])
    assert_causal(model, rng)


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rotary"])
def test_positions(rng, position):
    model = causal_lm(position=position, num_layers=1)
    extra = LENGTH * WIDTH if position == "learned" else 0
    assert model.count_params() == VOCAB * WIDTH + block_params() + extra
    mixer = model.backbone.transformer_stack.blocks[0].mixer
    assert isinstance(mixer.position, RotaryEmbedding) == (position == "rotary")
    assert_causal(model, rng)
    # Positions matter: in `a b a b` the second `b` sees the same mix of tokens as the first
    # (attention is order-blind), so only positions can tell them apart.
    randomize_embeddings(model)
    logits = logits_of(model, ABAB)[0]
    assert not np.allclose(logits[1], logits[3], atol=1e-4)


def test_rotary_settings_of_the_template_are_kept():
    # A Llama-3-style base and a position interpolation factor survive position="rotary".
    rope = RotaryEmbedding(max_wavelength=500000.0, scaling_factor=4.0)
    block = TransformerBlock(MultiHeadAttention(2, position=rope), FeedForward(FFN))
    model = CausalLM(vocabulary_size=VOCAB, num_layers=2, hidden_dim=WIDTH, block=block,
                     position="rotary", max_sequence_length=LENGTH)
    for layer in model.backbone.transformer_stack.blocks:
        assert layer.mixer.position.max_wavelength == 500000.0
        assert layer.mixer.position.scaling_factor == 4.0
    clone = CausalLM.from_config(model.get_config())
    assert clone.backbone.transformer_stack.blocks[0].mixer.position.max_wavelength == 500000.0


def test_rotary_position_refuses_a_template_with_another_position_hook():
    from keras_xf.layers import PositionHook

    block = TransformerBlock(MultiHeadAttention(2, position=PositionHook()), FeedForward(FFN))
    with pytest.raises(ValueError, match='position="rotary".*PositionHook'):
        CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                 position="rotary")


def test_position_none_is_order_blind_up_to_causality(rng):
    model = causal_lm(position="none", num_layers=1)
    randomize_embeddings(model)
    logits = logits_of(model, ABAB)[0]
    np.testing.assert_allclose(logits[3], logits[1], atol=1e-5)


def test_tied_and_untied_output_projection(rng):
    tied = causal_lm(num_layers=1)
    untied = causal_lm(num_layers=1, tie_embeddings=False)
    assert untied.count_params() - tied.count_params() == VOCAB * WIDTH
    batch = token_batch(rng)
    for model in (tied, untied):
        randomize_embeddings(model)
        hidden = to_numpy(model.backbone(batch))
        embedding = model.backbone.token_embedding
        projection = (to_numpy(embedding.embeddings).T if model is tied
                      else to_numpy(embedding.reverse_embeddings))
        np.testing.assert_allclose(logits_of(model, batch), hidden @ projection, atol=1e-4,
                                   rtol=1e-5)


def test_padding_does_not_change_real_positions(rng):
    model = causal_lm(num_layers=1)
    short = token_batch(rng, lengths=[8, 5])
    longer = {
        "token_ids": np.pad(short["token_ids"], ((0, 0), (0, 4)), constant_values=9),
        "padding_mask": np.pad(short["padding_mask"], ((0, 0), (0, 4))),
    }
    np.testing.assert_allclose(logits_of(model, longer)[:, :8], logits_of(model, short), atol=1e-5)


def test_accepts_a_backbone():
    backbone = TransformerBackbone(VOCAB, num_layers=1, hidden_dim=WIDTH, num_heads=2,
                                   intermediate_dim=FFN, max_sequence_length=LENGTH, causal=True)
    model = CausalLM(backbone=backbone)
    assert model.backbone is backbone
    assert model.count_params() == backbone.count_params()


def test_config_round_trip():
    model = causal_lm(num_layers=1, position="rotary", num_key_value_heads=1, pad_token_id=3)
    config = model.get_config()
    clone = CausalLM.from_config(config)
    assert clone.get_config() == config
    assert clone.pad_token_id == 3
    assert clone.count_params() == model.count_params()
    assert clone.backbone.transformer_stack.blocks[0].mixer.num_key_value_heads == 1


def test_embedding_normalization(rng):
    # A norm of the summed embeddings before the first block (BLOOM), kept through the
    # config, used by cached decoding, and refused when unknown.
    model = causal_lm(num_layers=1, position="none", norm_placement="pre",
                      embedding_normalization="layer_norm", embedding_epsilon=1e-6)
    norm = model.backbone.embeddings.norm
    assert norm.epsilon == 1e-6
    assert model.count_params() == causal_lm(num_layers=1, position="none",
                                             norm_placement="pre").count_params() + 2 * WIDTH
    config = model.get_config()
    clone = CausalLM.from_config(config)
    assert clone.get_config() == config
    assert clone.backbone.embedding_normalization == "layer_norm"
    assert clone.backbone.embedding_epsilon == 1e-6
    batch = token_batch(rng)
    norm.gamma.assign(rng.normal(size=(WIDTH,)).astype("float32"))
    full = logits_of(model, batch)
    cache = model.init_cache(2, 8)
    logits, _, cache = model.call_with_cache(batch["token_ids"][:, :5], cache, 0)
    steps = [to_numpy(logits)]
    for t in range(5, 8):
        logits, _, cache = model.call_with_cache(batch["token_ids"][:, t:t + 1], cache, t)
        steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert causal_lm(num_layers=1).backbone.embeddings.norm is None
    with pytest.raises(ValueError, match="embedding_normalization"):
        causal_lm(num_layers=1, embedding_normalization="batch_norm")
    with pytest.raises(ValueError, match="embedding_epsilon"):
        causal_lm(num_layers=1, embedding_normalization="layer_norm", embedding_epsilon=0.0)


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="num_heads"):
        CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, intermediate_dim=FFN)
    with pytest.raises(ValueError, match="vocabulary_size"):
        causal_lm(vocabulary_size=0)
    with pytest.raises(ValueError, match="causal"):
        CausalLM(backbone=TransformerBackbone(VOCAB, 1, WIDTH, num_heads=2, intermediate_dim=FFN))
    with pytest.raises(ValueError, match="either a backbone or backbone arguments"):
        CausalLM(backbone=TransformerBackbone(VOCAB, 1, WIDTH, num_heads=2, intermediate_dim=FFN,
                                              causal=True), num_layers=2)


def test_gpt2_small_preset_with_tiny_overrides():
    model = CausalLM.from_preset(
        "gpt2_small", vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, num_heads=2,
        intermediate_dim=FFN, max_sequence_length=LENGTH,
    )
    config = model.backbone.get_config()
    # Overridden sizes; the GPT-2 architecture kept.
    assert (config["vocabulary_size"], config["num_layers"], config["hidden_dim"]) == (
        VOCAB, 1, WIDTH)
    assert config["position"] == "learned"
    assert config["norm_placement"] == "pre"
    assert config["activation"] == "gelu_tanh"
    assert config["tie_embeddings"] is True
    assert config["dropout"] == 0.1
    assert model.count_params() == (
        VOCAB * WIDTH + LENGTH * WIDTH + block_params() + 2 * WIDTH
    )


def test_gpt2_small_preset_hyperparameters():
    from keras_xf.models.backbones.presets import preset_config

    config = preset_config("gpt2_small", "causal_lm")
    assert {k: config[k] for k in ("vocabulary_size", "num_layers", "hidden_dim", "num_heads",
                                    "intermediate_dim", "max_sequence_length")} == dict(
        vocabulary_size=50257, num_layers=12, hidden_dim=768, num_heads=12,
        intermediate_dim=3072, max_sequence_length=1024)
    # GPT-2's "gelu_new" is the tanh approximation; BERT's "gelu" is the exact form.
    assert config["activation"] == "gelu_tanh" and config["norm_placement"] == "pre"
    assert preset_config("bert_base", "text_encoder")["activation"] == "gelu"


def test_unknown_or_mismatched_preset_raises():
    with pytest.raises(ValueError, match="Unknown preset"):
        CausalLM.from_preset("gpt5_huge")
    with pytest.raises(ValueError, match="transformer_base"):
        CausalLM.from_preset("transformer_base")
