import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import FeedForward
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.models import CausalLM
from keras_xf.models import TransformerBackbone
from keras_xf.surgery import importance_scores
from keras_xf.surgery import layer_importance
from keras_xf.surgery import prune_heads
from keras_xf.surgery import prune_layers
from keras_xf.surgery import prune_structure
from keras_xf.surgery import top_indices
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.models import tiny
from tests.reference.attention import causal_mask
from tests.reference.layers import silu
from tests.reference.pruning import masked_feedforward
from tests.reference.pruning import masked_multi_head_attention

HEADS = 4
HEAD_DIM = tiny.WIDTH // HEADS
KEPT_HEADS = {4: [[1, 3], [0, 1, 2]], 2: [[0, 1], [1, 3]], 1: [[2], [0, 3]]}
KEPT_UNITS = [list(range(0, tiny.FFN, 2)), list(range(tiny.FFN - 5))]


def lm(kv_heads=HEADS, activation="relu", **kwargs):
    model = tiny.causal_lm(num_heads=HEADS, num_key_value_heads=kv_heads, activation=activation,
                           norm_placement="pre", **kwargs)
    model.compile()
    return model


def built(model, rng):
    x, y = tiny.batch_for(model, rng)
    model(x)
    return model, x, y


def masked_copy(model, heads, units):
    """`model` with the output-projection rows of removed heads and units set to zero."""
    copy = type(model).from_config(model.get_config())
    copy.build_from_config(model.get_build_config())
    copy.set_weights(model.get_weights())
    for block, kept_heads, kept_units in zip(copy.backbone.transformer_stack.blocks, heads, units):
        for kernel, kept in ((block.mixer.output_dense.kernel, kept_heads),
                             (block.feedforward.output_dense.kernel, kept_units)):
            value = to_numpy(kernel).copy()
            value[np.setdiff1d(np.arange(value.shape[0]), kept)] = 0.0
            kernel.assign(value)
    return copy


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_pruned_layers_match_masked_reference(rng, kv_heads):
    model, x, _ = built(lm(kv_heads, activation="swiglu"), rng)
    heads = KEPT_HEADS[kv_heads]
    pruned = prune_structure(model, heads=heads, units=KEPT_UNITS)
    inputs = rng.normal(size=(2, 8, tiny.WIDTH))
    for layer in range(2):
        old = model.backbone.transformer_stack.blocks[layer]
        new = pruned.backbone.transformer_stack.blocks[layer]
        assert new.mixer.num_heads == len(heads[layer])
        assert new.feedforward.hidden_dim == len(KEPT_UNITS[layer])
        mixer = old.mixer
        weights = {name: to_numpy(getattr(mixer, f"{dense}_dense").kernel).astype("float64")
                   for name, dense in (("wq", "query"), ("wk", "key"), ("wv", "value"),
                                       ("wo", "output"))}
        weights.update({name: to_numpy(getattr(mixer, f"{dense}_dense").bias) for name, dense in
                        (("bq", "query"), ("bk", "key"), ("bv", "value"), ("bo", "output"))})
        head_mask = np.isin(np.arange(HEADS), heads[layer]).astype("float64")
        expected = masked_multi_head_attention(inputs, weights, HEADS, kv_heads, head_mask,
                                               mask=causal_mask(8))
        actual = to_numpy(new.mixer(inputs.astype("float32"), use_causal_mask=True))
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)

        ffn = old.feedforward
        unit_mask = np.isin(np.arange(tiny.FFN), KEPT_UNITS[layer]).astype("float64")
        parts = [to_numpy(w).astype("float64") for w in (
            ffn.hidden_dense.kernel, ffn.hidden_dense.bias, ffn.output_dense.kernel,
            ffn.output_dense.bias, ffn.gate_dense.kernel, ffn.gate_dense.bias)]
        expected = masked_feedforward(inputs, *parts[:4], unit_mask, silu, *parts[4:])
        actual = to_numpy(new.feedforward(inputs.astype("float32")))
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("task", ["causal_lm", "text_classifier"])
def test_pruned_model_equals_masked_model_and_is_smaller(rng, task):
    if task == "causal_lm":
        model = lm(2)
    else:
        model = tiny.text_classifier(num_layers=2, num_heads=HEADS, num_key_value_heads=2)
    model, x, _ = built(model, rng)
    heads, units = KEPT_HEADS[2], KEPT_UNITS
    pruned = prune_structure(model, heads=heads, units=units)
    assert type(pruned) is type(model)
    np.testing.assert_allclose(to_numpy(pruned(x)), to_numpy(masked_copy(model, heads, units)(x)),
                               rtol=1e-5, atol=1e-5)
    # Layer 0 keeps one key/value group (2 query heads), layer 1 both groups (one head each).
    removed = 0
    for kept_heads, kept_groups, kept_units in zip(heads, (1, 2), units):
        removed += (HEADS - len(kept_heads)) * HEAD_DIM * (2 * tiny.WIDTH + 1)  # W_q, b_q, W_o
        removed += (2 - kept_groups) * 2 * HEAD_DIM * (tiny.WIDTH + 1)  # W_k, b_k, W_v, b_v
        removed += (tiny.FFN - len(kept_units)) * (2 * tiny.WIDTH + 1)  # W_h, b_h, W_f
    assert count_params(pruned) == count_params(model) - removed


def test_prune_heads_keeps_every_unit(rng):
    model, x, _ = built(lm(2), rng)
    heads = KEPT_HEADS[2]
    pruned = prune_heads(model, heads=heads)
    units = [list(range(tiny.FFN))] * 2
    np.testing.assert_allclose(to_numpy(pruned(x)), to_numpy(masked_copy(model, heads, units)(x)),
                               rtol=1e-5, atol=1e-5)
    blocks = pruned.backbone.transformer_stack.blocks
    assert [b.mixer.num_heads for b in blocks] == [2, 2]
    assert [b.feedforward.hidden_dim for b in blocks] == [tiny.FFN] * 2
    with pytest.raises(ValueError, match="heads=None"):
        prune_heads(model, heads=None)


def test_pruned_model_saves_and_fine_tunes(rng, tmp_path):
    model, x, y = built(lm(2, activation="swiglu"), rng)
    pruned = prune_structure(model, heads=KEPT_HEADS[2], units=KEPT_UNITS)
    check_saving(pruned, x, tmp_path, atol=1e-5)
    loaded = keras.saving.load_model(str(tmp_path / "model.keras"))
    assert [b.mixer.num_heads for b in loaded.backbone.transformer_stack.blocks] == [2, 2]
    pruned.compile(optimizer=keras.optimizers.SGD(0.1))
    before = to_numpy(pruned.trainable_weights[3]).copy()
    history = pruned.fit(x, y, epochs=1, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(before, to_numpy(pruned.trainable_weights[3]))


def test_gradient_scores_are_mask_derivatives(rng):
    model, x, y = built(lm(2, activation="swiglu"), rng)
    scores = importance_scores(model, x, y)
    assert [s.shape for s in scores["heads"]] == [(HEADS,)] * 2
    assert [s.shape for s in scores["units"]] == [(tiny.FFN,)] * 2

    def loss_with_mask(kernel, row, xi):
        # The mask ξ on one head's context (or unit's activation) scales its kernel rows.
        original = to_numpy(kernel).copy()
        scaled = original.copy()
        scaled[row] *= xi
        kernel.assign(scaled)
        value = float(to_numpy(model.loss(y, model(x))))
        kernel.assign(original)
        return value

    block = model.backbone.transformer_stack.blocks[1]
    epsilon = 1e-2
    for kernel, row, score in ((block.mixer.output_dense.kernel, 2, scores["heads"][1][2]),
                               (block.feedforward.output_dense.kernel, 5, scores["units"][1][5])):
        difference = (loss_with_mask(kernel, row, 1 + epsilon)
                      - loss_with_mask(kernel, row, 1 - epsilon)) / (2 * epsilon)
        np.testing.assert_allclose(score, abs(difference), rtol=2e-2, atol=2e-4)


def test_magnitude_scores(rng):
    model, _, _ = built(lm(2, activation="swiglu"), rng)
    scores = importance_scores(model, method="magnitude")
    block = model.backbone.transformer_stack.blocks[0]
    wq, wk, wv, wo = (to_numpy(d.kernel).astype("float64") for d in (
        block.mixer.query_dense, block.mixer.key_dense, block.mixer.value_dense,
        block.mixer.output_dense))
    head = 3  # group 1 of 2, shared by heads 2 and 3
    expected = np.sqrt(np.sum(wq[:, head] ** 2) + np.sum(wo[head] ** 2)
                       + (np.sum(wk[:, 1] ** 2) + np.sum(wv[:, 1] ** 2)) / 2)
    np.testing.assert_allclose(scores["heads"][0][head], expected, rtol=1e-5)
    ffn = block.feedforward
    wh, wg, wf = (to_numpy(d.kernel).astype("float64") for d in (
        ffn.hidden_dense, ffn.gate_dense, ffn.output_dense))
    unit = 7
    expected = np.sqrt(np.sum(wh[:, unit] ** 2) + np.sum(wg[:, unit] ** 2)
                       + np.sum(wf[unit] ** 2))
    np.testing.assert_allclose(scores["units"][0][unit], expected, rtol=1e-5)


def test_layer_importance_is_loss_increase_without_the_layer(rng):
    model, x, y = built(lm(), rng)
    scores = layer_importance(model, x, y)
    base = float(to_numpy(model.loss(y, model(x))))
    without_first = float(to_numpy(model.loss(y, prune_layers(model, [1])(x))))
    assert scores.shape == (2,)
    np.testing.assert_allclose(scores[0], without_first - base, rtol=1e-4, atol=1e-6)


def test_top_indices():
    scores = [np.array([0.1, 0.9, 0.5, 0.3]), np.array([0.8, 0.7, 0.2, 0.6])]
    assert top_indices(scores, 0.5) == [[1, 2], [0, 1]]
    # Global ranking: the best half of all eight; every layer keeps at least one.
    assert top_indices(scores, 0.5, scope="global") == [[1], [0, 1, 3]]
    # Two key/value groups per layer: whole groups ranked by their summed scores.
    assert top_indices(scores, 0.5, num_key_value_heads=[2, 2]) == [[0, 1], [0, 1]]
    with pytest.raises(ValueError, match="keep"):
        top_indices(scores, 0.0)
    with pytest.raises(ValueError, match="scope"):
        top_indices(scores, 0.5, scope="model")


def test_invalid_arguments(rng):
    model, x, y = built(lm(2), rng)
    with pytest.raises(ValueError, match="same number of kept query heads"):
        prune_structure(model, heads=[[0, 1, 2], None])
    with pytest.raises(ValueError, match=r"heads\[1\]"):
        prune_structure(model, heads=[None, [3, 1]])
    with pytest.raises(ValueError, match=r"units\[0\]"):
        prune_structure(model, units=[[], None])
    with pytest.raises(ValueError, match="one entry"):
        prune_structure(model, heads=[[0, 1]])
    with pytest.raises(ValueError, match="method"):
        importance_scores(model, x, y, method="random")
    uncompiled = tiny.causal_lm()
    uncompiled(x)
    with pytest.raises(ValueError, match="loss"):
        importance_scores(uncompiled, x, y)
    with pytest.raises(ValueError, match="TransformerBackbone"):
        prune_structure(keras.Sequential([keras.layers.Dense(2)]))


@pytest.mark.parametrize("case", ["alibi", "experts", "shared"])
def test_unsupported_models_raise(rng, case):
    attention = MultiHeadAttention(HEADS, biases=[AlibiBias()] if case == "alibi" else None)
    feedforward = (MixtureOfExperts(2, tiny.FFN) if case == "experts"
                   else FeedForward(tiny.FFN))
    model = TransformerBackbone(
        tiny.VOCAB, 2, tiny.WIDTH, max_sequence_length=tiny.LENGTH, position="none",
        block=TransformerBlock(attention, feedforward),
        stack_options={"share_layers": "all"} if case == "shared" else None)
    model(tiny.token_batch(rng))
    match = {"alibi": "score biases", "experts": "FeedForward", "shared": "share_layers"}[case]
    with pytest.raises(ValueError, match=match):
        prune_structure(model, heads=[[0, 1], [0, 1]], units=[[0], [0]])


def test_pruned_causal_lm_generates(rng):
    model, x, _ = built(lm(2), rng)
    pruned = prune_structure(model, heads=KEPT_HEADS[2], units=KEPT_UNITS)
    assert isinstance(pruned, CausalLM)
    masked = masked_copy(model, KEPT_HEADS[2], KEPT_UNITS)
    prompt = {"token_ids": x["token_ids"][:, :4], "padding_mask": x["padding_mask"][:, :4]}
    np.testing.assert_array_equal(to_numpy(pruned.generate(prompt, max_length=8)["token_ids"]),
                                  to_numpy(masked.generate(prompt, max_length=8)["token_ids"]))
