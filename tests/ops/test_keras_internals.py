"""`keras_xf.ops.keras_internals`, each function against the installed Keras and keras-hub: the
one place where the library reaches past their public APIs, so an upgrade that moves what it
reaches fails here first."""

import json

import keras
import numpy as np
import pytest

from keras_xf.ops import keras_internals


class Block(keras.layers.Layer):
    def __init__(self, shared, **kwargs):
        super().__init__(**kwargs)
        self.shared = shared
        self.inner = keras.layers.Dense(2, name="inner")

    def call(self, x):
        return self.inner(self.shared(x))


class Nested(keras.layers.Layer):
    """A layer holding a `Dense`, and a block that holds the same `Dense` and one of its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.shared = keras.layers.Dense(3, name="shared")
        self.block = Block(self.shared, name="block")

    def call(self, x):
        return self.block(x)


def test_sublayers_walks_every_level_once():
    layer = Nested()
    layer(np.zeros((1, 4), "float32"))
    found = keras_internals.sublayers(layer)
    names = [sub.name for sub in found]
    assert sorted(names) == ["block", "inner", "shared"], names
    assert keras_internals.sublayers(layer, include_self=True)[0] is layer
    assert len(keras_internals.sublayers(layer, include_self=True)) == 4


def _deferred_dense():
    """A built `Dense` whose variables hold no value (created in a stateless scope)."""
    with keras.StatelessScope(initialize_variables=False):
        dense = keras.layers.Dense(3, kernel_initializer="ones", bias_initializer="zeros")
        dense.build((None, 2))
    return dense


def test_deferred_variables_take_values_given_or_their_initializers():
    keras_internals.take_deferred_variables()  # whatever an earlier test left behind
    dense = _deferred_dense()
    assert not keras_internals.holds_value(dense.kernel)
    assert not keras_internals.holds_value(dense.bias)
    pending = keras_internals.take_deferred_variables()
    assert {id(v) for v in pending} == {id(dense.kernel), id(dense.bias)}
    assert keras_internals.take_deferred_variables() == []  # the list is emptied

    value = np.arange(6, dtype="float32").reshape(2, 3)
    keras_internals.initialize_deferred(dense.kernel, value)
    keras_internals.initialize_deferred(dense.bias)
    assert keras_internals.holds_value(dense.kernel) and keras_internals.holds_value(dense.bias)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense.kernel), value)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(dense.bias), np.zeros(3))


def test_an_eager_variable_holds_its_value():
    variable = keras.Variable(np.ones((2,), "float32"))
    assert keras_internals.holds_value(variable)


def test_scale_loss_for_distribution_leaves_a_loss_alone_without_a_strategy():
    loss = keras.ops.convert_to_tensor(3.5)
    scaled = keras_internals.scale_loss_for_distribution(loss)
    assert float(keras.ops.convert_to_numpy(scaled)) == 3.5


def test_keras_hub_exporter_writes_an_untied_lm_head(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    classes = keras_internals.keras_hub_exported_backbones()
    models = keras_hub.models
    assert {models.GPT2Backbone, models.Llama3Backbone, models.GemmaBackbone} <= classes
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=11, num_layers=1, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=8, intermediate_dim=12)
    keras_internals.export_keras_hub_backbone(backbone, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    tensors = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    np.testing.assert_allclose(
        tensors["lm_head.weight"],
        keras.ops.convert_to_numpy(backbone.token_embedding.reverse_embeddings).T)
