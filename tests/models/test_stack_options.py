"""Models with `TransformerBackbone(stack_options=...)`: layer fusion, layer drop, parameter
sharing and multi-step residuals in a CausalLM (survey §4.2.3, §4.2.4, §4.3, §5.4), cached
decoding, `generate`, saving, and `prune_layers`."""

import keras
import numpy as np
import pytest

from keras_xf.layers import TransformerStack
from keras_xf.models import CausalLM
from keras_xf.models import TextClassifier
from keras_xf.models import prune_layers
from tests.layer_checks import to_numpy
from tests.models.tiny import block_params
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch

OPTIONS = {
    "fusion": {"fusion": "attention", "fusion_normalization": "layer_norm"},
    "share_layers": {"share_layers": "all"},
    "multistep": {"multistep": "adams_bashforth_2"},
    "layer_drop": {"layer_drop": 0.2},
}
CASES = pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))


def cached_logits(model, token_ids, prefill=5):
    cache = model.init_cache(token_ids.shape[0], token_ids.shape[1])
    logits, _, cache = model.call_with_cache(token_ids[:, :prefill], cache, 0)
    steps = [to_numpy(logits)]
    for t in range(prefill, token_ids.shape[1]):
        logits, _, cache = model.call_with_cache(token_ids[:, t:t + 1], cache, t)
        steps.append(to_numpy(logits))
    return np.concatenate(steps, axis=1)


@CASES
def test_cached_decoding_and_generate_equal_the_full_pass(rng, options):
    model = randomize_embeddings(causal_lm(num_layers=3, norm_placement="pre",
                                           stack_options=options))
    assert isinstance(model.backbone.transformer_stack, TransformerStack)
    batch = token_batch(rng)
    full = to_numpy(model(batch, training=False))
    np.testing.assert_allclose(cached_logits(model, batch["token_ids"]), full,
                               atol=1e-4, rtol=1e-4)
    # Greedy generation with the cache picks the argmax of the full pass at every step.
    prompt = batch["token_ids"][:, :4]
    generated = np.asarray(model.generate({"token_ids": prompt,
                                           "padding_mask": np.ones_like(prompt)},
                                          max_length=8)["token_ids"])
    for t in range(4, 8):
        step = to_numpy(model({"token_ids": generated[:, :t],
                               "padding_mask": np.ones_like(generated[:, :t])}))
        np.testing.assert_array_equal(generated[:, t], step[:, -1].argmax(-1))


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
    np.testing.assert_allclose(cached_logits(pruned, batch["token_ids"]),
                               to_numpy(pruned(batch)), atol=1e-4, rtol=1e-4)


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
