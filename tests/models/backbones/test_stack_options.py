"""Models with `stack_options=...`: layer fusion, layer drop, parameter sharing and multi-step
residuals in a CausalLM, a Seq2SeqLM and a VisionBackbone (survey §4.2.3, §4.2.4, §4.3, §5.4),
with attention or mixture-of-experts blocks: cached decoding, `generate`, saving, weight
counts, `depth_initialization` and `prune_layers`."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from keras_xf.layers import deep_norm
from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqLM
from keras_xf.models import TextClassifier
from keras_xf.models import VisionBackbone
from keras_xf.surgery import prune_layers
from tests.layer_checks import to_numpy
from tests.models.tiny import block_params
from tests.models.tiny import cached_logits
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import SIZES
from tests.models.tiny import WIDTH
from tests.models.tiny import causal_lm
from tests.models.tiny import check_decoding_equals_full_pass
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_batch
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch

OPTIONS = {
    "fusion": {"fusion": "attention", "fusion_normalization": "layer_norm"},
    "share_layers": {"share_layers": "all"},
    "multistep": {"multistep": "adams_bashforth_2"},
    "layer_drop": {"layer_drop": 0.2},
}
CASES = pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))


@CASES
def test_cached_decoding_and_generate_equal_the_full_pass(rng, options):
    model = randomize_embeddings(causal_lm(num_layers=3, norm_placement="pre",
                                           stack_options=options))
    assert isinstance(model.backbone.transformer_stack, TransformerStack)
    check_decoding_equals_full_pass(model, token_batch(rng))


@CASES
def test_saving_round_trip(rng, tmp_path, options):
    model = causal_lm(num_layers=2, stack_options=options)
    batch = token_batch(rng)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.backbone.stack_options == options
    np.testing.assert_allclose(to_numpy(loaded(batch)), to_numpy(model(batch)), atol=1e-5)


def test_shared_layers_count_once():
    plain = causal_lm(num_layers=4)
    shared = causal_lm(num_layers=4, stack_options={"share_layers": "all"})
    pairs = causal_lm(num_layers=4, stack_options={"share_layers": 2})
    assert plain.count_params() - shared.count_params() == 3 * block_params()
    assert plain.count_params() - pairs.count_params() == 2 * block_params()


def test_prune_layers_of_a_causal_lm(rng):
    model = randomize_embeddings(causal_lm(num_layers=4, norm_placement="pre",
                                           stack_options={"layer_drop": 0.2}))
    batch = token_batch(rng)
    pruned = prune_layers(model, [0, 2])
    assert isinstance(pruned, CausalLM) and pruned.backbone.num_layers == 2
    assert model.count_params() - pruned.count_params() == 2 * block_params()
    stack = model.backbone.transformer_stack.prune([0, 2])
    embedded = model.backbone.embeddings(batch["token_ids"])
    hidden = stack(embedded, use_causal_mask=True, padding_mask=batch["padding_mask"] > 0)
    np.testing.assert_allclose(to_numpy(pruned.backbone(batch)), to_numpy(hidden), atol=1e-5)
    # The kept model generates with its cache like any other.
    np.testing.assert_allclose(cached_logits(pruned, batch), to_numpy(pruned(batch)),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("options", [{"fusion": "weighted_sum"},
                                     {"multistep": "adams_bashforth_2", "learn_multistep": True}],
                         ids=["fusion", "multistep"])
def test_prune_layers_with_fusion_or_multistep(rng, options):
    model = causal_lm(num_layers=3, norm_placement="pre", stack_options=options)
    batch = token_batch(rng)
    model(batch)
    pruned = prune_layers(model, [0, 2])
    assert pruned.backbone.stack_options == options
    stack = model.backbone.transformer_stack.prune([0, 2])
    hidden = stack(model.backbone.embeddings(batch["token_ids"]), use_causal_mask=True,
                   padding_mask=batch["padding_mask"] > 0)
    np.testing.assert_allclose(to_numpy(pruned.backbone(batch)), to_numpy(hidden), atol=1e-5)
    fused = causal_lm(num_layers=2, stack_options={"fusion": "feedforward"})
    with pytest.raises(ValueError, match="fusion='feedforward'"):
        prune_layers(fused, [0])


def test_prune_layers_of_a_classifier(rng):
    model = text_classifier(num_layers=3, stack_options={"share_layers": [0, 1, 0]})
    pruned = prune_layers(model, [1, 2])
    assert isinstance(pruned, TextClassifier)
    assert pruned.backbone.stack_options == {"share_layers": [1, 0]}
    stack = pruned.backbone.transformer_stack
    assert stack.blocks[0] is not stack.blocks[1]
    assert pruned.count_params() == model.count_params()
    with pytest.raises(ValueError, match="model must be a TransformerBackbone"):
        prune_layers(keras.Sequential([keras.layers.Dense(2)]), [0])


@pytest.mark.parametrize("stack_options", [{"num_layers": 2}, {"fuse": "average"}, "all"])
def test_invalid_stack_options(stack_options):
    with pytest.raises(ValueError, match="stack_options"):
        CausalLM(vocabulary_size=32, num_layers=1, hidden_dim=16, num_heads=2,
                 intermediate_dim=32, stack_options=stack_options)


@pytest.mark.parametrize("reversible", [False, True])
def test_a_built_template_makes_a_model(rng, reversible):
    def template():
        return TransformerBlock(MultiHeadAttention(HEADS), FeedForward(FFN), norm_placement="pre")

    built = template()
    built(rng.normal(size=(2, 8, WIDTH)).astype("float32"))
    options = {} if reversible else {"stack_options": {"share_layers": 2}}
    model = causal_lm(num_layers=4, block=built, reversible=reversible, **options)
    expected = causal_lm(num_layers=4, block=template(), reversible=reversible, **options)
    assert model.count_params() == expected.count_params()
    batch = token_batch(rng)
    assert to_numpy(model(batch)).shape == (2, 8, SIZES["vocabulary_size"])


# --- Encoder-decoder and vision backbones ------------------------------------------------------

SEQ2SEQ_OPTIONS = {
    "share_layers": {"share_layers": "all"},
    "fusion": {"fusion": "weighted_sum", "fusion_normalization": "layer_norm"},
}


@pytest.mark.parametrize("options", list(SEQ2SEQ_OPTIONS.values()), ids=list(SEQ2SEQ_OPTIONS))
def test_seq2seq_cached_decoding_and_generate_equal_the_full_pass(rng, options):
    model = randomize_embeddings(seq2seq_lm(num_layers=2, norm_placement="pre",
                                            stack_options=options))
    for stack in (model.backbone.encoder, model.backbone.decoder):
        assert isinstance(stack, TransformerStack)
        assert all(stack.get_config()[key] == value for key, value in options.items())
    check_decoding_equals_full_pass(model, seq2seq_batch(rng, target_length=8))


def test_seq2seq_saving_depth_initialization_and_shared_weights(rng, tmp_path):
    constants = deep_norm(encoder_layers=3, decoder_layers=3)
    initialization = {side: constants[side].depth_initialization()
                      for side in ("encoder", "decoder")}
    options = {"share_layers": "all", "layer_drop": 0.1}
    model = seq2seq_lm(num_layers=3, stack_options=options,
                       depth_initialization=initialization)
    backbone = model.backbone
    for side in ("encoder", "decoder"):
        expected = initialization[side]["beta"]
        assert getattr(backbone, side).depth_initialization["beta"] == pytest.approx(expected)
    # One set of weights per stack: each removes two encoder and two decoder layers.
    plain = seq2seq_lm(num_layers=3)
    assert plain.count_params() - model.count_params() == 2 * (
        block_params() + block_params(cross=True))
    batch = seq2seq_batch(rng)
    path = str(tmp_path / "seq2seq.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded, Seq2SeqLM) and loaded.backbone.stack_options == options
    np.testing.assert_allclose(to_numpy(loaded(batch)), to_numpy(model(batch)), atol=1e-5)
    with pytest.raises(ValueError, match="stack_options"):
        seq2seq_lm(stack_options={"share_score_biases": True})


def test_vision_backbone_stack_options(rng, tmp_path):
    arguments = dict(image_shape=(8, 8, 1), patch_size=4, num_layers=3, hidden_dim=WIDTH,
                     num_heads=HEADS, intermediate_dim=FFN)
    options = {"share_layers": "all", "fusion": "average"}
    model = VisionBackbone(**arguments, stack_options=options,
                           depth_initialization={"method": "model_depth", "b": -0.5})
    stack = model.transformer_stack
    assert stack.fusion == "average" and stack.depth_initialization["method"] == "model_depth"
    assert VisionBackbone(**arguments).count_params() - model.count_params() == (
        2 * block_params())
    images = {"images": rng.normal(size=(2, 8, 8, 1)).astype("float32")}
    path = str(tmp_path / "vision.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.stack_options == options
    np.testing.assert_allclose(to_numpy(loaded(images)), to_numpy(model(images)), atol=1e-5)
    with pytest.raises(ValueError, match="stack_options"):
        VisionBackbone(**arguments, stack_options={"num_layers": 2})


# --- Mixture-of-experts blocks -------------------------------------------------------------------

def test_mixture_of_experts_blocks_with_stack_options(rng):
    block = TransformerBlock(MultiHeadAttention(HEADS),
                             MixtureOfExperts(4, FFN, top_k=2, capacity_factor=None),
                             norm_placement="pre")
    options = {"layer_drop": 0.2, "share_layers": 2, "fusion": "weighted_sum"}
    model = randomize_embeddings(CausalLM(**{**SIZES, "num_layers": 4, "block": block,
                                             "stack_options": options}))
    stack = model.backbone.transformer_stack
    assert len(stack.distinct_blocks) == 2
    assert all(isinstance(b.feedforward, MixtureOfExperts) for b in stack.blocks)
    batch = token_batch(rng)
    check_decoding_equals_full_pass(model, batch)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [to_numpy(w).copy() for w in stack.trainable_weights]
    history = model.fit(batch, batch["token_ids"], batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    after = [to_numpy(w) for w in stack.trainable_weights]
    assert any(not np.allclose(b, a) for b, a in zip(before, after))
