"""Every model trains under mixed_float16 and mixed_bfloat16; a CausalLM under XLA.

Keras compiles `fit` with XLA by default on JAX (so every fit of the suite runs under XLA
there); on a CPU-only TensorFlow it does not, so jit_compile=True is asked for explicitly.
"""

import keras
import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqLM
from keras_xf.models import TextClassifier
from tests.layer_checks import xla_only
from tests.models.tiny import batch_for
from tests.models.tiny import causal_lm
from tests.models.tiny import dtype_name
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import text_encoder
from tests.layer_checks import to_numpy

STEPS, BATCH = 20, 2

FACTORIES = {
    "causal_lm": lambda **kw: causal_lm(num_layers=1, position="rotary", **kw),
    "seq2seq_lm": lambda **kw: seq2seq_lm(**kw),
    "text_encoder": lambda **kw: text_encoder(projection_dim=8, **kw),
    "text_classifier": lambda **kw: text_classifier(**kw),
}


def training_data(model, rng):
    """`STEPS` batches of `BATCH` examples (one epoch of `STEPS` steps)."""
    x, y = batch_for(model, rng, batch=BATCH * STEPS)
    return x, y


def compile_model(model, **kwargs):
    # SGD: the precision is the point, and Adam's slots cost a second or two of tracing.
    optimizer = keras.optimizers.SGD(1e-2)
    if isinstance(model, (CausalLM, Seq2SeqLM, TextClassifier)):
        model.compile(optimizer=optimizer, **kwargs)  # the task's default loss
    else:
        model.compile(optimizer=optimizer, loss="mse", **kwargs)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_trains_under_mixed_precision(rng, name, policy):
    model = FACTORIES[name](dtype=policy)
    half = keras.DTypePolicy(policy).compute_dtype
    assert model.dtype_policy.name == policy
    for layer in model._flatten_layers(include_self=False):
        if layer.weights:
            assert layer.compute_dtype == half, (layer.name, layer.dtype_policy.name)
    assert all(dtype_name(w) == "float32" for w in model.weights)
    x, y = training_data(model, rng)
    compile_model(model)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    else:
        assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    # Dynamic loss scaling skips the steps whose scaled gradients overflow (the first ones,
    # while the scale comes down from 2**15); the others are applied.
    applied = int(to_numpy(model.optimizer.iterations))
    assert applied == STEPS if policy == "mixed_bfloat16" else STEPS // 2 <= applied <= STEPS
    assert np.isfinite(history.history["loss"][0])
    assert dtype_name(model.outputs[0]) == "float32"  # float32 logits / embeddings
    assert all(dtype_name(w) == "float32" for w in model.weights)
    assert all(np.isfinite(to_numpy(w)).all() for w in model.trainable_weights)


def test_global_policy_reaches_every_layer():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = causal_lm(num_layers=1)
    assert model.dtype_policy.name == "mixed_bfloat16"
    layers = [l for l in model._flatten_layers(include_self=False) if l.weights]
    assert layers and all(l.dtype_policy.name == "mixed_bfloat16" for l in layers)
    # Symbolic outputs: bfloat16 hidden states, float32 logits.
    assert dtype_name(model.backbone.outputs[0]) == "bfloat16"
    assert dtype_name(model.outputs[0]) == "float32"


@xla_only
def test_causal_lm_fits_under_xla(rng):
    # One model: XLA compiles of a train step are slow on TensorFlow; Seq2SeqLM runs under XLA
    # in its generation tests (TensorFlow) and in every fit (JAX).
    model = FACTORIES["causal_lm"]()
    x, y = batch_for(model, rng, batch=4 * BATCH)
    compile_model(model, jit_compile=True)
    assert model.jit_compile is True
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
