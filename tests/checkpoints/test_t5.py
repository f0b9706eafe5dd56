"""T5 checkpoints (`T5ForConditionalGeneration`: 1.0 with ReLU and tied, scaled output
embeddings; 1.1 with gated GELU and unscaled outputs) ↔ keras_xf `Seq2SeqLM`, and the
general options T5 needs: one relative-position bias shared by a stack
(`share_score_biases`) and an output-logit scale (`logit_scale`)."""

import json
import os

import keras
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention  # noqa: E402
from keras_xf.layers.attention.relative_position_bias import RelativePositionBias  # noqa: E402
from keras_xf.layers.blocks.transformer_block import TransformerBlock  # noqa: E402
from keras_xf.layers.blocks.transformer_stack import TransformerStack  # noqa: E402
from keras_xf.layers.feedforward.feed_forward import FeedForward  # noqa: E402
from keras_xf.models import Seq2SeqLM  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from keras_xf.checkpoints import t5  # noqa: E402
from keras_xf.ops.positions import relative_position_buckets  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402

VOCAB, SOURCE, TARGET = 37, 20, 18
CONFIGS = {
    # T5 1.0: ReLU, tied embeddings, decoder states rescaled by d^-0.5.
    "t5": dict(feed_forward_proj="relu", tie_word_embeddings=True),
    # T5 1.1: gated GELU (tanh form), no rescale.
    "t5_v1_1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def reference_model(name, seed=0):
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=6, d_ff=24, num_layers=2, num_decoder_layers=3,
        num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        **CONFIGS[name])
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():  # no unit norm scale; bias tables large enough to steer decoding
        for name, parameter in model.named_parameters():
            if "relative_attention_bias" in name:
                parameter.copy_(torch.randn_like(parameter) * 3.0)
            else:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    """`(name, folder, reference model)`."""
    folder = tmp_path_factory.mktemp(request.param)
    model = reference_model(request.param)
    model.save_pretrained(folder)
    return request.param, folder, model


def batch(seed=0):
    """Sources `[2, 20]` and targets `[2, 18]`, the second rows right-padded: distances
    up to 19 reach T5's logarithmic buckets (8 buckets, max_distance 16) and the last one."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, size=(2, SOURCE)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 11:] = ids[1, 11:] = 0
    targets = rng.integers(2, VOCAB, size=(2, TARGET)).astype("int32")
    targets[:, 0] = 0  # decoder_start_token_id
    target_mask = np.ones_like(targets)
    target_mask[1, 9:] = targets[1, 9:] = 0
    return ids, mask, targets, target_mask


def reference_logits(model, ids, mask, targets, target_mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    decoder_input_ids=torch.tensor(targets, dtype=torch.long),
                    decoder_attention_mask=torch.tensor(target_mask, dtype=torch.long))
    return out.logits.float().numpy()


def keras_logits(model, ids, mask, targets, target_mask):
    return keras.ops.convert_to_numpy(model({
        "encoder_token_ids": ids, "encoder_padding_mask": mask,
        "decoder_token_ids": targets, "decoder_padding_mask": target_mask}))


def test_logits_equal_transformers(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    assert isinstance(model, Seq2SeqLM)
    assert model.start_token_id == 0 and model.pad_token_id == 0
    assert model.logit_scale == (16 ** -0.5 if name == "t5" else 1.0)
    data = batch()
    assert_logits_equal(keras_logits(model, *data), reference_logits(reference, *data),
                        data[3])
    # One bias table per stack, held by every layer.
    for stack in (model.backbone.encoder, model.backbone.decoder):
        tables = {id(block.mixer.biases[0].embeddings) for block in stack.blocks}
        assert len(tables) == 1
    tables = [w for w in model.weights if "relative_position_bias" in w.path]
    assert len(tables) == 2, [w.path for w in tables]


def test_greedy_generation_equals_transformers(checkpoint):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    ids, mask = batch(1)[:2]
    steps = 12
    with torch.no_grad():
        expected = reference.generate(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long), max_new_tokens=steps,
            min_new_tokens=steps, do_sample=False, num_beams=1, eos_token_id=None,
            use_cache=False,  # transformers 5 sizes its cache by the encoder depth (2, not 3)
        ).numpy()
    generated = model.generate({"encoder_token_ids": ids, "encoder_padding_mask": mask},
                               max_length=steps + 1, stop_token_ids=None)
    np.testing.assert_array_equal(np.asarray(generated["decoder_token_ids"]), expected)


def test_written_checkpoint_loads_in_transformers(checkpoint, tmp_path):
    name, folder, reference = checkpoint
    model = from_huggingface(folder)
    assert to_huggingface(model, tmp_path) == "T5ForConditionalGeneration"
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert reloaded.config.scale_decoder_outputs == (name == "t5")
    data = batch(2)
    assert_logits_equal(reference_logits(reloaded, *data), reference_logits(reference, *data),
                        data[3], atol=1e-5)
    again = from_huggingface(tmp_path)
    np.testing.assert_array_equal(keras_logits(again, *data), keras_logits(model, *data))


def test_untied_output_projection(tmp_path):
    """T5 1.1 checkpoints carry their own `lm_head.weight` (`tie_word_embeddings=False`);
    `transformers` 5 writes none, so the reference is untied by hand."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    reference = reference_model("t5_v1_1", seed=3)
    reference.save_pretrained(tmp_path)
    head = torch.nn.Linear(16, VOCAB, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(VOCAB, 16))
    reference.lm_head = head
    tensors = load_file(os.path.join(tmp_path, "model.safetensors"))
    tensors["lm_head.weight"] = head.weight.detach().numpy()
    save_file(tensors, os.path.join(tmp_path, "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("scale_decoder_outputs")
    config["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(config))

    model = from_huggingface(tmp_path)
    assert not model.backbone.tie_embeddings and model.logit_scale == 1.0
    data = batch(4)
    assert_logits_equal(keras_logits(model, *data), reference_logits(reference, *data), data[3])
    with pytest.raises(ValueError, match="untied"):
        to_huggingface(model, tmp_path / "written", family="t5")


def test_buckets_equal_transformers():
    distance = np.arange(-40, 41)[None, :] - np.zeros((1, 1), "int64")
    for bidirectional in (True, False):
        expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            torch.tensor(distance), bidirectional=bidirectional, num_buckets=8, max_distance=16)
        actual = relative_position_buckets(distance, num_buckets=8, max_distance=16,
                                           bidirectional=bidirectional)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(actual), expected.numpy())


def test_model_t5_does_not_express_raises():
    model = Seq2SeqLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, num_heads=2,
                      intermediate_dim=16, max_sequence_length=8)
    with pytest.raises(ValueError, match="T5"):
        t5.hf_config(model)
    with pytest.raises(ValueError, match="feed_forward_proj"):
        t5.build({"vocab_size": 5, "d_model": 8, "d_kv": 4, "d_ff": 8, "num_layers": 1,
                  "num_heads": 2, "feed_forward_proj": "gated-tanh"})


# The general options -------------------------------------------------------------------

def _biased_block(bidirectional=True):
    return TransformerBlock(
        MultiHeadAttention(2, use_bias=False, scale=1.0, biases=[RelativePositionBias(
            num_buckets=8, max_distance=16, bidirectional=bidirectional)]),
        FeedForward(16, use_bias=False), normalization="rms_norm", norm_placement="pre")


def test_shared_score_biases_one_table_and_config_round_trip():
    stack = TransformerStack(_biased_block(False), num_layers=3, share_score_biases=True)
    x = keras.random.normal((2, 20, 8), seed=1)
    y = stack(x, use_causal_mask=True)
    assert len({id(b.mixer.biases[0]) for b in stack.blocks}) == 1
    assert len([w for w in stack.weights if "embeddings" in w.path]) == 1
    config = stack.get_config()
    assert config["share_score_biases"] is True
    again = TransformerStack.from_config(config)
    again(x, use_causal_mask=True)
    again.set_weights(stack.get_weights())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(again(x, use_causal_mask=True)),
                               keras.ops.convert_to_numpy(y), atol=1e-6)
    # Without sharing each layer has its own table.
    unshared = TransformerStack(_biased_block(False), num_layers=3)
    unshared(x)
    assert len([w for w in unshared.weights if "embeddings" in w.path]) == 3


def test_shared_score_biases_cached_decoding_equals_full_pass():
    stack = TransformerStack(_biased_block(False), num_layers=2, share_score_biases=True)
    x = keras.random.normal((2, 20, 8), seed=2)
    full = keras.ops.convert_to_numpy(stack(x, use_causal_mask=True))
    cache = stack.init_cache(2, 20)
    steps = []
    for index in range(20):
        out, cache = stack(x[:, index:index + 1], use_causal_mask=True, cache=cache,
                           cache_index=index)
        steps.append(keras.ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_share_score_biases_bad_value_raises(value):
    with pytest.raises(ValueError, match="share_score_biases"):
        TransformerStack(_biased_block(), num_layers=2, share_score_biases=value)


def test_share_score_biases_needs_biases():
    block = TransformerBlock(MultiHeadAttention(2), FeedForward(16))
    with pytest.raises(ValueError, match="share_score_biases"):
        TransformerStack(block, num_layers=2, share_score_biases=True)
    with pytest.raises(ValueError, match="share_score_biases"):
        Seq2SeqLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, block=_biased_block(),
                  share_score_biases="yes")


def test_logit_scale_scales_logits_and_round_trips(tmp_path):
    arguments = dict(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, block=_biased_block(),
                     decoder_block=_biased_block(False), position="none",
                     share_score_biases=True, max_sequence_length=24)
    plain = Seq2SeqLM(**arguments)
    scaled = Seq2SeqLM(**arguments, logit_scale=0.25)
    scaled.set_weights(plain.get_weights())
    data = batch(5)
    np.testing.assert_allclose(keras_logits(scaled, *data),
                               keras.ops.convert_to_numpy(plain.backbone.decoder_embeddings(
                                   plain.backbone(_inputs(*data))["decoder_sequence_output"]
                                   * 0.25, reverse=True)), atol=1e-5)
    assert scaled.get_config()["logit_scale"] == 0.25
    assert scaled.backbone.get_config()["share_score_biases"] is True
    path = str(tmp_path / "model.keras")
    scaled.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.logit_scale == 0.25
    np.testing.assert_allclose(keras_logits(loaded, *data), keras_logits(scaled, *data),
                               atol=1e-6)


def _inputs(ids, mask, targets, target_mask):
    return {"encoder_token_ids": ids, "encoder_padding_mask": mask,
            "decoder_token_ids": targets, "decoder_padding_mask": target_mask}


@pytest.mark.parametrize("value", [0.0, -1.0, "0.5", True])
def test_logit_scale_bad_value_raises(value):
    with pytest.raises(ValueError, match="logit_scale"):
        Seq2SeqLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=8, num_heads=2,
                  intermediate_dim=16, logit_scale=value)


def test_shared_score_biases_computed_once_per_stack_call(monkeypatch):
    calls = []
    original = RelativePositionBias.call

    def counted(self, *args):
        calls.append(id(self))
        return original(self, *args)

    monkeypatch.setattr(RelativePositionBias, "call", counted)
    x = keras.random.normal((2, 20, 8), seed=3)
    shared = TransformerStack(_biased_block(False), num_layers=3, share_score_biases=True)
    unshared = TransformerStack(_biased_block(False), num_layers=3)
    shared(x, use_causal_mask=True)
    unshared(x, use_causal_mask=True)
    calls.clear()
    shared(x, use_causal_mask=True)
    assert len(calls) == 1
    cache = shared.init_cache(2, 20)
    calls.clear()
    shared(x[:, :1], use_causal_mask=True, cache=cache, cache_index=0)
    assert len(calls) == 1
    calls.clear()
    unshared(x, use_causal_mask=True)
    assert len(calls) == 3
