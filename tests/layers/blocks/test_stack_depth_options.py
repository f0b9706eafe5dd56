"""TransformerStack depth options: layer fusion (survey §4.2.3), layer drop and pruning
(§4.2.4), parameter sharing across layers (§4.2.4, §5.4), linear multi-step residuals (§4.3)."""

import keras
import numpy as np
import pytest

from keras_xf.layers import FeedForward
from keras_xf.layers import LayerFusion
from keras_xf.layers import LinearAttention
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import MultiStepResidual
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from tests.layer_checks import check_cached_decoding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.reference import layers as ref
from tests.reference import stack_options as oracle

WIDTH, HEADS, HIDDEN, LAYERS = 8, 2, 16, 3
BATCH, LENGTH = 2, 5
ATTENTION = 4 * WIDTH * WIDTH + 4 * WIDTH
BLOCK = ATTENTION + (2 * WIDTH * HIDDEN + WIDTH + HIDDEN) + 2 * 2 * WIDTH


def make_template(dtype=None, mixer=None):
    return TransformerBlock(mixer or MultiHeadAttention(HEADS, dtype=dtype),
                            FeedForward(HIDDEN, dtype=dtype), norm_placement="pre", dtype=dtype)


def make_stack(num_layers=LAYERS, dtype=None, final_norm=False, mixer=None, **options):
    return TransformerStack(make_template(dtype, mixer), num_layers, final_norm=final_norm,
                            dtype=dtype, **options)


@pytest.fixture
def x(rng):
    return rng.normal(size=(BATCH, LENGTH, WIDTH)).astype("float32")


def block_functions(stack):
    """Each layer as a numpy function `z ↦ Block_l(z)` (causal)."""
    return [lambda z, b=block: to_float64(b(z.astype("float32"), use_causal_mask=True))
            for block in stack.blocks]


def ffn_weights(ffn):
    dense = (ffn.hidden_dense, ffn.output_dense)
    return [to_float64(w) for d in dense for w in (d.kernel, d.bias)]


def fusion_function(fusion):
    """The numpy φ of a built `LayerFusion`, from its weights."""
    if fusion.mode == "average":
        phi = oracle.average
    elif fusion.mode == "weighted_sum":
        weights = to_float64(fusion.fusion_weights)
        phi = lambda zs: oracle.weighted_sum(zs, weights)  # noqa: E731
    elif fusion.mode == "feedforward":
        phi = lambda zs: oracle.feedforward(zs, ffn_weights(fusion.feedforward))  # noqa: E731
    else:
        wq, wk, wv = (to_float64(d.kernel) for d in
                      (fusion.query_dense, fusion.key_dense, fusion.value_dense))
        phi = lambda zs: oracle.attention(zs, wq, wk, wv, ffn_weights(fusion.feedforward))  # noqa
    if fusion.norm is None:
        return phi
    gamma, beta = to_float64(fusion.norm.gamma), to_float64(fusion.norm.beta)
    return lambda zs: ref.layer_norm(phi(zs), gamma, beta)


# --- Layer fusion ----------------------------------------------------------------------------


@pytest.mark.parametrize("fusion, normalization", [
    ("average", None), ("weighted_sum", None), ("weighted_sum", "layer_norm"),
    ("feedforward", None), ("attention", "layer_norm")])
def test_fusion_matches_reference(x, rng, fusion, normalization):
    stack = make_stack(fusion=fusion, fusion_normalization=normalization)
    stack.build(x.shape)
    for layer in stack.fusions:
        randomize_weights(layer, rng, scale=0.5)
    actual = to_float64(stack(x, use_causal_mask=True))
    expected = oracle.fused_stack(x.astype("float64"), block_functions(stack),
                                  [fusion_function(f) for f in stack.fusions])
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)
    # Fusion changes the function: the plain stack of the same blocks differs.
    plain = x.astype("float64")
    for block in block_functions(stack):
        plain = block(plain)
    assert not np.allclose(actual, plain, atol=1e-3)


@pytest.mark.parametrize("fusion, normalization, extra", [
    ("average", None, 0),
    ("weighted_sum", "layer_norm", (2 + 3 + 4) + 3 * 2 * WIDTH),
    # FFN from n·d to d with a hidden width of d: n·d·d + d + d·d + d, n = 2, 3, 4.
    ("feedforward", None, sum(n * WIDTH * WIDTH + 2 * WIDTH + WIDTH * WIDTH for n in (2, 3, 4))),
    ("attention", None,
     sum(3 * WIDTH * WIDTH + n * WIDTH * WIDTH + 2 * WIDTH + WIDTH * WIDTH for n in (2, 3, 4))),
])
def test_fusion_weight_count(fusion, normalization, extra):
    stack = make_stack(fusion=fusion, fusion_normalization=normalization)
    stack.build((BATCH, LENGTH, WIDTH))
    assert [f.num_inputs for f in stack.fusions] == [2, 3, 4]
    assert count_params(stack) == LAYERS * BLOCK + extra


def test_layer_fusion_validates():
    with pytest.raises(ValueError, match="fusion must be None or one of"):
        make_stack(fusion="max")
    with pytest.raises(ValueError, match="fusion_normalization"):
        make_stack(fusion="average", fusion_normalization="batch_norm")
    with pytest.raises(ValueError, match="num_inputs"):
        LayerFusion("average", 0)
    with pytest.raises(ValueError, match="inputs must have shape \\[batch, length, 3, 4\\]"):
        LayerFusion("average", 3)(np.ones((1, 2, 2, 4), "float32"))
    with pytest.raises(ValueError, match="inputs must have rank 4"):
        LayerFusion("average", 3)(np.ones((1, 2, 4), "float32"))
    with pytest.raises(ValueError, match="pass one of them"):
        make_stack(fusion="average", multistep="adams_bashforth_2")


# --- Layer drop --------------------------------------------------------------------------------


@pytest.mark.parametrize("rescale, scale", [("inference", 0.75), ("training", 1.0)])
def test_layer_drop_inference_rescaling(x, rescale, scale):
    stack = make_stack(layer_drop=0.25, layer_drop_rescale=rescale)
    stack.build(x.shape)
    actual = to_float64(stack(x, use_causal_mask=True, training=False))
    expected = oracle.layer_drop_stack(x.astype("float64"), block_functions(stack),
                                       [scale] * LAYERS)
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("rescale, kept", [("inference", 1.0), ("training", 2.0)])
def test_layer_drop_training_skips_whole_layers(x, rescale, kept):
    """Each example's output is the stack with some layers skipped (the gate is 0 or 1, or
    `1/ρ` under inverted scaling); over several calls both outcomes occur."""
    stack = make_stack(num_layers=2, layer_drop=0.5, layer_drop_rescale=rescale,
                       layer_drop_seed=3)
    stack.build(x.shape)
    blocks = block_functions(stack)
    combos = [(g0, g1) for g0 in (0.0, kept) for g1 in (0.0, kept)]
    candidates = [oracle.layer_drop_stack(x.astype("float64"), blocks, c) for c in combos]
    seen = set()
    for _ in range(6):
        y = to_float64(stack(x, use_causal_mask=True, training=True))
        for example in range(BATCH):
            matches = [i for i, c in enumerate(candidates)
                       if np.allclose(y[example], c[example], atol=2e-5, rtol=1e-4)]
            assert len(matches) == 1
            seen.add(combos[matches[0]][0])
    assert seen == {0.0, kept}


def test_prune_keeps_the_chosen_layers(x, rng):
    stack = make_stack(num_layers=4, layer_drop=0.2, final_norm=True)
    stack.build(x.shape)
    randomize_weights(stack.output_norm, rng)
    pruned = stack.prune([0, 2])
    assert pruned.num_layers == 2 and pruned.layer_drop == 0.2
    assert count_params(pruned) == 2 * BLOCK + 2 * WIDTH
    blocks = block_functions(stack)
    hidden = oracle.layer_drop_stack(x.astype("float64"), [blocks[0], blocks[2]], [0.8, 0.8])
    norm = stack.output_norm
    expected = ref.layer_norm(hidden, to_float64(norm.gamma), to_float64(norm.beta))
    actual = to_float64(pruned(x, use_causal_mask=True))
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)
    for bad in ([], [2, 0], [0, 0], [4], [-1], "0,2"):
        with pytest.raises(ValueError, match="layers must be"):
            stack.prune(bad)
    with pytest.raises(ValueError, match="built"):
        make_stack().prune([0])
    for fusion in ("feedforward", "attention"):
        fused = make_stack(fusion=fusion)
        fused.build(x.shape)
        with pytest.raises(ValueError, match=f"fusion='{fusion}'"):
            fused.prune([0])


@pytest.mark.parametrize("fusion, normalization", [("average", "layer_norm"),
                                                   ("weighted_sum", None),
                                                   ("weighted_sum", "layer_norm")])
def test_prune_restricts_fusion_to_the_kept_layers(x, rng, fusion, normalization):
    stack = make_stack(num_layers=4, fusion=fusion, fusion_normalization=normalization)
    stack.build(x.shape)
    for layer in stack.fusions:
        randomize_weights(layer, rng, scale=0.5)
    kept = [1, 3]
    pruned = stack.prune(kept)
    # Fusion j of the pruned stack is the old fusion of layer k_j on z^0 and the kept
    # layers' outputs.
    fusions = [fusion_function(stack.fusions[k]) for k in kept]
    inputs = [[0] + [k + 1 for k in kept[:j + 1]] for j in range(len(kept))]
    if fusion == "weighted_sum":
        fusions = [fusion_function(f) for f in pruned.fusions]
        for j, k in enumerate(kept):
            np.testing.assert_allclose(to_float64(pruned.fusions[j].fusion_weights),
                                       to_float64(stack.fusions[k].fusion_weights)[inputs[j]])
    else:
        assert all(len(f.weights) == len(stack.fusions[0].weights) for f in pruned.fusions)
    blocks = block_functions(stack)
    expected = oracle.fused_stack(x.astype("float64"), [blocks[k] for k in kept], fusions)
    np.testing.assert_allclose(to_float64(pruned(x, use_causal_mask=True)), expected,
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("learn", [False, True])
def test_prune_restricts_multistep_to_the_kept_layers(x, rng, learn):
    stack = make_stack(num_layers=4, multistep="adams_bashforth_3", learn_multistep=learn)
    stack.build(x.shape)
    if learn:
        for step in stack.multisteps:
            randomize_weights(step, rng)
    kept = [0, 2, 3]
    pruned = stack.prune(kept)
    if learn:
        # Layer j of the pruned stack weights the newest earlier output and its min(3, j + 1)
        # newest increments of the kept sequence with the coefficients of layer k_j.
        coefficients = [(to_float64(stack.multisteps[k].a_weights),
                         to_float64(stack.multisteps[k].b_weights)[:min(3, j + 1)])
                        for j, k in enumerate(kept)]
    else:  # the same fixed scheme over the kept sequence
        coefficients = [([1.0], oracle.ADAMS_BASHFORTH_B[min(3, j + 1)]) for j in range(3)]
    blocks = block_functions(stack)
    expected = oracle.multistep_stack(x.astype("float64"), [blocks[k] for k in kept],
                                      coefficients)
    np.testing.assert_allclose(to_float64(pruned(x, use_causal_mask=True)), expected,
                               atol=2e-5, rtol=1e-4)


def test_layer_drop_validates():
    with pytest.raises(ValueError, match="layer_drop must be a number in"):
        make_stack(layer_drop=1.0)
    with pytest.raises(ValueError, match="layer_drop_rescale"):
        make_stack(layer_drop=0.1, layer_drop_rescale="never")
    with pytest.raises(ValueError, match="layer_drop_seed"):
        make_stack(layer_drop=0.1, layer_drop_seed=-3)


# --- Parameter sharing -------------------------------------------------------------------------


@pytest.mark.parametrize("share_layers, owners", [
    ("all", [0, 0, 0, 0]), (2, [0, 1, 0, 1]), (1, [0, 0, 0, 0]),
    (["a", "a", "b", "b"], [0, 0, 2, 2]), ([0, 1, 1, 0], [0, 1, 1, 0])])
def test_sharing_reuses_blocks_and_counts_weights_once(x, share_layers, owners):
    stack = make_stack(num_layers=4, share_layers=share_layers, final_norm=True)
    stack.build(x.shape)
    assert [next(i for i, b in enumerate(stack.blocks) if b is block)
            for block in stack.blocks] == owners
    assert count_params(stack) == len(set(owners)) * BLOCK + 2 * WIDTH
    model = wrap_in_model(stack, [x])
    assert model.count_params() == len(set(owners)) * BLOCK + 2 * WIDTH
    # The stack applies the shared blocks in turn.
    hidden = x.astype("float64")
    for block in block_functions(stack):
        hidden = block(hidden)
    norm = stack.output_norm
    expected = ref.layer_norm(hidden, to_float64(norm.gamma), to_float64(norm.beta))
    np.testing.assert_allclose(to_float64(stack(x, use_causal_mask=True)), expected,
                               atol=2e-5, rtol=1e-4)


def test_shared_weights_train_together(x):
    model = wrap_in_model(make_stack(num_layers=2, share_layers="all"), [x])
    check_fit_step(model, [x])
    stack = model.layers[-1]
    assert stack.blocks[0] is stack.blocks[1]


@pytest.mark.parametrize("share_layers", ["some", 0, True, [0, 1], [0, 1.5, 0], 2.0])
def test_sharing_validates(share_layers):
    with pytest.raises(ValueError, match="share_layers"):
        make_stack(share_layers=share_layers)


def test_prune_keeps_sharing(x):
    stack = make_stack(num_layers=4, share_layers=["a", "b", "a", "b"])
    stack.build(x.shape)
    pruned = stack.prune([1, 2, 3])
    assert pruned.blocks[0] is pruned.blocks[2] and pruned.blocks[1] is not pruned.blocks[0]
    assert count_params(pruned) == 2 * BLOCK
    blocks = block_functions(stack)
    hidden = x.astype("float64")
    for block in (blocks[1], blocks[2], blocks[3]):
        hidden = block(hidden)
    np.testing.assert_allclose(to_float64(pruned(x, use_causal_mask=True)), hidden,
                               atol=2e-5, rtol=1e-4)


# --- Linear multi-step residuals ---------------------------------------------------------------


@pytest.mark.parametrize("order", [2, 3])
def test_adams_bashforth_matches_reference(x, order):
    stack = make_stack(num_layers=4, multistep=f"adams_bashforth_{order}")
    stack.build(x.shape)
    actual = to_float64(stack(x, use_causal_mask=True))
    # The first layers have fewer earlier steps: they take the lower orders (layer 0: Euler).
    coefficients = [([1.0], oracle.ADAMS_BASHFORTH_B[min(order, l + 1)]) for l in range(4)]
    expected = oracle.multistep_stack(x.astype("float64"), block_functions(stack), coefficients)
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-4)
    plain = x.astype("float64")
    for block in block_functions(stack):
        plain = block(plain)
    assert not np.allclose(actual, plain, atol=1e-3)


def test_euler_is_the_plain_stack(x):
    stack = make_stack(multistep={"a": [1.0], "b": [1.0]})
    stack.build(x.shape)
    plain = x.astype("float64")
    for block in block_functions(stack):
        plain = block(plain)
    np.testing.assert_allclose(to_float64(stack(x, use_causal_mask=True)), plain,
                               atol=2e-5, rtol=1e-4)


def test_learned_multistep_coefficients(x, rng):
    multistep = {"a": [1.0, 0.5, -0.25], "b": [1.0, 0.3]}
    stack = make_stack(multistep=multistep, learn_multistep=True)
    stack.build(x.shape)
    # Layer l has l + 1 earlier states and increments: a and b are cut to those.
    assert [len(s.a) + len(s.b) for s in stack.multisteps] == [2, 4, 5]
    assert count_params(stack) == LAYERS * BLOCK + 11
    for step in stack.multisteps:
        randomize_weights(step, rng)
    coefficients = [(to_float64(s.a_weights), to_float64(s.b_weights)) for s in stack.multisteps]
    expected = oracle.multistep_stack(x.astype("float64"), block_functions(stack), coefficients)
    np.testing.assert_allclose(to_float64(stack(x, use_causal_mask=True)), expected,
                               atol=2e-5, rtol=1e-4)
    model = wrap_in_model(make_stack(multistep="adams_bashforth_2", learn_multistep=True), [x])
    before = to_numpy(model.layers[-1].multisteps[1].b_weights).copy()
    check_fit_step(model, [x])
    assert not np.allclose(to_numpy(model.layers[-1].multisteps[1].b_weights), before)


@pytest.mark.parametrize("multistep", ["adams_bashforth_9", {"a": [1.0]}, {"a": [], "b": [1]},
                                       {"a": [1], "b": ["x"]}, 2])
def test_multistep_validates(multistep):
    with pytest.raises(ValueError, match="multistep"):
        make_stack(multistep=multistep)
    with pytest.raises(ValueError, match="learn_multistep"):
        make_stack(multistep="adams_bashforth_2", learn_multistep="yes")
    with pytest.raises(ValueError, match="needs 2 states and 1 increments: states"):
        MultiStepResidual([1.0, 1.0], [1.0])(np.ones((1, 2, 1, 4), "float32"),
                                             np.ones((1, 2, 1, 4), "float32"))


# --- Composition with caches, saving, mixed precision, XLA ------------------------------------

OPTIONS = {
    "fusion_attention": {"fusion": "attention", "fusion_normalization": "layer_norm"},
    "fusion_weighted_sum": {"fusion": "weighted_sum"},
    "fusion_feedforward": {"fusion": "feedforward"},
    "layer_drop": {"layer_drop": 0.2},
    "share_layers": {"share_layers": [0, 1, 0]},
    "multistep": {"multistep": "adams_bashforth_2", "learn_multistep": True},
}
CASES = pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))


@CASES
def test_cached_decoding_equals_full_pass(x, options):
    check_cached_decoding(make_stack(final_norm=True, **options), x, prefill=2, atol=2e-5)


@CASES
def test_other_mixers_compose_and_decode(x, options):
    mixer = LinearAttention(HEADS, decay=0.9)
    stack = make_stack(mixer=mixer, **options)
    check_cached_decoding(stack, x, prefill=2, atol=2e-5)


@CASES
def test_config_round_trip_and_saving(x, tmp_path, options):
    stack = make_stack(**options)
    clone = check_config_round_trip(stack)
    assert clone.get_config() == stack.get_config()
    check_saving(wrap_in_model(stack, [x], {"use_causal_mask": True}), [x], tmp_path)


@CASES
def test_mixed_bfloat16(x, options):
    outputs = check_mixed_precision(lambda dtype: make_stack(dtype=dtype, **options), [x],
                                    policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"


@xla_only
@CASES
def test_jit_compile(x, options):
    check_jit_compile(wrap_in_model(make_stack(**options), [x]), [x])
