"""BLOOM checkpoints ↔ keras_xf `CausalLM` (ALiBi attention, a LayerNorm on the word
embeddings, per-head fused query/key/value): tiny random `transformers` models, every
parameter perturbed, saved with `save_pretrained`, loaded by `from_huggingface` on the current
backend, and written back by `to_huggingface`.

The configs `bloom` (4 heads) and `bloom_6_heads_untied` are in `hf_checks.CONFIGS`, so
`test_causal_families.py` compares their logits on a right-padded batch, their greedy
generation and their written-back checkpoints as for every causal family; this file checks
what is BLOOM's own."""

import json
import shutil

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.layers import AlibiBias  # noqa: E402
from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from keras_xf.ops.positions import alibi_slope_values  # noqa: E402
from tests.checkpoints.hf_checks import VOCAB  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import causal_reference  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402
from tests.checkpoints.hf_checks import rewrite  # noqa: E402

NAMES = ("bloom", "bloom_6_heads_untied")  # configs of `hf_checks.CONFIGS`
reference_model = causal_reference


@pytest.fixture(scope="module", params=NAMES)
def checkpoint(request, tmp_path_factory):
    """`(name, folder, reference model)`."""
    folder = tmp_path_factory.mktemp(request.param)
    model = reference_model(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


@pytest.mark.parametrize("num_heads", list(range(1, 18)) + [24, 32, 48, 112])
def test_alibi_slopes_equal_blooms(num_heads):
    # BLOOM's bias of the key at mask position 1 is its slope.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)
    expected = alibi.reshape(num_heads, 2)[:, 1].numpy()
    np.testing.assert_allclose(alibi_slope_values(num_heads), expected, rtol=1e-6)


def test_alibi_bias_equals_blooms_up_to_a_row_constant():
    # keras_xf's −m_h (i − j) and BLOOM's m_h j differ by m_h i along each query row.
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    heads, length = 6, 5
    positions = np.arange(length, dtype="int32")
    query = keras.ops.zeros((1, length, heads, 4))
    ours = keras.ops.convert_to_numpy(AlibiBias()(query, query, positions, positions))[0]
    blooms = build_alibi_tensor(torch.ones(1, length), heads, torch.float32).numpy()
    slopes = np.asarray(alibi_slope_values(heads), "float32")
    causal = np.tril(np.ones((length, length), bool))
    shifted = ours + slopes[:, None, None] * positions[None, :, None]
    np.testing.assert_allclose(shifted[:, causal],
                               np.broadcast_to(blooms, (heads, length, length))[:, causal],
                               atol=1e-6)


def test_layers_are_the_general_options(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    backbone = model.backbone
    block = backbone.transformer_stack.blocks[0]
    assert backbone.position == "none" and backbone.embedding_normalization == "layer_norm"
    assert backbone.tie_embeddings == (name == "bloom")
    assert backbone.embedding_epsilon == block.epsilon == reference.config.layer_norm_epsilon
    assert [type(b) for b in block.mixer.biases] == [AlibiBias]
    assert block.feedforward.activation == "gelu_tanh"
    assert block.feedforward.hidden_dim == 4 * backbone.hidden_dim


def test_left_padded_logits_equal_transformers(checkpoint):
    # BLOOM counts key positions over the mask; the ALiBi difference is a row constant.
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    ids, mask = batch(4)
    ids[1] = np.roll(ids[1], 5)
    mask[1] = np.roll(mask[1], 5)
    assert_logits_equal(keras_logits(model, ids, mask), reference_logits(reference, ids, mask),
                        mask)


def test_written_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    assert to_huggingface(model, tmp_path) == "BloomForCausalLM"
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((folder / "config.json").read_text())
    for key in ("hidden_size", "n_head", "n_layer", "layer_norm_epsilon", "tie_word_embeddings"):
        assert written[key] == original[key], key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = batch(2)
    assert_logits_equal(reference_logits(reloaded, ids, mask),
                        reference_logits(reference, ids, mask), mask, atol=1e-5)
    again = from_huggingface(tmp_path)
    np.testing.assert_array_equal(keras_logits(again, ids, mask), keras_logits(model, ids, mask))


def test_released_config_keys_load(checkpoint, tmp_path):
    # The released BLOOM configs say n_embed and num_attention_heads, and slow_but_exact
    # with pretraining_tp > 1 sums the same output projection in slices.
    name, folder, reference = checkpoint
    shutil.copytree(folder, tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    config["n_embed"] = config.pop("hidden_size")
    config["num_attention_heads"] = config.pop("n_head")
    config.update(pretraining_tp=2, slow_but_exact=True, seq_length=32)
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    model = from_huggingface(tmp_path / "old")
    assert model.backbone.max_sequence_length == 32
    ids, mask = batch()
    assert_logits_equal(keras_logits(model, ids, mask), reference_logits(reference, ids, mask),
                        mask)


def test_unsupported_configs_are_refused(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    shutil.copytree(folder, tmp_path / "post")
    config = json.loads((tmp_path / "post" / "config.json").read_text())
    config["apply_residual_connection_post_layernorm"] = True
    (tmp_path / "post" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="apply_residual_connection_post_layernorm"):
        from_huggingface(tmp_path / "post")


def test_missing_and_misshapen_tensors_are_named(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    shutil.copytree(folder, tmp_path / "missing")
    rewrite(tmp_path / "missing", lambda t: t.pop("transformer.word_embeddings_layernorm.bias"))
    with pytest.raises(ValueError, match=r"BloomForCausalLM .* lacks tensor "
                                         r"'transformer\.word_embeddings_layernorm\.bias'"):
        from_huggingface(tmp_path / "missing")
    shutil.copytree(folder, tmp_path / "misshapen")
    width = reference.config.hidden_size
    rewrite(tmp_path / "misshapen", lambda t: t.update(
        {"transformer.h.0.self_attention.query_key_value.weight":
         np.ones((3 * width + 3, width), "float32")}))
    with pytest.raises(ValueError, match=r"query_key_value\.weight.*\(%d, %d\)"
                                         % (3 * width + 3, width)):
        from_huggingface(tmp_path / "misshapen")


def bloom_like(attention=None, feedforward=None, **overrides):
    block = TransformerBlock(
        attention or MultiHeadAttention(2, biases=[AlibiBias()]),
        feedforward or FeedForward(32, activation="gelu_tanh"),
        normalization="layer_norm", norm_placement="pre",
    )
    arguments = dict(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, block=block,
                     position="none", embedding_normalization="layer_norm")
    return CausalLM(**{**arguments, **overrides})


def test_a_bloom_built_from_the_layers_is_written(tmp_path):
    model = bloom_like()
    assert to_huggingface(model, tmp_path) == "BloomForCausalLM"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, mask = batch(5)
    assert_logits_equal(reference_logits(reloaded, ids, mask), keras_logits(model, ids, mask),
                        mask)


@pytest.mark.parametrize("model, reason", [
    (lambda: bloom_like(embedding_normalization=None), "embedding_normalization"),
    (lambda: bloom_like(embedding_normalization="rms_norm"), "embedding_normalization"),
    (lambda: bloom_like(embedding_epsilon=1e-3), "embedding_epsilon"),
    (lambda: bloom_like(MultiHeadAttention(2, biases=[AlibiBias(max_bias=4.0)])), "AlibiBias"),
    (lambda: bloom_like(MultiHeadAttention(2)), "AlibiBias"),
    (lambda: bloom_like(MultiHeadAttention(2, num_key_value_heads=1, biases=[AlibiBias()])),
     "multi-head"),
    (lambda: bloom_like(feedforward=FeedForward(32, activation="gelu")), "tanh-GELU"),
    (lambda: bloom_like(feedforward=FeedForward(16, activation="gelu_tanh")), "4 \\* hidden"),
    (lambda: bloom_like(position="learned", max_sequence_length=16), "position='none'"),
])
def test_models_bloom_cannot_express_are_refused(model, reason, tmp_path):
    with pytest.raises(ValueError, match=reason):
        to_huggingface(model(), tmp_path, family="bloom")
    # And no other family writes them either.
    with pytest.raises(ValueError, match="No checkpoint family expresses"):
        to_huggingface(model(), tmp_path)
