"""Tiny model factories and batches shared by the model, generation and training tests.

Every model here is built with the sizes below so that the whole suite stays fast on CPU.
Batches keep to a few shapes (`[2, 8]` token batches, `[2, 12]` when padded further, sources
of 8 and targets of 6 tokens): eager JAX compiles every op once per shape.
"""

import keras
import numpy as np
from keras import ops

from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqLM
from keras_xf.models import TextClassifier
from keras_xf.models import TextEncoder
from tests.layer_checks import to_numpy

VOCAB, WIDTH, HEADS, FFN, LAYERS, LENGTH = 32, 16, 2, 32, 2, 12
SIZES = dict(vocabulary_size=VOCAB, hidden_dim=WIDTH, num_heads=HEADS, intermediate_dim=FFN,
             max_sequence_length=LENGTH)


def causal_lm(num_layers=LAYERS, **kwargs):
    return CausalLM(**{**SIZES, "num_layers": num_layers, **kwargs})


def seq2seq_lm(num_layers=1, **kwargs):
    return Seq2SeqLM(**{**SIZES, "num_layers": num_layers, **kwargs})


def text_encoder(num_layers=1, **kwargs):
    return TextEncoder(**{**SIZES, "num_layers": num_layers, **kwargs})


def text_classifier(num_classes=2, num_layers=1, **kwargs):
    return TextClassifier(num_classes=num_classes, **{**SIZES, "num_layers": num_layers, **kwargs})


def token_batch(rng, batch=2, length=8, lengths=None, low=3):
    """`{"token_ids", "padding_mask"}` of right-padded random ids (pad id 0)."""
    lengths = [length] * batch if lengths is None else lengths
    ids = rng.integers(low, VOCAB, size=(batch, length)).astype("int32")
    mask = (np.arange(length)[None, :] < np.array(lengths)[:, None]).astype("int32")
    return {"token_ids": ids * mask, "padding_mask": mask}


def seq2seq_batch(rng, batch=2, source_length=8, target_length=6, source_lengths=None):
    source = token_batch(rng, batch, source_length, source_lengths)
    target = token_batch(rng, batch, target_length)
    return {
        "encoder_token_ids": source["token_ids"],
        "encoder_padding_mask": source["padding_mask"],
        "decoder_token_ids": target["token_ids"],
        "decoder_padding_mask": target["padding_mask"],
    }


def batch_for(model, rng, batch=2):
    """A batch of inputs and integer labels suited to `model`."""
    if isinstance(model, Seq2SeqLM):
        x = seq2seq_batch(rng, batch)
        return x, rng.integers(1, VOCAB, size=x["decoder_token_ids"].shape).astype("int32")
    x = token_batch(rng, batch)
    if isinstance(model, CausalLM):
        return x, rng.integers(1, VOCAB, size=x["token_ids"].shape).astype("int32")
    if isinstance(model, TextClassifier):
        return x, rng.integers(0, model.num_classes, size=(batch,)).astype("int32")
    return x, rng.normal(size=(batch, model.output_shape[-1])).astype("float32")


def randomize_embeddings(model, seed=0):
    """Standard-normal token / position tables (and output projection when untied).

    Keras' default `uniform` initializer gives logits near zero, so argmax ties and
    copy-the-input predictions dominate; unit-scale tables give varied, well-separated
    logits, so token-by-token comparisons are meaningful.
    """
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if "embeddings" in weight.path:
            weight.assign(rng.normal(size=weight.shape).astype("float32"))
    return model


def attention_params(d, heads=HEADS, kv_heads=None, head_dim=None):
    head_dim = head_dim or d // heads
    kv_heads = kv_heads or heads
    q = d * heads * head_dim + heads * head_dim
    kv = 2 * (d * kv_heads * head_dim + kv_heads * head_dim)
    return q + kv + heads * head_dim * d + d


def block_params(d=WIDTH, ffn=FFN, cross=False, **attention):
    """Weights of a default block: attention(s), feedforward, one LayerNorm per sub-layer."""
    attention_count = attention_params(d, **attention) * (2 if cross else 1)
    return attention_count + (2 * d * ffn + d + ffn) + (3 if cross else 2) * 2 * d


def dtype_name(x):
    return keras.backend.standardize_dtype(x.dtype)


def _encoder_context(model, batch):
    """`(first-call, later-call)` keyword arguments of `call_with_cache`: the encoder's
    outputs and mask for an encoder-decoder `model`, none for a decoder-only one."""
    if not isinstance(model, Seq2SeqLM):
        return {}, {}
    mask = ops.cast(batch["encoder_padding_mask"], "bool")
    encoded = model.backbone.encode(batch["encoder_token_ids"], batch["encoder_padding_mask"])
    return {"encoder_outputs": encoded, "encoder_padding_mask": mask}, {
        "encoder_padding_mask": mask}


def cached_logits(model, batch, prefill=5):
    """The logits of `model` (a `CausalLM` or `Seq2SeqLM`) on the prompt ids of `batch`,
    computed with its cache: a prefill of `prefill` tokens, then one token per call."""
    token_ids = batch[model.prompt_keys[0]]
    first, later = _encoder_context(model, batch)
    size = (token_ids.shape[0], token_ids.shape[1])
    if first:
        size += (first["encoder_outputs"].shape[1],)
    cache = model.init_cache(*size)
    logits, _, cache = model.call_with_cache(token_ids[:, :prefill], cache, 0, **first)
    steps = [to_numpy(logits)]
    for t in range(prefill, token_ids.shape[1]):
        logits, _, cache = model.call_with_cache(token_ids[:, t:t + 1], cache, t, **later)
        steps.append(to_numpy(logits))
    return np.concatenate(steps, axis=1)


def check_cached_generation(model, prompts=None, max_length=10):
    """The compiled generation loop of `model` (traced on PyTorch) gives the tokens of the
    uncached one, which reruns the full causal pass."""
    prompts = [[3, 4, 5], [6, 7], [9, 10, 11, 12]] if prompts is None else prompts
    cached = np.array(model.generate(prompts, max_length=max_length))
    uncached = np.array(model.generate(prompts, max_length=max_length, use_cache=False))
    np.testing.assert_array_equal(cached, uncached)


def check_decoding_equals_full_pass(model, batch, prompt_length=4, max_length=8):
    """Cached decoding of `batch`'s prompt ids gives the logits of the full pass, and greedy
    `generate` from its first `prompt_length` tokens picks the argmax of the full pass at
    every step. `model`: a `CausalLM` or `Seq2SeqLM` (`batch` then holds the sources)."""
    ids_key, mask_key = model.prompt_keys
    full = to_numpy(model(batch, training=False))
    np.testing.assert_allclose(cached_logits(model, batch), full, atol=1e-4, rtol=1e-4)
    prompt = batch[ids_key][:, :prompt_length]
    extras = {key: value for key, value in batch.items() if key not in model.prompt_keys}
    generated = np.asarray(model.generate(
        {**extras, ids_key: prompt, mask_key: np.ones_like(prompt)},
        max_length=max_length)[ids_key])
    for t in range(prompt_length, max_length):
        inputs = {**extras, ids_key: generated[:, :t], mask_key: np.ones_like(generated[:, :t])}
        np.testing.assert_array_equal(generated[:, t],
                                      to_numpy(model(inputs))[:, -1].argmax(-1))
