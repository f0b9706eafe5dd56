"""Checks shared by the tests of the relative-position bias hooks of `MultiHeadAttention`."""

import keras
import numpy as np

from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.models import CausalLM
from tests import layer_checks as checks
from tests.models.tiny import FFN
from tests.models.tiny import LENGTH
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import token_batch

B, T, D = 2, 6, 16


def inputs(rng, length=T):
    return checks.random_normal(rng, (B, length, D))


def padding(lengths, total=T):
    return checks.padding_mask(lengths, total)


randomize = checks.randomize_weights
mha_weights = checks.attention_weights


def reference_mask(lengths, causal, length=T):
    mask = padding(lengths, length)[:, None, None, :]
    if causal:
        mask = mask & (np.arange(length)[:, None] >= np.arange(length)[None, :])[None, None]
    return mask


def check_layer_outputs(layer, x, expected, **call_kwargs):
    """Fused and explicit paths (`return_attention_scores=True`) both match `expected`."""
    out = checks.to_numpy(layer(x, **call_kwargs))
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
    explicit, _ = checks.split_scores(layer(x, return_attention_scores=True, **call_kwargs))
    np.testing.assert_allclose(checks.to_numpy(explicit), expected, atol=1e-4, rtol=1e-4)


def check_cached_decoding(layer, x):
    """Prefill of two tokens, then one token at a time, equals the full causal pass (in a
    cache longer than the sequence)."""
    checks.check_cached_decoding(layer, x, prefill=2, cache_length=x.shape[1] + 2)


def check_mixed_precision(make_hook, rng, policy):
    """Half-precision compute, float32 weights, finite outputs (also for a padded row)."""
    x = inputs(rng)
    mask = padding([T, 0])
    for kwargs in ({}, {"return_attention_scores": True}):
        out = checks.check_mixed_precision(
            lambda **kw: MultiHeadAttention(num_heads=2, biases=[make_hook(**kw)], **kw),
            [x],
            {"padding_mask": mask, "use_causal_mask": True, **kwargs},
            policy=policy,
        )
    outputs, weights = checks.split_scores(out)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    np.testing.assert_array_equal(checks.to_numpy(weights)[1], 0.0)


def check_saving(hook, rng, tmp_path):
    """Config round trip of the hook inside attention and a `.keras` round trip of a tiny
    functional model (training is checked by `check_causal_lm_trains`)."""
    layer = MultiHeadAttention(num_heads=2, causal=True, biases=[hook])
    clone = checks.check_config_round_trip(layer)
    assert type(clone.biases[0]) is type(hook)
    assert clone.biases[0].get_config() == hook.get_config()
    x, mask = inputs(rng), padding([T, 3])
    model = checks.wrap_in_model(layer, [x], {"padding_mask": mask})
    loaded = checks.check_saving(model, [x, mask], tmp_path, atol=1e-5)
    loaded_hook = [l for l in loaded._flatten_layers() if type(l) is type(hook)][0]
    for a, b in zip(hook.weights, loaded_hook.weights):
        np.testing.assert_array_equal(checks.to_numpy(a), checks.to_numpy(b))


def check_jit_compile(hook, rng):
    x, mask = inputs(rng), padding([T, 4])
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1, biases=[hook])
    model = checks.wrap_in_model(layer, [x], {"padding_mask": mask, "use_causal_mask": True})
    checks.check_jit_compile(model, [x, mask])


def check_causal_lm_trains(hook, rng, steps=4):
    """A one-layer `CausalLM` whose attention carries the hook (and no other position
    signal) trains: the loss is finite and falls, and the hook's weights change."""
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=2, biases=[hook]),
        feedforward=FeedForward(FFN),
        norm_placement="pre",
    )
    model = CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                     max_sequence_length=LENGTH, position="none")
    mixer = model.backbone.transformer_stack.blocks[0].mixer
    model_hook = mixer.biases[0]
    assert type(model_hook) is type(hook)
    before = [checks.to_numpy(w).copy() for w in model_hook.weights]
    batch = token_batch(rng)
    labels = np.roll(batch["token_ids"], -1, axis=1)
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    losses = [model.train_on_batch(batch, labels) for _ in range(steps)]
    losses = [float(np.asarray(loss).reshape(-1)[0]) for loss in losses]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], losses
    for b, a in zip(before, model_hook.weights):
        assert not np.allclose(b, checks.to_numpy(a)), "training left the hook's weights unchanged"
    return model
