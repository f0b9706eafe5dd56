"""Behaviour checks shared by every layer's tests: config, weights, fit, saving, precision, XLA.

Each check takes a `make_layer(**kwargs)` factory and concrete numpy inputs so that the same
check runs unchanged on TensorFlow, JAX and PyTorch.
"""

import keras
import numpy as np
import pytest

BACKEND = keras.config.backend()

xla_only = pytest.mark.skipif(
    BACKEND not in ("tensorflow", "jax"),
    reason="XLA compilation (jit_compile=True) exists in Keras for TensorFlow and JAX only; "
    "on PyTorch Keras maps jit_compile to torch.compile, which is not XLA",
)


def to_numpy(x):
    """A tensor as numpy; a tuple (a cache pair) as a tuple of arrays."""
    if isinstance(x, tuple):
        return tuple(to_numpy(part) for part in x)
    return keras.ops.convert_to_numpy(x)


def value_and_gradients(function, inputs, jit_compile=True):
    """`function(*inputs)` (a scalar) and its gradients with respect to every input: under
    `jax.jit` on JAX, in a `tf.function` (XLA or not) on TensorFlow, eager on PyTorch."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        step = jax.value_and_grad(function, argnums=tuple(range(len(inputs))))
        value, grads = (jax.jit(step) if jit_compile else step)(*inputs)
    elif backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=jit_compile)
        def step(*tensors):
            with tf.GradientTape() as tape:
                tape.watch(tensors)
                value = function(*tensors)
            return value, tape.gradient(value, tensors)

        value, grads = step(*[tf.constant(x) for x in inputs])
    else:
        import torch

        tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
        value = function(*tensors)
        value.backward()
        grads = [t.grad for t in tensors]
    return to_numpy(value), [to_numpy(g) for g in grads]


def wrap_in_model(layer, inputs, call_kwargs=None):
    """A functional model `inputs -> layer(*inputs, **call_kwargs)`.

    `inputs` is a list of numpy arrays (positional inputs); a dict entry in `call_kwargs`
    whose value is a numpy array becomes a named model input too.
    """
    call_kwargs = dict(call_kwargs or {})
    symbolic = [
        keras.Input(shape=x.shape[1:], dtype=str(x.dtype), name=f"input_{i}")
        for i, x in enumerate(inputs)
    ]
    named = {}
    for key, value in list(call_kwargs.items()):
        if isinstance(value, np.ndarray):
            named[key] = keras.Input(shape=value.shape[1:], dtype=str(value.dtype), name=key)
            call_kwargs[key] = named[key]
    outputs = layer(*symbolic, **call_kwargs)
    model = keras.Model(symbolic + list(named.values()), outputs)
    return model


def model_inputs(inputs, call_kwargs=None):
    arrays = list(inputs)
    arrays += [v for v in (call_kwargs or {}).values() if isinstance(v, np.ndarray)]
    return arrays


def check_config_round_trip(layer):
    """`from_config(get_config())` rebuilds a layer with the same config, through JSON."""
    config = layer.get_config()
    serialized = keras.saving.serialize_keras_object(layer)
    clone = keras.saving.deserialize_keras_object(serialized)
    assert type(clone) is type(layer)
    assert clone.get_config() == config
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    return clone


def check_fit_step(model, inputs, learning_rate=0.1):
    """One SGD step of `fit` on an MSE loss changes the weights and gives a finite loss."""
    outputs = model.predict(inputs, verbose=0)
    targets = keras.tree.map_structure(lambda o: np.zeros_like(o, dtype="float32") + 0.5, outputs)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    history = model.fit(inputs, targets, epochs=1, batch_size=len(inputs[0]), verbose=0)
    loss = history.history["loss"][-1]
    assert np.isfinite(loss)
    after = [to_numpy(w) for w in model.trainable_weights]
    assert any(not np.allclose(b, a) for b, a in zip(before, after)), "fit changed no weight"
    return loss


def check_saving(model, inputs, tmp_path, atol=1e-6):
    """A `.keras` round trip (loaded with safe_mode=True) gives identical outputs."""
    path = str(tmp_path / "model.keras")
    expected = model.predict(inputs, verbose=0)
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    actual = loaded.predict(inputs, verbose=0)
    keras.tree.map_structure(
        lambda e, a: np.testing.assert_allclose(a, e, atol=atol, rtol=1e-5), expected, actual
    )
    return loaded


def check_mixed_precision(make_layer, inputs, call_kwargs=None, policy="mixed_float16"):
    """Under a mixed policy the layer computes in half precision, keeps float32 variables,
    and gives finite outputs."""
    layer = make_layer(dtype=policy)
    outputs = layer(*inputs, **(call_kwargs or {}))
    compute_dtype = keras.DTypePolicy(policy).compute_dtype
    if isinstance(outputs, dict):
        first = outputs["outputs"]
    else:
        first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    assert keras.backend.standardize_dtype(first.dtype) in (compute_dtype, "float32")
    for variable in layer.weights:
        assert keras.backend.standardize_dtype(variable.dtype) == "float32", variable.path
    # Sub-layers a layer declares float32 (a router's gate) keep the float32 policy.
    float32 = {id(getattr(owner, name)) for owner in layer._flatten_layers()
               for name in getattr(owner, "float32_sublayers", ())}
    for sub in layer._flatten_layers(include_self=False):
        if sub.weights:
            expected = "float32" if id(sub) in float32 else policy
            assert sub.dtype_policy.name == expected, (sub.name, sub.dtype_policy.name)
    for out in keras.tree.flatten(outputs):
        assert np.all(np.isfinite(to_numpy(out).astype("float32")))
    return outputs


def check_jit_compile(model, inputs):
    """Prediction and one training step compile under XLA and match eager prediction."""
    expected = model.predict(inputs, verbose=0)
    outputs = model.predict(inputs, verbose=0)
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    compiled = model.predict(inputs, verbose=0)
    keras.tree.map_structure(
        lambda e, a: np.testing.assert_allclose(a, e, atol=1e-5, rtol=1e-4), expected, compiled
    )
    targets = keras.tree.map_structure(np.zeros_like, outputs)
    history = model.fit(inputs, targets, epochs=1, batch_size=len(inputs[0]), verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def count_params(layer):
    return int(sum(np.prod(w.shape) for w in layer.weights))


def split_scores(results, cache=False):
    """`(outputs, attention_scores)` (then the new cache when `cache`) from the one dict that
    a layer returns with `return_attention_scores=True`, checking its keys."""
    expected = {"outputs", "attention_scores"} | ({"cache"} if cache else set())
    assert isinstance(results, dict) and set(results) == expected, (type(results), results)
    parts = (results["outputs"], results["attention_scores"])
    return parts + (results["cache"],) if cache else parts


def to_float64(x):
    """A tensor as a float64 numpy array, for comparisons with the numpy references."""
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def padding_mask(lengths, length):
    """A boolean `[batch, length]` mask, true at the first `lengths[b]` positions of row `b`."""
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def random_normal(rng, shape):
    """Standard-normal float32 inputs of `shape`."""
    return rng.normal(size=shape).astype("float32")


def randomize_weights(layer, rng, scale=0.3):
    """Every weight of `layer` drawn from `N(0, scale²)`, so that no term is near zero."""
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * scale)


def attention_weights(layer):
    """The projections of a `MultiHeadAttention` as float64 arrays: `wq`, `wk`, `wv`, `wo`
    (and `bq`, `bk`, `bv`, `bo` with `use_bias`), the arguments of the numpy reference."""
    denses = {"q": layer.query_dense, "k": layer.key_dense, "v": layer.value_dense,
              "o": layer.output_dense}
    weights = {f"w{key}": dense.kernel for key, dense in denses.items()}
    if layer.use_bias:
        weights.update({f"b{key}": dense.bias for key, dense in denses.items()})
    return {key: to_float64(value) for key, value in weights.items()}


def decode_stepwise(layer, x, cache, prefill=1, step_arguments=None, **call_kwargs):
    """A causal cached pass over `x` as a generation loop runs it: positions `[0, prefill)`
    in one call, then one position a call. `step_arguments(start, stop)` gives the call
    arguments that cover positions `[start, stop)` (slices of an attention bias, ...).

    Returns the outputs of every call joined along the sequence (numpy) and the last cache.
    """
    outputs = []
    bounds = [(0, prefill)] + [(index, index + 1) for index in range(prefill, x.shape[1])]
    for start, stop in bounds:
        extra = step_arguments(start, stop) if step_arguments else {}
        out, cache = layer(x[:, start:stop], use_causal_mask=True, cache=cache,
                           cache_index=start, **call_kwargs, **extra)
        outputs.append(to_numpy(out))
    return np.concatenate(outputs, axis=1), cache


def check_cached_decoding(layer, x, prefill=2, cache_length=None, atol=1e-5, rtol=1e-5):
    """A prefill of `prefill` positions, then one position a call (`decode_stepwise`), gives
    the outputs of the full causal pass. The cache holds `cache_length` positions (the
    length of `x` by default)."""
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = layer.init_cache(x.shape[0], cache_length or x.shape[1])
    steps, _ = decode_stepwise(layer, x, cache, prefill)
    np.testing.assert_allclose(steps, full, atol=atol, rtol=rtol)
