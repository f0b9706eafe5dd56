"""EarlyExitCausalLM: exits on a causal LM trained on the summed exit losses, and generation
with token-level adaptive depth whose skipped layers cache the exit state (survey §5.6)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_xf.models import CausalLM
from keras_xf.models import EarlyExitCausalLM
from keras_xf.training import ChunkedCrossEntropy
from keras_xf.training import EarlyExitLoss
from tests.layer_checks import attention_weights
from tests.layer_checks import check_saving
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.models.tiny import SIZES
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import early_exit as ref_exit
from tests.reference import early_exit_decoding as ref
from tests.reference import layers as ref_layers

PROMPTS = [[5, 9], [7, 3, 11, 4], [20, 6, 13]]
MAX_LENGTH = 10


def early_exit_lm(num_layers=3, **kwargs):
    return EarlyExitCausalLM(num_layers=num_layers, **{**SIZES, **kwargs})


def numpy_norm(norm):
    """A Keras `LayerNormalization` as a float64 function (identity for `None`)."""
    if norm is None:
        return lambda h: h
    gamma, beta = to_float64(norm.gamma), to_float64(norm.beta)
    return lambda h: ref_layers.layer_norm(h, gamma, beta, epsilon=norm.epsilon)


def oracle(model):
    """The model's weights as the arguments of the numpy oracle: `(embed, layers,
    final_norm, heads)`."""
    layers = []
    for block in model.blocks:
        ffn = block.feedforward
        layers.append({
            "placement": block.norm_placement,
            "norm1": numpy_norm(block.mixer_residual.norm),
            "norm2": numpy_norm(block.feedforward_residual.norm),
            "attention": attention_weights(block.mixer),
            "num_heads": block.mixer.num_heads,
            "ffn": [to_float64(w) for w in (ffn.hidden_dense.kernel, ffn.hidden_dense.bias,
                                            ffn.output_dense.kernel, ffn.output_dense.bias)],
        })
    table = to_float64(model.backbone.token_embedding.embeddings)
    heads = []
    for e in range(len(model.exit_layers)):
        if model.heads is None or e == len(model.exit_layers) - 1:
            heads.append(lambda s: s @ table.T)
        else:
            dense = model.heads.heads[e].output_dense
            kernel, bias = to_float64(dense.kernel), to_float64(dense.bias)
            heads.append(lambda s, kernel=kernel, bias=bias: s @ kernel + bias)

    def embed(ids):
        return to_float64(model.backbone.embeddings(np.asarray(ids, "int32")[None]))[0]

    return embed, layers, numpy_norm(model.backbone.transformer_stack.output_norm), heads


def confident_lm(rng, exit_heads="per_layer", **kwargs):
    """A pre-norm 3-layer LM with exits on every layer and weights large enough for varied,
    confident predictions."""
    model = early_exit_lm(norm_placement="pre", exit_heads=exit_heads, **kwargs)
    randomize_weights(model, rng, scale=0.5)
    return randomize_embeddings(model)


def between(values):
    """A threshold halfway between the two middle distinct values (no ties)."""
    values = np.unique(np.round(np.asarray(values, np.float64), 6))
    middle = len(values) // 2
    return float((values[middle - 1] + values[middle]) / 2)


def reference_decode(model, criterion, threshold):
    embed, layers, final_norm, heads = oracle(model)
    rows = [ref.adaptive_greedy_decode(prompt, MAX_LENGTH, embed, layers, final_norm, heads,
                                       model.exit_layers, criterion, threshold)
            for prompt in PROMPTS]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


@pytest.mark.parametrize("exit_heads", ["per_layer", "shared"])
def test_exit_logits_equal_reference(rng, exit_heads):
    model = confident_lm(rng, exit_heads=exit_heads, exit_layers=[1, 3])
    x = token_batch(rng, lengths=[8, 5])
    logits = to_numpy(model(x))
    assert logits.shape == (2, 2, 8, VOCAB) and logits.dtype == np.float32
    embed, layers, final_norm, heads = oracle(model)
    for row, length in enumerate([8, 5]):
        expected = ref.exit_logits(embed(x["token_ids"][row, :length]), layers, final_norm,
                                   heads, model.exit_layers)
        np.testing.assert_allclose(logits[row, :, :length], expected, atol=2e-4, rtol=1e-4)


def test_last_exit_equals_causal_lm_and_head_counts(rng):
    """The last exit is `CausalLM` on the same backbone (post-norm: no final norm); each
    earlier exit of `"per_layer"` adds one output layer."""
    model = early_exit_lm(exit_layers=[1, 3], exit_heads="per_layer")
    randomize_weights(model, rng)
    plain = CausalLM(backbone=model.backbone)
    x = token_batch(rng, lengths=[8, 6])
    np.testing.assert_allclose(to_numpy(model(x))[:, -1], to_numpy(plain(x)), atol=1e-5)
    shared = early_exit_lm(exit_layers=[1, 3])
    assert model.count_params() - shared.count_params() == WIDTH * VOCAB + VOCAB
    assert shared.count_params() == plain.count_params()


def test_sequence_loss_equals_reference(rng):
    logits = rng.normal(size=(2, 3, 4, VOCAB)).astype("float32") * 2
    labels = rng.integers(0, VOCAB, size=(2, 4))
    weights = [0.3, 0.5, 1.0]
    losses = to_numpy(EarlyExitLoss(weights=weights).call(labels, logits))
    flat = logits.transpose(0, 2, 1, 3).reshape(8, 3, VOCAB)
    expected = ref_exit.exit_losses(labels.reshape(-1), flat, weights).reshape(2, 4)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)


def test_fit_lowers_the_exit_losses(rng):
    model = early_exit_lm(num_layers=2, norm_placement="pre", exit_loss_weights=[0.5, 1.0])
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    x = token_batch(rng, batch=4, lengths=[8, 6, 8, 5])
    y = np.roll(x["token_ids"], -1, axis=1)
    history = model.fit(x, y, sample_weight=x["padding_mask"], epochs=6, batch_size=4,
                        verbose=0)
    loss = history.history["loss"]
    assert loss[-1] < loss[0] and np.isfinite(loss).all()
    assert "accuracy" in history.history


@pytest.mark.parametrize("criterion, exit_heads", [
    ("entropy", "per_layer"), ("max_probability", "shared"),
    ("state_similarity", "per_layer"), ("patience", "shared"),
])
def test_adaptive_generation_equals_reference(rng, criterion, exit_heads):
    """Greedy decoding with exits equals the oracle that recomputes every layer's keys and
    values from stored inputs, the exit state copied to the layers above an exit."""
    model = confident_lm(rng, exit_heads=exit_heads)
    if criterion == "patience":
        threshold = 1
    else:
        logits = to_float64(model(token_batch(rng, batch=4)))[:, 0].reshape(-1, VOCAB)
        if criterion == "entropy":
            threshold = between(ref_exit.entropy(logits))
        elif criterion == "max_probability":
            threshold = between(ref_exit.max_probability(logits))
        else:  # the cosine of the first exit's states and the embeddings' (normalised)
            embed, layers, final_norm, _ = oracle(model)
            states = embed(PROMPTS[1])
            first = np.stack([ref.decoder_layer(layers[0], states, j) for j in range(4)])
            threshold = between(ref_exit.cosine(final_norm(first), final_norm(states)))
    expected_tokens, expected_exits = reference_decode(model, criterion, threshold)
    tokens, exits = model.generate(PROMPTS, max_length=MAX_LENGTH, exit_criterion=criterion,
                                   exit_threshold=threshold, return_exit_layers=True)
    for row, prompt in enumerate(PROMPTS):
        np.testing.assert_array_equal(tokens[row], expected_tokens[row])
        np.testing.assert_array_equal(exits[row], expected_exits[row])
        assert exits[row][: len(prompt)] == [0] * len(prompt)
    generated = np.concatenate([e[len(p):] for e, p in zip(exits, PROMPTS)])
    assert len(set(generated.tolist())) > 1  # tokens exit at different layers


def test_without_criterion_equals_causal_lm(rng):
    model = confident_lm(rng)
    plain = CausalLM(backbone=model.backbone)
    prompts = {"token_ids": np.array([[5, 9, 0, 0, 0, 0, 0, 0], [7, 3, 11, 0, 0, 0, 0, 0]]),
               "padding_mask": np.array([[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]])}
    expected = plain.generate(prompts)
    result = model.generate(prompts)
    np.testing.assert_array_equal(result["token_ids"], expected["token_ids"])
    tokens, exits = model.generate(prompts, return_exit_layers=True)
    np.testing.assert_array_equal(tokens["token_ids"], expected["token_ids"])
    generated = ~prompts["padding_mask"].astype(bool)
    np.testing.assert_array_equal(exits, np.where(generated, 3, 0))


def test_stop_tokens(rng):
    """Exit layers are 0 past a row's stop token; the ids equal the oracle's up to it."""
    model = confident_lm(rng)
    expected, _ = reference_decode(model, "patience", 1)
    stop = int(expected[0, len(PROMPTS[0])])
    tokens, exits = model.generate(PROMPTS, max_length=MAX_LENGTH, stop_token_ids=[stop],
                                   exit_criterion="patience", exit_threshold=1,
                                   return_exit_layers=True)
    assert tokens[0] == expected[0, : len(PROMPTS[0]) + 1].tolist()
    assert len(exits[0]) == len(tokens[0]) and exits[0][-1] > 0


def test_adaptive_generation_takes_generate_arguments(rng):
    """`max_new_tokens`, sampling arguments with a seed and the repetition penalty reach the
    adaptive loop, which compiles once per output-length bucket."""
    model = confident_lm(rng)
    adaptive = dict(exit_criterion="patience", exit_threshold=1, stop_token_ids=None)
    full = model.generate(PROMPTS, max_length=MAX_LENGTH, **adaptive)
    count = model.generate_compile_count
    short = model.generate(PROMPTS, max_new_tokens=2, **adaptive)  # output length 6: bucket 8
    assert short == [row[:6] for row in full]
    assert model.generate(PROMPTS, max_length=7, **adaptive) == [row[:7] for row in full]
    assert model.generate_compile_count == count + 1
    # Seeded top-k sampling under a penalty that no repeated token survives.
    sampled = [model.generate(PROMPTS, max_length=MAX_LENGTH, top_k=4, temperature=0.8,
                              seed=5, repetition_penalty=1e6, **adaptive) for _ in range(2)]
    assert sampled[0] == sampled[1]
    for row in sampled[0]:  # no token is chosen twice
        assert len(set(row)) == len(row), row


def test_beam_search_with_exits(rng):
    """Beam search repeats the loop state (exit records included) per beam."""
    model = confident_lm(rng)
    tokens = model.generate(PROMPTS, max_length=MAX_LENGTH, sampler="beam",
                            exit_criterion="patience", exit_threshold=1)
    for row, prompt in zip(tokens, PROMPTS):
        assert row[: len(prompt)] == prompt and len(row) == MAX_LENGTH
        assert all(0 <= t < VOCAB for t in row)


def test_skips_the_layers_above_every_rows_exit(rng):
    """Every row exits at layer 1 (`max_probability ≥ 0`): the blocks of layers 2 and 3 do
    not run, only their self-attention sub-layers fill the caches (on TensorFlow and PyTorch
    the untaken branch of the `cond` is not called; under JAX each layer is a `cond`)."""
    model = confident_lm(rng)
    token = np.array([[5], [7]], "int32")

    def step(token):
        with model._exit_scope(("max_probability", 0.0), ops.ones((2, 6), "bool")):
            cache = model._init_generation_cache(2, 6, ())
            return model._decode_token(token, cache, 0)

    if keras.config.backend() == "jax":
        import jax

        jaxpr = jax.make_jaxpr(lambda t: step(t)[0])(token)
        assert sum(e.primitive.name == "cond" for e in jaxpr.jaxpr.eqns) == len(model.blocks)
        return
    calls = []
    for index, block in enumerate(model.blocks):
        call = block.call
        block.call = lambda *a, _call=call, _index=index, **k: calls.append(_index) or _call(
            *a, **k)
    _, _, cache = step(token)
    assert calls == [0]
    assert to_numpy(cache["exit_layers"])[:, 1].tolist() == [1, 1]
    keys = [to_numpy(layer[0])[:, :, 0] for layer in cache["layers"]]
    assert all(np.abs(k).sum() > 0 for k in keys)  # every layer cached the token


def test_saving(rng, tmp_path):
    model = confident_lm(rng, exit_layers=[2, 3], exit_loss_weights=[0.5, 1.0])
    x = token_batch(rng, lengths=[8, 5])
    loaded = check_saving(model, x, tmp_path, atol=1e-5)
    assert loaded.exit_layers == [2, 3] and loaded.exit_heads == "per_layer"
    assert loaded.exit_loss_weights == [0.5, 1.0]


@pytest.mark.parametrize("kwargs, match", [
    ({"exit_layers": [1, 2]}, "exit_layers"),
    ({"exit_layers": [3, 1]}, "exit_layers"),
    ({"exit_heads": "tied"}, "exit_heads"),
    ({"exit_loss_weights": [1.0]}, "exit_loss_weights"),
    ({"reversible": True}, "backbone"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        early_exit_lm(**kwargs)


def test_non_causal_backbone_is_refused():
    from keras_xf.models import TransformerBackbone

    backbone = TransformerBackbone(num_layers=2, causal=False, **SIZES)
    with pytest.raises(ValueError, match="backbone"):
        EarlyExitCausalLM(backbone=backbone)


@pytest.mark.parametrize("kwargs, match", [
    ({"exit_criterion": "depth", "exit_threshold": 0.5}, "exit_criterion"),
    ({"exit_criterion": "patience", "exit_threshold": 0.5}, "exit_threshold"),
    ({"exit_criterion": "entropy", "exit_threshold": "low"}, "exit_threshold"),
    ({"exit_threshold": 0.5}, "exit_threshold"),
    ({"exit_criterion": "entropy", "exit_threshold": 0.5, "use_cache": False}, "use_cache"),
    ({"return_exit_layers": "yes"}, "return_exit_layers"),
    ({"return_exit_layers": True, "sampler": "beam"}, "return_exit_layers"),
])
def test_bad_generate_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        early_exit_lm(num_layers=1).generate([[5, 6]], max_length=6, **kwargs)


def test_chunked_loss_is_refused():
    with pytest.raises(ValueError, match="loss"):
        early_exit_lm(num_layers=1).compile(loss=ChunkedCrossEntropy())
