"""LocalityPrior: the additive, mixture and multiplicative locality priors of survey §4.1.1,
inside MultiHeadAttention, against the numpy oracle."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LocalityPrior
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.models.tiny import FFN
from tests.models.tiny import batch_for
from tests.models.tiny import causal_lm
from tests.models.tiny import seq2seq_lm
from tests.reference import attention as ref_attention
from tests.reference import locality as ref

B, T, S, D = 2, 5, 6, 16


def _randomize(layer, rng):
    """Random projections; positive `γ` per head; unit-scale predictor and gate weights."""
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense):
        for w in dense.weights:
            w.assign((rng.normal(size=w.shape) * 0.3).astype("float32"))
    for hook in [h for h in layer.biases + [layer.multiplier] if h is not None]:
        for w in hook.weights:
            values = rng.normal(size=w.shape)
            if w.path.endswith("gamma"):
                values = rng.uniform(0.2, 1.5, size=w.shape)
            w.assign(values.astype("float32"))


def _weights(layer):
    names = dict(wq=layer.query_dense.kernel, wk=layer.key_dense.kernel,
                 wv=layer.value_dense.kernel, wo=layer.output_dense.kernel,
                 bq=layer.query_dense.bias, bk=layer.key_dense.bias,
                 bv=layer.value_dense.bias, bo=layer.output_dense.bias)
    return {k: to_float64(v) for k, v in names.items()}


def _penalty(prior, q, query_positions, key_positions):
    gamma = to_float64(prior.gamma_weight) if prior.trainable_gamma else prior.gamma
    if prior.distance == "predicted":
        g = ref.predicted_distance(
            q, len(key_positions), to_float64(prior.predictor_kernel),
            to_float64(prior.predictor_output)
        )
    else:
        g = ref.distance_matrix(query_positions, key_positions, prior.distance, prior.sigma)
        g = g[None, None]
    return ref.penalty(g, gamma)


def _beta(prior, q):
    if prior.beta == "gated":
        return ref.gate(q, to_float64(prior.gate_kernel), to_float64(prior.gate_bias))
    return prior.beta


def _expected(layer, x, memory=None, mask=None):
    """The oracle's outputs `[B, T, d]` and weights `[B, H, T, S]` for `layer`'s priors."""
    w = _weights(layer)
    q, k, v = ref.project(x, x if memory is None else memory, w, layer.num_heads,
                          layer.num_key_value_heads)
    positions = np.arange(q.shape[2]), np.arange(k.shape[2])
    additive = [_penalty(b, q, *positions) for b in layer.biases if b.form == "additive"]
    mixtures = [(_penalty(b, q, *positions), _beta(b, q))
                for b in layer.biases if b.form == "mixture"]
    multiplicative = None
    if layer.multiplier is not None:
        multiplicative = _penalty(layer.multiplier, q, *positions)
    context, weights = ref.attention_with_priors(q, k, v, additive, multiplicative, mixtures, mask)
    return ref.output(context, w), weights


def _all_forms(distance="absolute", gamma=1.0):
    """Hooks with every form at once: an additive bias, a gated mixture, a multiplier."""
    sigma = {"sigma": 2.0} if distance == "gaussian" else {}
    return dict(
        biases=[
            LocalityPrior(distance=distance, gamma=gamma, trainable_gamma=True, **sigma),
            LocalityPrior(form="mixture", distance=distance, beta="gated", gamma=0.5 * gamma,
                          **sigma),
        ],
        multiplier=LocalityPrior(form="multiplicative", distance=distance, gamma=0.3 * gamma,
                                 **sigma),
    )


SELF_HOOKS = {
    "additive_absolute": lambda: dict(biases=[LocalityPrior(gamma=0.5)]),
    "additive_gaussian_trained": lambda: dict(
        biases=[LocalityPrior(distance="gaussian", sigma=1.5, trainable_gamma=True)]),
    "mixture_absolute": lambda: dict(biases=[LocalityPrior(form="mixture", beta=0.3)]),
    "mixture_gaussian_gated": lambda: dict(biases=[LocalityPrior(
        form="mixture", distance="gaussian", sigma=2.0, beta="gated", trainable_gamma=True)]),
    "multiplicative_absolute": lambda: dict(
        multiplier=LocalityPrior(form="multiplicative", gamma=0.3)),
    "all_gaussian": lambda: _all_forms("gaussian"),
}


@pytest.mark.parametrize("name", sorted(SELF_HOOKS))
def test_self_attention_forms_match_reference(rng, name):
    layer = MultiHeadAttention(num_heads=2, **SELF_HOOKS[name]())
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 3], T)
    layer(x)
    _randomize(layer, rng)
    for causal in (False, True):
        mask = padding[:, None, None, :]
        if causal:
            mask = mask & ref_attention.causal_mask(T)[None, None]
        expected, expected_weights = _expected(layer, x, mask=mask)
        out = layer(x, padding_mask=padding, use_causal_mask=causal)
        np.testing.assert_allclose(to_float64(out), expected, atol=1e-4, rtol=1e-4)
        out, weights = checks.split_scores(layer(
            x, padding_mask=padding, use_causal_mask=causal, return_attention_scores=True
        ))
        np.testing.assert_allclose(to_float64(out), expected, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(to_float64(weights), expected_weights, atol=1e-5)


@pytest.mark.parametrize("form", ["additive", "mixture", "multiplicative"])
def test_predicted_cross_attention_matches_reference(rng, form):
    prior = LocalityPrior(form=form, distance="predicted", predictor_units=4,
                          beta="gated" if form == "mixture" else None)
    hooks = {"multiplier": prior} if form == "multiplicative" else {"biases": [prior]}
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1, **hooks)
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, 12))
    padding = padding_mask([6, 2], S)
    layer(x, memory)
    _randomize(layer, rng)
    expected, expected_weights = _expected(layer, x, memory, mask=padding[:, None, None, :])
    out, weights = checks.split_scores(layer(x, memory, padding_mask=padding, return_attention_scores=True))
    np.testing.assert_allclose(to_float64(out), expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(to_float64(weights), expected_weights, atol=1e-5)
    # The predicted centres move with the queries: the prior is not a fixed matrix.
    g = to_float64(prior(layer.query_dense(x), layer.key_dense(memory), np.arange(T), np.arange(S)))
    assert g.shape == (B, 2, T, S) == prior.compute_output_shape((B, T, 2, 8), (B, S, 1, 8))
    assert not np.allclose(g[0], g[1])


def test_fully_masked_rows_give_zeros(rng):
    layer = MultiHeadAttention(num_heads=2, **_all_forms())
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 0], T)
    out, weights = checks.split_scores(layer(x, padding_mask=padding, return_attention_scores=True))
    weights = to_float64(weights)
    assert np.all(np.isfinite(to_float64(out)))
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_allclose(weights[0].sum(-1), 1.0, atol=1e-5)


SELF_CACHE_HOOKS = {
    "additive_trained": lambda: dict(biases=[LocalityPrior(trainable_gamma=True)]),
    "mixture_gaussian_gated": lambda: dict(biases=[LocalityPrior(
        form="mixture", distance="gaussian", sigma=1.0, beta="gated")]),
    "multiplicative": lambda: dict(multiplier=LocalityPrior(form="multiplicative", gamma=0.5)),
}


@pytest.mark.parametrize("name", sorted(SELF_CACHE_HOOKS))
def test_cached_decoding_equals_full_causal_pass(rng, name):
    layer = MultiHeadAttention(num_heads=2, num_key_value_heads=1, **SELF_CACHE_HOOKS[name]())
    x = random_normal(rng, (B, T, D))
    layer(x)
    _randomize(layer, rng)
    checks.check_cached_decoding(layer, x, prefill=2, cache_length=T + 2)


def test_predicted_cross_attention_cache_equals_full_pass(rng):
    layer = MultiHeadAttention(num_heads=2, **_all_forms("predicted"))
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))
    padding = padding_mask([6, 4], S)
    layer(x, memory)
    _randomize(layer, rng)
    full = to_float64(layer(x, memory, padding_mask=padding))
    cache = layer.init_cache(B, S)
    out, cache = layer(x[:, :1], memory, padding_mask=padding, cache=cache)
    outputs = [to_float64(out)]
    for index in range(1, T):
        out, cache = layer(x[:, index : index + 1], padding_mask=padding, cache=cache)
        outputs.append(to_float64(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    keras.config.set_dtype_policy(policy)  # the hooks take the global policy too
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))
    padding = padding_mask([5, 0], T)
    hooks = _all_forms("gaussian", gamma=50.0)
    out = checks.check_mixed_precision(
        lambda **kw: MultiHeadAttention(num_heads=2, **hooks, **kw),
        [x],
        {"padding_mask": padding, "use_causal_mask": True},
        policy=policy,
    )
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    # Penalties beyond float16's range are capped at 10⁴: the additive bias stays finite.
    capped = MultiHeadAttention(num_heads=2, biases=[LocalityPrior(gamma=1e5)])
    assert np.all(np.isfinite(to_float64(capped(x, padding_mask=padding))))
    cross = MultiHeadAttention(num_heads=2, **_all_forms("predicted"))
    out, weights = checks.split_scores(cross(x, memory, padding_mask=padding_mask([6, 0], S),
                         return_attention_scores=True))
    assert keras.backend.standardize_dtype(weights.dtype) == "float32"
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in cross.weights)
    assert np.all(np.isfinite(to_float64(out)))
    np.testing.assert_array_equal(to_float64(weights)[1], 0.0)


@checks.xla_only
def test_jit_compile(rng):
    x = random_normal(rng, (B, T, D))
    padding = padding_mask([5, 3], T)
    layer = MultiHeadAttention(num_heads=2, **_all_forms("gaussian"))
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding, "use_causal_mask": True})
    checks.check_jit_compile(model, [x, padding])


def test_config_weights_fit_and_saving(rng, tmp_path):
    prior = LocalityPrior(form="mixture", distance="predicted", beta="gated", trainable_gamma=True,
                          predictor_units=4, gamma=2.0, name="prior")
    clone = checks.check_config_round_trip(prior)
    assert (clone.form, clone.distance, clone.beta, clone.gamma) == ("mixture", "predicted",
                                                                     "gated", 2.0)
    layer = MultiHeadAttention(num_heads=2, biases=[prior], multiplier=LocalityPrior(
        form="multiplicative", distance="gaussian", sigma=3.0))
    x, memory = random_normal(rng, (B, T, D)), random_normal(rng, (B, S, D))
    padding = padding_mask([6, 3], S)
    model = checks.wrap_in_model(layer, [x, memory], {"padding_mask": padding})
    # γ per head, W [Dh, 4], (u_μ, u_σ) [4, 2], gate w_β [Dh, 1] and b_β.
    assert checks.count_params(prior) == 2 + 8 * 4 + 4 * 2 + 8 + 1
    checks.check_config_round_trip(layer)
    gamma = to_float64(prior.gamma_weight)
    checks.check_fit_step(model, [x, memory, padding])
    assert not np.allclose(to_float64(prior.gamma_weight), gamma)
    loaded = checks.check_saving(model, [x, memory, padding], tmp_path, atol=1e-5)
    mha = [l for l in loaded.layers if isinstance(l, MultiHeadAttention)][0]
    assert mha.biases[0].mixes_weights and mha.multiplier.sigma == 3.0


def _fit(model, rng, steps=4):
    x, y = batch_for(model, rng)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    before = [to_float64(w) for w in model.trainable_weights]
    history = model.fit(x, y, batch_size=2, epochs=steps, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    return before


def test_causal_lm_trains_with_self_attention_priors(rng):
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=2, **_all_forms()),
        feedforward=FeedForward(hidden_dim=FFN),
    )
    model = causal_lm(block=block, num_layers=1)
    mixer = model.backbone.transformer_stack.blocks[0].mixer
    assert [b.form for b in mixer.biases] == ["additive", "mixture"]
    gamma = to_float64(mixer.biases[0].gamma_weight)
    _fit(model, rng)
    assert not np.allclose(to_float64(mixer.biases[0].gamma_weight), gamma)


def test_seq2seq_lm_trains_with_predicted_cross_attention_prior(rng):
    decoder_block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=2, causal=True),
        feedforward=FeedForward(hidden_dim=FFN),
        cross_attention=MultiHeadAttention(num_heads=2, biases=[
            LocalityPrior(distance="predicted"),
            LocalityPrior(form="mixture", distance="predicted", beta="gated"),
        ]),
    )
    model = seq2seq_lm(decoder_block=decoder_block)
    prior = model.backbone.decoder.blocks[0].cross_attention.biases[0]
    before = to_float64(prior.predictor_kernel)
    _fit(model, rng)
    assert not np.allclose(to_float64(prior.predictor_kernel), before)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"form": "convolutional"}, "form='convolutional'"),
        ({"distance": "manhattan"}, "distance='manhattan'"),
        ({"gamma": 0.0}, "gamma=0.0"),
        ({"gamma": "big"}, "gamma='big'"),
        ({"trainable_gamma": 1}, "trainable_gamma=1"),
        ({"distance": "gaussian"}, "sigma=None"),
        ({"distance": "gaussian", "sigma": -1.0}, "sigma=-1.0"),
        ({"sigma": 2.0}, "sigma=2.0, distance='absolute'"),
        ({"form": "mixture"}, "beta=None"),
        ({"form": "mixture", "beta": 1.5}, "beta=1.5"),
        ({"form": "mixture", "beta": "learned"}, "beta='learned'"),
        ({"beta": 0.5}, "beta=0.5, form='additive'"),
        ({"predictor_units": 4}, "predictor_units=4, distance='absolute'"),
        ({"distance": "predicted", "predictor_units": 0}, "predictor_units=0"),
    ],
)
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalityPrior(**kwargs)


def test_bad_query_rank_raises():
    with pytest.raises(ValueError, match=r"query_shape=\(2, 5, 16\)"):
        LocalityPrior().build((2, 5, 16))
