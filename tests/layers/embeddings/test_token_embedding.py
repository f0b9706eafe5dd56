import keras
import numpy as np
import pytest

from keras_xf.layers import TokenAndPositionEmbedding
from keras_xf.layers import TokenEmbedding
from tests.layer_checks import check_config_round_trip
from tests.layer_checks import check_fit_step
from tests.layer_checks import check_jit_compile
from tests.layer_checks import check_mixed_precision
from tests.layer_checks import check_saving
from tests.layer_checks import count_params
from tests.layer_checks import to_numpy
from tests.layer_checks import wrap_in_model
from tests.layer_checks import xla_only
from tests.layers.bad_inputs import raises_naming
from tests.reference import quantization

VOCAB, DIM = 11, 8


def make_layer(**kwargs):
    kwargs.setdefault("vocabulary_size", VOCAB)
    kwargs.setdefault("embedding_dim", DIM)
    return TokenEmbedding(**kwargs)


def token_ids(rng, batch=2, length=5):
    return rng.integers(0, VOCAB, size=(batch, length)).astype("int32")


def language_model(layer, length=5):
    """ids -> embeddings -> (shared or separate) reverse projection -> logits."""
    ids = keras.Input(shape=(length,), dtype="int32", name="ids")
    hidden = layer(ids)
    logits = layer(hidden, reverse=True)
    return keras.Model(ids, logits)


@pytest.mark.parametrize("tie_weights,expected", [(True, VOCAB * DIM), (False, 2 * VOCAB * DIM)])
def test_build_and_weight_count(tie_weights, expected):
    layer = make_layer(tie_weights=tie_weights)
    layer.build((2, 5))
    assert count_params(layer) == expected
    assert len(layer.trainable_weights) == (1 if tie_weights else 2)
    assert tuple(layer.embeddings.shape) == (VOCAB, DIM)
    if not tie_weights:
        assert tuple(layer.reverse_embeddings.shape) == (DIM, VOCAB)


def test_output_shapes(rng):
    layer = make_layer()
    ids = token_ids(rng)
    hidden = layer(ids)
    assert tuple(hidden.shape) == (2, 5, DIM)
    assert tuple(layer(hidden, reverse=True).shape) == (2, 5, VOCAB)
    assert layer.compute_output_shape((2, 5)) == (2, 5, DIM)
    assert layer.compute_output_shape((2, 5, DIM), reverse=True) == (2, 5, VOCAB)


def test_config_round_trip():
    layer = make_layer(tie_weights=False, scale=True, embeddings_initializer="glorot_uniform", name="tok")
    clone = check_config_round_trip(layer)
    config = clone.get_config()
    assert config["vocabulary_size"] == VOCAB and config["embedding_dim"] == DIM
    assert config["tie_weights"] is False and config["scale"] is True
    assert clone.name == "tok"


def test_numpy_integer_sizes_are_accepted_and_serialisable():
    layer = TokenEmbedding(np.int64(VOCAB), np.int32(DIM))
    assert type(layer.get_config()["vocabulary_size"]) is int
    check_config_round_trip(layer)


def test_lookup_matches_embedding_rows(rng):
    layer = make_layer()
    ids = token_ids(rng)
    outputs = to_numpy(layer(ids))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(outputs, table[ids], rtol=1e-6)


def test_scale_multiplies_by_sqrt_dim(rng):
    ids = token_ids(rng)
    plain = make_layer(scale=False)
    scaled = make_layer(scale=True)
    plain.build(ids.shape)
    scaled.build(ids.shape)
    scaled.embeddings.assign(plain.embeddings)
    expected = to_numpy(plain.embeddings)[ids] * np.sqrt(DIM)
    np.testing.assert_allclose(to_numpy(scaled(ids)), expected, rtol=1e-6)
    np.testing.assert_allclose(to_numpy(scaled(ids)), to_numpy(plain(ids)) * np.sqrt(DIM), rtol=1e-6)
    # The reverse projection is never scaled.
    hidden = rng.normal(size=(2, 5, DIM)).astype("float32")
    np.testing.assert_allclose(
        to_numpy(scaled(hidden, reverse=True)), to_numpy(plain(hidden, reverse=True)), rtol=1e-5
    )


@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (3,), (4, 20)],
                         ids=["few_rows", "one_row", "rank_2", "many_rows"])
def test_tied_reverse_projection_uses_the_transposed_embeddings(rng, shape):
    # Up to 64 rows (decoding) the layer multiplies the table first; beyond, the rows first.
    layer = make_layer(tie_weights=True)
    hidden = rng.normal(size=shape + (DIM,)).astype("float32")
    logits = to_numpy(layer(hidden, reverse=True))
    assert logits.shape == shape + (VOCAB,)
    np.testing.assert_allclose(logits, hidden @ to_numpy(layer.embeddings).T, rtol=1e-5, atol=1e-6)
    assert not hasattr(layer, "reverse_embeddings")


def test_untied_reverse_projection_uses_its_own_matrix(rng):
    layer = make_layer(tie_weights=False)
    hidden = rng.normal(size=(2, 5, DIM)).astype("float32")
    logits = to_numpy(layer(hidden, reverse=True))
    np.testing.assert_allclose(
        logits, hidden @ to_numpy(layer.reverse_embeddings), rtol=1e-5, atol=1e-6
    )
    tied = hidden @ to_numpy(layer.embeddings).T
    assert not np.allclose(logits, tied, atol=1e-3)


def test_tied_gradient_reaches_the_embeddings_through_both_uses(rng):
    # With tied weights the only matrix must move when only the reverse side gets a signal.
    hidden = keras.Input(shape=(5, DIM), name="hidden")
    layer = make_layer(tie_weights=True)
    model = keras.Model(hidden, layer(hidden, reverse=True))
    check_fit_step(model, [rng.normal(size=(2, 5, DIM)).astype("float32")])


@pytest.mark.parametrize("tie_weights", [True, False])
def test_fit_step(rng, tie_weights):
    layer = make_layer(tie_weights=tie_weights)
    model = language_model(layer)
    assert count_params(layer) == (1 if tie_weights else 2) * VOCAB * DIM
    before = [to_numpy(w).copy() for w in layer.trainable_weights]
    check_fit_step(model, [token_ids(rng)])
    after = [to_numpy(w) for w in layer.trainable_weights]
    # Every matrix trains: the embeddings, and the separate output matrix when untied.
    assert all(not np.allclose(b, a) for b, a in zip(before, after))


def test_fit_step_forward_only(rng):
    layer = make_layer(scale=True)
    check_fit_step(wrap_in_model(layer, [token_ids(rng)]), [token_ids(rng)])


@pytest.mark.parametrize("tie_weights", [True, False])
def test_saving(rng, tmp_path, tie_weights):
    model = language_model(make_layer(tie_weights=tie_weights, scale=True))
    loaded = check_saving(model, [token_ids(rng)], tmp_path)
    assert count_params(loaded) == count_params(model)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(rng, policy):
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    outputs = check_mixed_precision(make_layer, [token_ids(rng)], policy=policy)
    assert keras.backend.standardize_dtype(outputs.dtype) == compute_dtype
    hidden = rng.normal(size=(2, 5, DIM)).astype("float32")
    for tie_weights in (True, False):
        logits = check_mixed_precision(
            lambda **kw: make_layer(tie_weights=tie_weights, **kw),
            [hidden],
            call_kwargs={"reverse": True},
            policy=policy,
        )
        assert keras.backend.standardize_dtype(logits.dtype) == compute_dtype
        assert tuple(logits.shape) == (2, 5, VOCAB)


@xla_only
@pytest.mark.parametrize("tie_weights", [True, False])
def test_jit_compile(rng, tie_weights):
    check_jit_compile(language_model(make_layer(tie_weights=tie_weights)), [token_ids(rng)])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"vocabulary_size": 0}, "vocabulary_size=0"),
        ({"vocabulary_size": -3}, "vocabulary_size=-3"),
        ({"vocabulary_size": 2.5}, "vocabulary_size=2.5"),
        ({"vocabulary_size": True}, "vocabulary_size=True"),
        ({"embedding_dim": 0}, "embedding_dim=0"),
        ({"embedding_dim": -1}, "embedding_dim=-1"),
        ({"embedding_dim": 4.0}, "embedding_dim=4.0"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_layer(**kwargs)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: make_layer(embeddings_initializer="not_an_initializer"),
         "embeddings_initializer"),
        (lambda: make_layer(vocabulary_size=True), "vocabulary_size"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, dropout=1.5), "dropout"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, max_sequence_length=0),
         "max_sequence_length"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, embeddings_initializer=4),
         "embeddings_initializer"),
        (lambda: TokenAndPositionEmbedding(VOCAB, 0), "embedding_dim"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, normalization="batch_norm"),
         "normalization"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, normalization="layer_norm", epsilon=0),
         "epsilon"),
        (lambda: TokenAndPositionEmbedding(VOCAB, DIM, epsilon=-1e-5), "epsilon"),
    ],
)
def test_bad_constructor_arguments_raise(make, name):
    raises_naming(name, make)


@pytest.mark.parametrize("tie_weights", [True, False])
def test_bad_reverse_inputs_raise(rng, tie_weights):
    layer = make_layer(tie_weights=tie_weights)
    layer(token_ids(rng))
    hidden = rng.normal(size=(2, 5, DIM + 1)).astype("float32")
    raises_naming("inputs", lambda: layer(hidden, reverse=True))


@pytest.mark.parametrize("normalization", ["layer_norm", "rms_norm"])
def test_embedding_normalization_normalises_the_sum(rng, normalization):
    # e_j = Norm(x_j + PE(j)) (BLOOM's word_embeddings_layernorm, BERT's embedding norm).
    layer = TokenAndPositionEmbedding(VOCAB, DIM, position="learned", max_sequence_length=8,
                                      normalization=normalization, epsilon=1e-3)
    ids = token_ids(rng)
    layer.build(ids.shape)
    for weight in layer.norm.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    summed = (to_numpy(layer.token_embedding.embeddings)[ids]
              + to_numpy(layer.position_embedding.position_embeddings)[:5])
    if normalization == "layer_norm":
        centred = summed - summed.mean(-1, keepdims=True)
        expected = centred / np.sqrt(centred.var(-1, keepdims=True) + 1e-3)
        expected = expected * to_numpy(layer.norm.gamma) + to_numpy(layer.norm.beta)
    else:
        expected = summed / np.sqrt((summed**2).mean(-1, keepdims=True) + 1e-3)
        expected = expected * to_numpy(layer.norm.scale)
    np.testing.assert_allclose(to_numpy(layer(ids)), expected, rtol=1e-4, atol=1e-5)
    # Cached decoding: one token at a time gives the rows of the full pass.
    steps = [to_numpy(layer(ids[:, t:t + 1], start_index=t)) for t in range(5)]
    np.testing.assert_allclose(np.concatenate(steps, 1), expected, rtol=1e-4, atol=1e-5)
    # The reverse projection is not normalised.
    hidden = rng.normal(size=(2, 5, DIM)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(hidden, reverse=True)),
                               hidden @ to_numpy(layer.token_embedding.embeddings).T,
                               rtol=1e-5, atol=1e-5)


def test_embedding_normalization_config_saving_and_mixed_precision(rng, tmp_path):
    layer = TokenAndPositionEmbedding(VOCAB, DIM, position="none", normalization="layer_norm",
                                      epsilon=1e-6, name="embed")
    clone = check_config_round_trip(layer)
    assert clone.normalization == "layer_norm" and clone.epsilon == 1e-6
    assert clone.norm.epsilon == 1e-6
    assert TokenAndPositionEmbedding(VOCAB, DIM).get_config()["normalization"] is None
    ids = token_ids(rng)
    model = wrap_in_model(layer, [ids])
    assert count_params(layer) == VOCAB * DIM + 2 * DIM
    check_saving(model, [ids], tmp_path)
    check_fit_step(model, [ids])
    outputs = check_mixed_precision(
        lambda **kw: TokenAndPositionEmbedding(VOCAB, DIM, normalization="layer_norm", **kw),
        [ids], policy="mixed_bfloat16")
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"


# int8 / int4 quantisation: `q = round(E · s)` with `s_v = r / max|E_v|` (`r` = 127 or 7), so
# every dequantised entry is within half a step, `max|E_v| / 2r`, of the float one; that bound
# (not a loose tolerance) is what the lookup and the logits are checked against.
MODES = ["int8", "int4"]
RANGE = {"int8": 127, "int4": 7}


def quantised(tie_weights=True, rng=None, mode="int8", **kwargs):
    """A built layer with random tables and its float32 copies (table `[V, d]`, output matrix)."""
    layer = make_layer(tie_weights=tie_weights, **kwargs)
    layer.build((2, 5))
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    table = to_numpy(layer.embeddings).copy()
    output = table.T if tie_weights else to_numpy(layer.reverse_embeddings).copy()
    layer.quantize(mode)
    return layer, table, output


def half_step(matrix, axis, mode="int8"):
    return np.abs(matrix).max(axis=axis, keepdims=True) / (2 * RANGE[mode])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_quantised_variables_replace_the_float_tables(rng, tie_weights, mode):
    layer, table, output = quantised(tie_weights, rng, mode)
    policy = "int8_from_float32" if mode == "int8" else "int4/-1_from_float32"
    assert layer.quantization_mode == mode and layer.dtype_policy.name == policy
    assert layer.trainable_weights == []
    found = {w.name: (keras.backend.standardize_dtype(w.dtype), tuple(w.shape))
             for w in layer.weights}
    stored = DIM if mode == "int8" else (DIM + 1) // 2  # int4: two values per byte along d
    expected = {"embeddings": ("int8", (VOCAB, stored)),
                "embeddings_scale": ("float32", (VOCAB,))}
    if not tie_weights:
        expected.update(reverse_embeddings=("int8", (stored, VOCAB)),
                        reverse_embeddings_scale=("float32", (VOCAB,)))
    assert found == expected
    values, _ = quantization.abs_max_quantize(table, axis=-1, mode=mode)
    np.testing.assert_array_equal(to_numpy(layer._table("embeddings")), values)
    if not tie_weights:
        values, _ = quantization.abs_max_quantize(output, axis=0, mode=mode)
        np.testing.assert_array_equal(to_numpy(layer._table("reverse_embeddings")), values)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("shape", [(2, 5), (4, 20)], ids=["few_rows", "many_rows"])
def test_quantised_lookup_and_logits_stay_within_the_rounding_bound(rng, tie_weights, shape,
                                                                     mode):
    layer, table, output = quantised(tie_weights, rng, mode, scale=True)
    ids = rng.integers(0, VOCAB, size=shape).astype("int32")
    error = np.abs(to_numpy(layer(ids)) / np.sqrt(DIM) - table[ids])
    assert np.all(error <= half_step(table, -1, mode)[ids] * (1 + 1e-5) + 1e-7)
    assert error.max() > 0  # the table really is quantised
    # Both sizes: the decoding path (table first) and the batch path (rows first).
    hidden = rng.normal(size=shape + (DIM,)).astype("float32")
    logits = to_numpy(layer(hidden, reverse=True))
    bound = np.abs(hidden).sum(-1, keepdims=True) * half_step(output, 0, mode)
    assert np.all(np.abs(logits - hidden @ output) <= bound * (1 + 1e-5) + 1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tie_weights", [True, False], ids=["tied", "untied"])
def test_quantised_saving_keeps_the_integer_state(rng, tmp_path, tie_weights, mode):
    layer, _, _ = quantised(tie_weights, rng, mode, scale=True)
    model = language_model(layer)
    loaded = check_saving(model, [token_ids(rng)], tmp_path, atol=0)
    assert sorted(keras.backend.standardize_dtype(w.dtype) for w in loaded.weights) == \
        sorted(keras.backend.standardize_dtype(w.dtype) for w in model.weights)
    # Keras' order for (Reversible)Embedding: table, scale, then the untied matrix and scale.
    store = {}
    layer.save_own_variables(store)
    names = layer.variable_serialization_spec[mode]
    assert [tuple(store[str(i)].shape) for i in range(len(store))] == \
        [tuple(getattr(layer, name).shape) for name in names]
    assert names[:2] == ["embeddings", "embeddings_scale"] and len(store) == (2 if tie_weights else 4)


def test_float8_leaves_the_layer_with_a_warning():
    """Keras has no float8 embedding lookup: the table stays float32, with the warning that
    `Model.quantize` gives for Keras' `Embedding`."""
    layer = make_layer()
    layer.build((2, 5))
    with pytest.warns(UserWarning, match="mode=float8"):
        layer.quantize("float8")
    assert layer.quantization_mode is None
    assert keras.backend.standardize_dtype(layer.embeddings.dtype) == "float32"


def test_int8_under_bfloat16_compute(rng):
    layer = make_layer(dtype="mixed_bfloat16", tie_weights=False)
    layer.build((2, 5))
    layer.quantize("int8")
    assert layer.dtype_policy.name == "int8_from_mixed_bfloat16"
    hidden = layer(token_ids(rng))
    logits = layer(hidden, reverse=True)
    assert keras.backend.standardize_dtype(hidden.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"
    assert np.isfinite(to_numpy(keras.ops.cast(logits, "float32"))).all()


def test_int8_segment_table_keeps_its_scale_without_segment_ids(rng):
    # Without segment_ids every token gets segment 0's row: looked up through the int8 layer.
    layer = TokenAndPositionEmbedding(VOCAB, DIM, position="none", num_segments=2)
    ids = token_ids(rng)
    layer.build(ids.shape)
    expected = to_numpy(layer(ids))
    layer.segment_embedding.quantize("int8")
    layer.token_embedding.quantize("int8")
    np.testing.assert_allclose(to_numpy(layer(ids)), expected, atol=0.05 * np.abs(expected).max())
    np.testing.assert_allclose(to_numpy(layer(ids)),
                               to_numpy(layer(ids, segment_ids=np.zeros_like(ids))), atol=1e-6)
