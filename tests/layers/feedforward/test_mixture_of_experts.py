"""Router and MixtureOfExperts: sparse dispatch against the dense numpy mixture, capacity and
drops, padding, losses, gradients, router metrics in `fit`, precision, XLA, saving, errors."""

import keras
import numpy as np
import pytest

from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import Router
from keras_xf.layers import TransformerBlock
from tests import layer_checks as checks
from tests.layer_checks import padding_mask
from tests.layer_checks import random_normal
from tests.layer_checks import to_float64
from tests.models.tiny import causal_lm
from tests.models.tiny import token_batch
from tests.reference import moe as ref
from tests.layers.bad_inputs import bad_padding_masks
from tests.layers.bad_inputs import raises_naming

B, T, D, M, F = 2, 6, 16, 4, 8
LENGTHS = [T, 4]


def _randomize(layer, rng, scale=0.3):
    """Non-zero biases and varied router logits, so that every term is exercised."""
    for weight in layer.weights:
        if weight.trainable and ("bias" in weight.path or "router" in weight.path):
            weight.assign(rng.normal(size=weight.shape).astype("float32") * scale * 3)


def _reference(layer, x, padding_mask=None, capacity=None):
    """The layer's output from its weights, token by token (survey §4.4 / §5.6)."""
    h = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    valid = np.ones(len(h), bool) if padding_mask is None else padding_mask.reshape(-1)
    router = layer.router
    index, gates, probabilities, logits = ref.route(
        h, to_float64(router.kernel), None if router.bias is None else to_float64(router.bias),
        layer.top_k,
        layer.router_order, layer.normalize_top_k)
    weights = {name: None if getattr(layer, f"expert_{name}") is None
               else to_float64(getattr(layer, f"expert_{name}"))
               for name in ("kernel_in", "kernel_out", "kernel_gate", "bias_in", "bias_out",
                            "bias_gate")}

    def expert_fn(rows, i):
        return ref.expert(rows, i, layer.activation, weights["kernel_in"], weights["kernel_out"],
                          weights["kernel_gate"], weights["bias_in"], weights["bias_out"],
                          weights["bias_gate"])

    kept = ref.kept_assignments(index, valid, layer.num_experts, capacity)
    out = ref.mixture_of_experts(h, index, gates, kept, expert_fn)
    if layer.output_bias is not None:
        out = out + to_float64(layer.output_bias)
    if layer.shared_experts is not None:
        ffn = layer.shared_experts
        w = {n: to_float64(getattr(ffn, f"{n}_dense").kernel)[None] for n in ("hidden", "output")}
        b = {n: to_float64(getattr(ffn, f"{n}_dense").bias)[None] for n in ("hidden", "output")}
        gate = None if ffn.gate_dense is None else to_float64(ffn.gate_dense.kernel)[None]
        gate_bias = None if ffn.gate_dense is None else to_float64(ffn.gate_dense.bias)[None]
        out = out + ref.expert(h, 0, layer.activation, w["hidden"], w["output"], gate,
                               b["hidden"], b["output"], gate_bias)
    losses = (ref.load_balance_loss(index, probabilities, valid, layer.num_experts),
              ref.z_loss(logits, valid))
    return out.reshape(x.shape), kept, valid, losses


CONFIGS = [
    dict(activation="relu", capacity_factor=4.0),
    dict(activation="swiglu", capacity_factor=None, block_size=4),
    dict(activation="gelu", router_order="topk_then_softmax", top_k=1, capacity_factor=None),
    dict(activation="geglu", slices=True, num_shared_experts=1, normalize_top_k=False,
         intermediate_dim=16),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_sparse_dispatch_matches_dense_reference(rng, config):
    """With room for every assignment, sparse dispatch equals Σ_{i∈π} g_i·FFN_i(h)."""
    config = {"intermediate_dim": F, **config}
    layer = MixtureOfExperts(M, **config)
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer(x)
    _randomize(layer, rng)
    outputs = layer(x, padding_mask=mask)
    expected, kept, valid, (balance, z) = _reference(layer, x, mask)
    assert kept[valid].all()
    np.testing.assert_allclose(to_float64(outputs), expected, atol=2e-5, rtol=1e-4)
    losses = [to_float64(loss) for loss in layer.losses]
    np.testing.assert_allclose(losses, [0.01 * balance, 0.001 * z], rtol=1e-4)


def test_capacity_drops_match_reference(rng):
    """Beyond `C = ceil(f·k·N/M)` rows an assignment is dropped (zero), first choices first;
    padding tokens take no rows; the drop rate is recorded."""
    layer = MixtureOfExperts(M, F, top_k=2, capacity_factor=0.5)
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer(x)
    _randomize(layer, rng)
    layer.statistics.reset_state()
    outputs = layer(x, padding_mask=mask)
    capacity = int(np.ceil(0.5 * 2 * B * T / M))
    expected, kept, valid, _ = _reference(layer, x, mask, capacity=capacity)
    assert 0 < (~kept[valid]).sum()
    np.testing.assert_allclose(to_float64(outputs), expected, atol=2e-5, rtol=1e-4)
    result = {k.split("/")[-1]: float(to_float64(v)) for k, v in layer.statistics.result().items()}
    assert result["drop_rate"] == pytest.approx((~kept[valid]).mean())
    assert sum(result[f"load_{i}"] for i in range(M)) == pytest.approx(1.0)
    # Padding tokens neither take rows nor give outputs.
    other = x.copy()
    other[~mask] = rng.normal(size=other[~mask].shape) * 10
    again = to_float64(layer(other, padding_mask=mask))
    np.testing.assert_allclose(again[mask], to_float64(outputs)[mask], atol=1e-5)
    np.testing.assert_allclose(again[~mask], 0.0, atol=1e-6)


@pytest.mark.parametrize("capacity_factor", [None, 4.0])
def test_route_padding_routes_padded_tokens_as_real_ones(rng, capacity_factor):
    """`route_padding=True` (Mixtral's routing): padding tokens are computed like real ones
    (each position equals the unmasked call), but the losses and statistics still count the
    real tokens only."""
    layer = MixtureOfExperts(M, F, top_k=2, activation="geglu_tanh",
                             capacity_factor=capacity_factor, route_padding=True)
    x, mask = random_normal(rng, (B, T, D)), padding_mask(LENGTHS, T)
    layer(x)
    _randomize(layer, rng)
    unmasked = to_float64(layer(x))
    layer.statistics.reset_state()
    outputs = to_float64(layer(x, padding_mask=mask))
    np.testing.assert_allclose(outputs, unmasked, atol=1e-6)
    expected = _reference(layer, x)[0]
    np.testing.assert_allclose(outputs, expected, atol=2e-5, rtol=1e-4)
    _, _, _, (balance, z) = _reference(layer, x, mask)  # the losses of the real tokens
    np.testing.assert_allclose([to_float64(loss) for loss in layer.losses],
                               [0.01 * balance, 0.001 * z], rtol=1e-4)
    assert to_float64(layer.router_total) == 2 * mask.sum()
    assert to_float64(layer.router_assignments).sum() == 2 * mask.sum()
    clone = checks.check_config_round_trip(layer)
    assert clone.route_padding is True
    raises_naming("route_padding", lambda: MixtureOfExperts(M, F, route_padding="yes"))


def test_expert_receiving_no_tokens_is_fine(rng):
    layer = MixtureOfExperts(M, F, top_k=1, capacity_factor=1.0, router_bias=True)
    x = random_normal(rng, (B, T, D))
    layer(x)
    layer.router.bias.assign(np.array([-1e4] + [0.0] * (M - 1), "float32"))  # expert 0 unused
    layer.statistics.reset_state()
    outputs = to_float64(layer(x))
    expected, kept, _, _ = _reference(layer, x, capacity=int(np.ceil(B * T / M)))
    assert to_float64(layer.router_assignments)[0] == 0
    assert np.isfinite(outputs).all()
    np.testing.assert_allclose(outputs, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("order", ["softmax_then_topk", "topk_then_softmax"])
def test_router_matches_reference_and_noise_only_in_training(rng, order):
    router = Router(M, top_k=2, order=order, noise_std=1.0, use_bias=True, seed=1)
    x = rng.normal(size=(B, T, D)).astype("float32")
    index, gates, probabilities, logits = router(x)
    expected = ref.route(x.reshape(-1, D), to_float64(router.kernel), to_float64(router.bias), 2,
                         order)
    np.testing.assert_array_equal(to_float64(index).reshape(-1, 2), expected[0])
    for actual, want in zip((gates, probabilities, logits), expected[1:]):
        assert keras.backend.standardize_dtype(actual.dtype) == "float32"
        np.testing.assert_allclose(to_float64(actual).reshape(want.shape), want, atol=1e-5)
    noisy = to_float64(router(x, training=True)[3])
    assert not np.allclose(noisy, to_float64(logits))


def test_gradients_reach_router_and_experts(rng):
    layer = MixtureOfExperts(M, F, top_k=2, activation="swiglu", num_shared_experts=1)
    x = random_normal(rng, (B, T, D))
    inputs = keras.Input((T, D))
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = {w.path: to_float64(w).copy() for w in model.trainable_weights}
    model.fit(x, np.ones_like(x), epochs=1, batch_size=B, verbose=0)
    changed = {w.path for w in model.trainable_weights
               if not np.allclose(to_float64(w), before[w.path])}
    for name in ("router/gate/kernel", "experts_in/expert_kernel", "experts_gate/expert_kernel",
                 "experts_out/expert_kernel", "shared_experts/hidden/kernel"):
        assert any(name in path for path in changed), (name, changed)


def test_config_round_trip_and_weights(rng):
    layer = MixtureOfExperts(M, F, top_k=2, activation="swiglu", capacity_factor=None,
                             num_shared_experts=1, noise_std=0.1, seed=3)
    clone = checks.check_config_round_trip(layer)
    assert clone.capacity_factor is None
    x = random_normal(rng, (B, T, D))
    model = checks.wrap_in_model(layer, [x], {"padding_mask": padding_mask(LENGTHS, T)})
    names = sorted(w.path.split("/", 1)[1] for w in layer.weights
                   if w.trainable and w.name.startswith("expert_"))
    assert names == [f"experts_{part}/expert_{kind}" for part in ("gate", "in", "out")
                     for kind in ("bias", "kernel")]
    assert tuple(layer.expert_kernel_in.shape) == (M, D, F)
    assert tuple(layer.expert_kernel_out.shape) == (M, F, D)
    experts = M * (3 * D * F + 2 * F + D)
    shared = 3 * D * F + 2 * F + D
    counts = M + 2  # router statistics
    assert checks.count_params(layer) == experts + shared + D * M + counts
    assert len(model.non_trainable_weights) == 3


def test_mixed_float16(rng):
    """Half-precision experts, float32 variables, router and losses (bfloat16: in the
    CausalLM test below)."""
    policy = "mixed_float16"
    def make(**kwargs):
        return MixtureOfExperts(M, F, activation="swiglu", num_shared_experts=1, **kwargs)

    outputs = checks.check_mixed_precision(make, [random_normal(rng, (B, T, D))],
                                           {"padding_mask": padding_mask(LENGTHS, T)},
                                           policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == keras.DTypePolicy(policy).compute_dtype
    layer = make(dtype=policy)
    layer(random_normal(rng, (B, T, D)))
    assert all(keras.backend.standardize_dtype(loss.dtype) == "float32" for loss in layer.losses)
    index, gates, _, logits = layer.router(random_normal(rng, (B, T, D)))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def _moe_lm(dtype=None, num_layers=2, **moe):
    block = TransformerBlock(
        MultiHeadAttention(2), MixtureOfExperts(M, 16, top_k=2, **moe), norm_placement="pre")
    return causal_lm(block=block, num_layers=num_layers, dtype=dtype)


# XLA where Keras has it (TensorFlow, JAX); PyTorch runs eagerly.
JIT = checks.BACKEND in ("tensorflow", "jax")


def _fit(model, rng, epochs=3, jit_compile="auto"):
    x = token_batch(rng, batch=4, lengths=[8, 8, 5, 3])
    y = rng.integers(1, 32, size=x["token_ids"].shape).astype("int32")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, shuffle=False).history
    losses = history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    return history, x


def test_causal_lm_trains_logs_router_metrics_and_saves(rng, tmp_path):
    """Two MoE blocks: `fit` lowers the loss and its logs carry each
    layer's drop rate and expert loads; `.keras` round trip."""
    model = _moe_lm(capacity_factor=1.0)
    history, x = _fit(model, rng)
    drop_keys = [k for k in history if k.endswith("/drop_rate")]
    assert len(drop_keys) == 2, sorted(history)  # one per MoE layer, distinct names
    for key in drop_keys:
        assert all(0.0 <= v < 1.0 for v in history[key]), history[key]
        loads = [history[key.replace("drop_rate", f"load_{i}")][-1] for i in range(M)]
        assert sum(loads) == pytest.approx(1.0, abs=1e-5)
    # The block passes its padding mask: the last epoch routed the 24 real tokens only.
    for block in model.backbone.transformer_stack.blocks:
        assert float(to_float64(block.feedforward.router_total)) == 24 * 2
    checks.check_saving(model, x, tmp_path, atol=1e-5)


def test_causal_lm_trains_dropless_sliced_under_mixed_bfloat16_and_xla(rng):
    """Dropless dispatch, slices, a shared expert and routed padding (Mixtral's) under
    mixed_bfloat16, compiled with XLA on TensorFlow and JAX (eager on PyTorch, where Keras has
    no XLA); the statistics count the 24 real tokens only."""
    model = _moe_lm(dtype="mixed_bfloat16", num_layers=1, capacity_factor=None,
                    activation="geglu_tanh", slices=True, num_shared_experts=1,
                    route_padding=True)
    _fit(model, rng, jit_compile=JIT)
    moe = model.backbone.transformer_stack.blocks[0].feedforward
    assert float(to_float64(moe.router_total)) == 24 * 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(top_k=5), "top_k must not exceed num_experts"),
        (dict(capacity_factor=0), "capacity_factor must be a positive number"),
        (dict(capacity_factor=-1.0), "capacity_factor must be a positive number"),
        (dict(router_order="topk"), "router_order must be one of"),
        (dict(slices=True, intermediate_dim=6), "num_experts must divide intermediate_dim"),
        (dict(activation="tanh"), "activation must be one of"),
        (dict(noise_std=-0.1), "noise_std must be a non-negative number"),
    ],
)
def test_bad_configs_raise(kwargs, message):
    kwargs = {"intermediate_dim": F, **kwargs}
    with pytest.raises(ValueError, match=message) as info:
        MixtureOfExperts(M, **kwargs)
    assert "Received" in str(info.value)


@pytest.mark.parametrize("mask", bad_padding_masks(B, T))
@pytest.mark.parametrize("capacity_factor", [1.25, None])
def test_bad_padding_mask_raises(rng, capacity_factor, mask):
    layer = MixtureOfExperts(M, F, capacity_factor=capacity_factor)
    raises_naming("padding_mask", lambda: layer(random_normal(rng, (B, T, D)), padding_mask=mask))


def test_bad_inputs_raise(rng):
    layer = MixtureOfExperts(M, F)
    layer(random_normal(rng, (B, T, D)))
    raises_naming("inputs", lambda: layer(rng.normal(size=(B, T, D + 2)).astype("float32")))
    router = layer.router
    raises_naming("inputs", lambda: router(rng.normal(size=(B, D + 2)).astype("float32")))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(kernel_initializer="not_an_initializer"), "kernel_initializer"),
        (dict(bias_initializer=3), "bias_initializer"),
        (dict(capacity_factor="x"), "capacity_factor"),
        (dict(num_shared_experts=-1), "num_shared_experts"),
        (dict(load_balance_weight=-0.5), "load_balance_weight"),
        (dict(z_loss_weight="x"), "z_loss_weight"),
        (dict(block_size=0), "block_size"),
        (dict(dropout=1.0), "dropout"),
        (dict(top_k=True), "top_k"),
        (dict(intermediate_dim=True), "intermediate_dim"),
    ],
)
def test_bad_constructor_arguments_raise(kwargs, name):
    kwargs = {"intermediate_dim": F, **kwargs}
    raises_naming(name, lambda: MixtureOfExperts(M, **kwargs))


def test_bad_router_arguments_raise():
    raises_naming("num_experts", lambda: Router(0))
    raises_naming("kernel_initializer", lambda: Router(M, kernel_initializer="nope"))
    raises_naming("noise_std", lambda: Router(M, noise_std="x"))
