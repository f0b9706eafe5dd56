"""Gemma and Mixtral checkpoints ↔ keras_xf `CausalLM`: tiny random `transformers` models,
every parameter perturbed (no norm offset zero), saved with `save_pretrained`, loaded by
`from_huggingface` on the current backend, and written back by `to_huggingface`."""

import json

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MixtureOfExperts  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import OffsetRMSNormalization  # noqa: E402
from keras_xf.layers import RotaryEmbedding  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from tests.checkpoints.hf_checks import VOCAB  # noqa: E402
from tests.checkpoints.hf_checks import causal_reference  # noqa: E402
from tests.checkpoints.hf_checks import rewrite  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402



reference_model = causal_reference


@pytest.mark.parametrize("name", ["gemma", "mixtral"])
def test_layers_are_the_general_options(name, tmp_path):
    reference_model(name).save_pretrained(tmp_path)
    model = from_huggingface(tmp_path)
    block = model.backbone.transformer_stack.blocks[0]
    if name.startswith("gemma"):
        assert model.backbone.embedding_scale
        assert block.feedforward.activation == "geglu_tanh"
        assert isinstance(block.mixer_residual.norm, OffsetRMSNormalization)
        assert isinstance(model.backbone.transformer_stack.output_norm, OffsetRMSNormalization)
    else:
        moe = block.feedforward
        assert isinstance(moe, MixtureOfExperts)
        assert (moe.capacity_factor, moe.route_padding, moe.use_bias) == (None, True, False)


def test_mixtral_padded_positions_are_routed_as_in_transformers(tmp_path):
    """Mixtral routes padding tokens like real ones, and `route_padding=True` does too: with
    right padding every position, padded ones included, equals `transformers`."""
    reference = reference_model("mixtral", seed=4)
    reference.save_pretrained(tmp_path)
    model = from_huggingface(tmp_path)
    ids, mask = batch(5)
    np.testing.assert_allclose(keras_logits(model, ids, mask),
                               reference_logits(reference, ids, mask), atol=1e-4, rtol=1e-4)


def test_gemma_embedding_normaliser_is_cast_to_the_compute_dtype(tmp_path):
    """Gemma multiplies the embeddings by `√d` cast to the weights' dtype (4.90625 for √24
    in bfloat16): the bfloat16 model's embeddings equal `transformers`' bit for bit."""
    reference = reference_model("gemma", seed=2).to(torch.bfloat16)
    reference.save_pretrained(tmp_path)
    model = from_huggingface(tmp_path, dtype="bfloat16")
    ids = batch(3)[0]
    with torch.no_grad():
        expected = reference.model.embed_tokens(torch.tensor(ids, dtype=torch.long))
    actual = model.backbone.embeddings(ids)
    assert keras.backend.standardize_dtype(actual.dtype) == "bfloat16"
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(keras.ops.cast(actual, "float32")),
                                  expected.float().numpy())


def test_missing_expert_tensor_is_named(tmp_path):
    folder = tmp_path / "mixtral"
    reference_model("mixtral_top1").save_pretrained(folder)
    rewrite(folder, lambda t: t.pop("model.layers.1.block_sparse_moe.experts.2.w3.weight"))
    with pytest.raises(ValueError, match=r"MixtralForCausalLM .* lacks tensor "
                                         r"'model\.layers\.1\.block_sparse_moe\.experts\.2\.w3"):
        from_huggingface(folder)


def _gemma_folder_with(tmp_path, **changes):
    folder = tmp_path / "gemma"
    reference_model("gemma").save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_legacy_gelu_name_is_read_as_the_tanh_form(tmp_path):
    """The released Gemma configs say `hidden_act="gelu"`, which `transformers` reads as the
    tanh approximation; so does the loader."""
    model = from_huggingface(_gemma_folder_with(tmp_path, hidden_act="gelu"))
    assert model.backbone.transformer_stack.blocks[0].feedforward.activation == "geglu_tanh"


def test_bidirectional_gemma_is_refused(tmp_path):
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        from_huggingface(_gemma_folder_with(tmp_path, use_bidirectional_attention=True))


def _causal_lm(feedforward, normalization="rms_norm", embedding_scale=False):
    block = TransformerBlock(
        MultiHeadAttention(2, use_bias=False, position=RotaryEmbedding()), feedforward,
        normalization=normalization, norm_placement="pre")
    return CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, block=block,
                    position="none", embedding_scale=embedding_scale)


@pytest.mark.parametrize("feedforward, reason", [
    (lambda: MixtureOfExperts(4, 8, activation="swiglu", use_bias=False), "dropless"),
    (lambda: MixtureOfExperts(4, 8, activation="geglu", use_bias=False, capacity_factor=None),
     "SwiGLU experts"),
])
def test_mixtures_mixtral_cannot_express_are_refused(feedforward, reason, tmp_path):
    with pytest.raises(ValueError, match=reason):
        to_huggingface(_causal_lm(feedforward()), tmp_path, family="mixtral")


def test_gemma_needs_its_norm_feedforward_and_scale(tmp_path):
    gated = lambda activation: FeedForward(8, activation=activation, use_bias=False)  # noqa: E731
    with pytest.raises(ValueError, match="offset_rms_norm"):
        to_huggingface(_causal_lm(gated("geglu_tanh"), embedding_scale=True), tmp_path,
                       family="gemma")
    with pytest.raises(ValueError, match="embedding_scale=True"):
        to_huggingface(_causal_lm(gated("geglu_tanh"), "offset_rms_norm"), tmp_path,
                       family="gemma")
    with pytest.raises(ValueError, match="geglu_tanh"):
        to_huggingface(_causal_lm(gated("geglu"), "offset_rms_norm", True), tmp_path,
                       family="gemma")
    assert to_huggingface(_causal_lm(gated("geglu_tanh"), "offset_rms_norm", True),
                          tmp_path, family="gemma") == "GemmaForCausalLM"
