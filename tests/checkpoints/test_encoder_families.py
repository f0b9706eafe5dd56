"""Hugging Face encoder checkpoints (BERT, RoBERTa, XLM-RoBERTa) ↔ keras_xf `TextEncoder`: tiny
random `transformers` models, every parameter perturbed, saved with `save_pretrained`, loaded
by `from_huggingface` on the current backend, and written back by `to_huggingface`."""

import json
import shutil

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.models import TextEncoder  # noqa: E402
from keras_xf.models import TransformerBackbone  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import perturbed  # noqa: E402
from tests.checkpoints.hf_checks import rewrite  # noqa: E402

VOCAB, LENGTH = 61, 12
SIZES = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CONFIGS = {
    # Two token types; BERT's own epsilon.
    "bert": lambda: transformers.BertConfig(**SIZES, max_position_embeddings=LENGTH,
                                            type_vocab_size=2, layer_norm_eps=1e-12),
    # Positions from pad_token_id + 1 = 2; one token type.
    "roberta": lambda: transformers.RobertaConfig(
        **SIZES, max_position_embeddings=LENGTH + 2, type_vocab_size=1, pad_token_id=1,
        layer_norm_eps=1e-5),
    # Another padding id (positions from 4) and three token types.
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        **SIZES, max_position_embeddings=LENGTH + 4, type_vocab_size=3, pad_token_id=3,
        hidden_act="gelu_new"),
}


def reference_model(name, seed=0, auto=None):
    torch.manual_seed(seed)
    return perturbed((auto or transformers.AutoModel).from_config(CONFIGS[name]()), seed)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """`(name, folder, reference model)`."""
    folder = tmp_path_factory.mktemp(request.param)
    model = reference_model(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


def batch(config, seed=0):
    """Token ids `[2, LENGTH]` (the second row right-padded with the pad id after 7 tokens)
    and, with several token types, segment ids."""
    rng = np.random.default_rng(seed)
    pad = config.pad_token_id
    ids = rng.integers(pad + 1, VOCAB, size=(2, LENGTH)).astype("int32")
    mask = np.ones((2, LENGTH), "int32")
    mask[1, 7:] = 0
    ids[1, 7:] = pad
    inputs = {"token_ids": ids, "padding_mask": mask}
    if config.type_vocab_size > 1:
        segments = np.zeros((2, LENGTH), "int32")
        segments[0, 5:] = config.type_vocab_size - 1
        segments[1, 4:7] = 1
        inputs["segment_ids"] = segments
    return inputs


def reference_outputs(model, inputs):
    """`(last_hidden_state, pooler_output or None)` of a `transformers` model."""
    arguments = {"input_ids": torch.tensor(inputs["token_ids"], dtype=torch.long),
                 "attention_mask": torch.tensor(inputs["padding_mask"], dtype=torch.long)}
    if "segment_ids" in inputs:
        arguments["token_type_ids"] = torch.tensor(inputs["segment_ids"], dtype=torch.long)
    with torch.no_grad():
        out = model(**arguments)
    pooled = out.pooler_output  # None without pooler
    return (out.last_hidden_state.float().numpy(),
            None if pooled is None else pooled.float().numpy())


def keras_outputs(model, inputs):
    """`(backbone hidden states, encoder output)` of a keras_xf `TextEncoder`."""
    hidden = keras.ops.convert_to_numpy(model.backbone(inputs))
    return hidden, keras.ops.convert_to_numpy(model(inputs))


def test_hidden_states_equal_transformers(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    assert isinstance(model, TextEncoder)
    inputs = batch(reference.config)
    assert sorted(model.input) == sorted(inputs)
    hidden, pooled = keras_outputs(model, inputs)
    expected_hidden, expected_pooled = reference_outputs(reference, inputs)
    assert_logits_equal(hidden, expected_hidden, inputs["padding_mask"])
    np.testing.assert_allclose(pooled, expected_pooled, atol=1e-4, rtol=1e-4)


def test_written_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    # XLM-RoBERTa is RoBERTa's architecture: it is written as a RoBERTa.
    assert to_huggingface(model, tmp_path) == ("BertModel" if name == "bert" else "RobertaModel")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == ("bert" if name == "bert" else "roberta")
    assert config["pad_token_id"] == reference.config.pad_token_id
    reloaded = transformers.AutoModel.from_pretrained(tmp_path).eval()
    inputs = batch(reference.config, seed=2)
    for actual, expected in zip(reference_outputs(reloaded, inputs),
                                reference_outputs(reference, inputs)):
        assert_logits_equal(actual, expected, np.ones(actual.shape[:2]) if actual.ndim == 3
                            else np.ones(actual.shape[:1]), atol=1e-5)
    # And back into keras_xf: the same outputs.
    again = from_huggingface(tmp_path)
    for actual, expected in zip(keras_outputs(again, inputs), keras_outputs(model, inputs)):
        np.testing.assert_array_equal(actual, expected)


@pytest.fixture
def bert_folder(tmp_path):
    folder = tmp_path / "bert"
    reference_model("bert").save_pretrained(folder)
    return folder


def test_missing_unused_and_misshapen_tensors_are_named(bert_folder, tmp_path):
    broken = tmp_path / "broken"
    cases = [
        (lambda t: t.pop("encoder.layer.1.intermediate.dense.bias"),
         r"BertModel .* lacks tensor 'encoder\.layer\.1\.intermediate\.dense\.bias'"),
        (lambda t: t.pop("pooler.dense.weight"), r"lacks tensor 'pooler\.dense\.weight'"),
        (lambda t: t.update(extra=np.zeros(3, "float32")),
         r"tensors that no variable takes: \['extra'\]"),
        (lambda t: t.update({"embeddings.token_type_embeddings.weight":
                             np.ones((3, 16), "float32")}),
         r"embeddings\.token_type_embeddings\.weight.*\(3, 16\).*segment_embedding"),
    ]
    for change, message in cases:
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(bert_folder, broken)
        rewrite(broken, change)
        with pytest.raises(ValueError, match=message):
            from_huggingface(broken)


def test_masked_lm_checkpoints_are_refused(tmp_path):
    reference_model("bert", auto=transformers.AutoModelForMaskedLM).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"BertForMaskedLM: keras_xf has no masked-language"):
        from_huggingface(tmp_path)


def test_unsupported_configs_are_refused(bert_folder):
    config = json.loads((bert_folder / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (bert_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        from_huggingface(bert_folder)


def encoder_backbone(**overrides):
    """A keras_xf-built encoder that BERT or RoBERTa expresses (RoBERTa-like positions, no
    segment table)."""
    block = TransformerBlock(MultiHeadAttention(4), FeedForward(24, activation="gelu"),
                             norm_placement="post", epsilon=1e-6)
    arguments = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, block=block,
                     max_sequence_length=LENGTH + 2, position="learned", position_offset=2,
                     embedding_normalization="layer_norm", embedding_epsilon=1e-6)
    backbone = TransformerBackbone(**{**arguments, **overrides})
    rng = np.random.default_rng(5)
    for variable in backbone.weights:  # no zero bias, no unit norm scale
        variable.assign(variable.numpy() + rng.normal(size=variable.shape) * 0.2)
    return backbone


def test_keras_built_encoders_write_back(tmp_path):
    backbone = encoder_backbone()
    assert to_huggingface(backbone, tmp_path / "backbone") == "RobertaModel"
    reloaded = transformers.AutoModel.from_pretrained(tmp_path / "backbone").eval()
    assert type(reloaded).__name__ == "RobertaModel"
    config = transformers.RobertaConfig(pad_token_id=1, type_vocab_size=1)
    inputs = batch(config, seed=4)
    expected = keras.ops.convert_to_numpy(backbone(inputs))
    assert_logits_equal(reference_outputs(reloaded, inputs)[0], expected, inputs["padding_mask"])
    # A mean-pooled encoder writes its encoder; a projection BERT has no place for is refused.
    encoder = TextEncoder(encoder_backbone(position_offset=0, num_segments=2))
    assert to_huggingface(encoder, tmp_path / "mean") == "BertModel"
    projected = TextEncoder(encoder_backbone(), projection_dim=8)
    with pytest.raises(ValueError, match="BERT's pooler is TextEncoder"):
        to_huggingface(projected, tmp_path / "projected", family="bert")


def test_models_bert_cannot_express_are_refused(tmp_path):
    with pytest.raises(ValueError, match="No checkpoint family expresses this TransformerBack"):
        to_huggingface(encoder_backbone(embedding_normalization=None), tmp_path)
    pre_norm = TransformerBlock(MultiHeadAttention(4), FeedForward(24, activation="gelu"),
                                norm_placement="pre", epsilon=1e-6)
    with pytest.raises(ValueError, match="post-norm LayerNorm blocks"):
        to_huggingface(encoder_backbone(block=pre_norm), tmp_path, family="bert")


def test_encoders_saved_without_pooler_load_and_write_back(tmp_path):
    """`BertModel(add_pooling_layer=False)`: a `TextEncoder` without projection, whose output
    is the `[CLS]` state, written back without `pooler.*`."""
    torch.manual_seed(0)
    reference = perturbed(transformers.BertModel(CONFIGS["bert"](), add_pooling_layer=False))
    reference.save_pretrained(tmp_path / "in")
    model = from_huggingface(tmp_path / "in")
    assert isinstance(model, TextEncoder) and model.projection is None
    inputs = batch(reference.config)
    expected, _ = reference_outputs(reference, inputs)
    hidden, output = keras_outputs(model, inputs)
    assert_logits_equal(hidden, expected, inputs["padding_mask"])
    np.testing.assert_allclose(output, expected[:, 0], atol=1e-4, rtol=1e-4)
    assert to_huggingface(model, tmp_path / "out") == "BertModel"
    reloaded = transformers.BertModel.from_pretrained(tmp_path / "out",
                                                      add_pooling_layer=False).eval()
    assert_logits_equal(reference_outputs(reloaded, inputs)[0], expected,
                        inputs["padding_mask"], atol=1e-5)
    again = from_huggingface(tmp_path / "out")
    assert again.projection is None


def legacy_names(tensors):
    """`BertForPreTraining`-era names: the `bert.` prefix and `LayerNorm.gamma` / `.beta`."""
    for name in list(tensors):
        legacy = "bert." + name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta")
        tensors[legacy] = tensors.pop(name)


def test_legacy_tensor_names_load(bert_folder, tmp_path):
    folder = tmp_path / "legacy"
    shutil.copytree(bert_folder, folder)
    rewrite(folder, legacy_names)
    legacy, current = from_huggingface(folder), from_huggingface(bert_folder)
    inputs = batch(transformers.BertConfig(**SIZES, type_vocab_size=2), seed=3)
    for actual, expected in zip(keras_outputs(legacy, inputs), keras_outputs(current, inputs)):
        np.testing.assert_array_equal(actual, expected)
    # One tensor under both names is refused, and a missing one is named as written today.
    rewrite(folder, lambda t: t.update({"embeddings.LayerNorm.weight":
                                        t["bert.embeddings.LayerNorm.gamma"]}))
    with pytest.raises(ValueError, match=r"holds both .*'embeddings\.LayerNorm\.weight'"):
        from_huggingface(folder)
    rewrite(folder, lambda t: [t.pop("embeddings.LayerNorm.weight"),
                               t.pop("bert.encoder.layer.0.output.LayerNorm.beta")])
    with pytest.raises(ValueError,
                       match=r"lacks tensor 'encoder\.layer\.0\.output\.LayerNorm\.bias'"):
        from_huggingface(folder)
