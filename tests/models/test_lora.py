"""LoRA on keras_xf models (`enable_lora`, `save_lora_weights`, `load_lora_weights`): only
the adapters train, `fit` lowers the loss, a `.keras` file keeps the adapters, adapter files
hold only `A` and `B`, mixtures of experts get per-expert adapters, and quantisation and
export work on a LoRA model."""

import warnings

import h5py
import keras
import numpy as np
import pytest

from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TokenEmbedding
from keras_xf.layers import TransformerBlock
from keras_xf.layers.feedforward.expert_weights import ExpertWeights
from keras_xf.layers.lora.adapters import has_lora
from keras_xf.layers.lora.lora_einsum_dense import LoRAEinsumDense
from keras_xf.training import ChunkedCrossEntropy
from tests.layer_checks import value_and_gradients
from tests.layers.bad_inputs import raises_naming
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import causal_lm
from tests.models.tiny import token_batch

BACKEND = keras.config.backend()
ALL = ["query", "key", "value", "attention_output", "ffn_hidden", "ffn_output"]


def moe_causal_lm():
    block = TransformerBlock(
        MultiHeadAttention(HEADS),
        MixtureOfExperts(4, FFN, top_k=2, activation="swiglu", capacity_factor=None),
        norm_placement="pre")
    return causal_lm(num_layers=1, block=block)


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = token_batch(rng)
    return x, rng.integers(1, VOCAB, size=x["token_ids"].shape).astype("int32")


def logits(model, x):
    return np.asarray(model.predict(x, verbose=0))


def trained(model, targets, epochs=3):
    model.enable_lora(2, alpha=4, targets=targets)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    x, y = data()
    model.fit(x, y, epochs=epochs, verbose=0)
    return model


def test_only_the_adapters_train_and_the_model_starts_unchanged():
    model = causal_lm(num_layers=1)
    x, _ = data()
    before = logits(model, x)
    model.enable_lora(2, targets=ALL)
    np.testing.assert_allclose(logits(model, x), before, atol=1e-5)
    names = {v.path.rsplit("/", 1)[-1] for v in model.trainable_variables}
    assert names == {"lora_kernel_a", "lora_kernel_b"}
    # d=16, H=2, Dh=8, f=32, r=2: query/key/value A [16, 2] + B [2, 2, 8] (the update of the
    # [16, 16] matrix, as PEFT's); output A [2, 8, 2] + B [2, 16]; ffn hidden A [16, 2] +
    # B [2, 32]; ffn output A [32, 2] + B [2, 16].
    expected = 3 * (32 + 32) + (32 + 32) + (32 + 64) + (64 + 32)
    assert sum(int(np.prod(v.shape)) for v in model.trainable_variables) == expected
    assert model.lora_settings == {"rank": 2, "alpha": 2, "targets": ALL}


@pytest.mark.parametrize("factory, targets", [
    (lambda: causal_lm(num_layers=1), ALL),
    (moe_causal_lm, ["query", "value", "expert_in", "expert_gate", "expert_out"]),
])
def test_fit_lowers_the_loss(factory, targets):
    model = factory()
    model.enable_lora(4, alpha=8, targets=targets)
    frozen = {v.path: np.array(v) for v in model.variables if "lora" not in v.path
              and v.dtype != "int64"}
    model.compile(optimizer=keras.optimizers.Adam(3e-2))
    x, y = data()
    history = model.fit(x, y, epochs=6, verbose=0).history["loss"]
    assert history[-1] < history[0] - 0.05, history
    kernels = [v for v in model.variables if v.path.endswith(("kernel", "embeddings"))]
    for variable in kernels:  # the base weights did not move
        np.testing.assert_array_equal(np.array(variable), frozen[variable.path])


@pytest.mark.parametrize("arguments, message", [
    (dict(rank=0), "rank must be a positive int. Received: rank=0"),
    (dict(rank=2, alpha=-1.0), "alpha must be a positive number. Received: alpha=-1.0"),
    (dict(rank=2, targets=["query", "qproj"]), "Received: targets=['query', 'qproj']"),
    (dict(rank=2, targets=["ffn_gate"]), "does not have: ['ffn_gate']"),
    (dict(rank=2, targets=["expert_in"]), "does not have: ['expert_in']"),
])
def test_bad_arguments_raise_value_errors(arguments, message):
    model = causal_lm(num_layers=1)
    with pytest.raises(ValueError) as error:
        model.enable_lora(**arguments)
    assert message in str(error.value)
    assert not model.lora_settings


def test_frozen_layers_and_a_second_call_are_refused():
    model = causal_lm(num_layers=1)
    model.backbone.trainable = False
    with pytest.raises(ValueError, match="target layers must be trainable"):
        model.enable_lora(2)
    model = causal_lm(num_layers=1)
    model.enable_lora(2)
    with pytest.raises(ValueError, match="LoRA is already enabled"):
        model.enable_lora(2)


@pytest.mark.parametrize("factory, targets", [
    (lambda: causal_lm(num_layers=1), ALL),
    (moe_causal_lm, ["value", "expert_in", "expert_out"]),
])
def test_keras_file_keeps_the_adapters(factory, targets, tmp_path):
    model = trained(factory(), targets)
    x, y = data()
    path = str(tmp_path / "lora.keras")
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras.saving.load_model(path)
    assert not [w for w in caught if "optimizer" in str(w.message)]
    np.testing.assert_allclose(logits(loaded, x), logits(model, x), atol=1e-5)
    assert loaded.lora_settings == model.lora_settings
    assert [v.path.rsplit("/", 1)[-1] for v in loaded.trainable_variables] == \
        [v.path.rsplit("/", 1)[-1] for v in model.trainable_variables]
    for mine, theirs in zip(model.trainable_variables, loaded.trainable_variables):
        np.testing.assert_array_equal(np.array(theirs), np.array(mine))  # unmerged adapters
    assert any(np.abs(np.array(v)).max() > 0 for v in loaded.trainable_variables
               if v.path.endswith("lora_kernel_b"))
    before = loaded.evaluate(x, y, verbose=0)
    loaded.fit(x, y, epochs=2, verbose=0)  # the reloaded adapters still learn
    assert loaded.evaluate(x, y, verbose=0) < before


def test_adapter_files_hold_only_the_adapters(tmp_path):
    model = trained(causal_lm(num_layers=1), ["query", "value", "ffn_hidden"])
    path = str(tmp_path / "adapters.lora.h5")
    model.save_lora_weights(path)
    with h5py.File(path, "r") as file:
        keys = []
        file.visititems(lambda name, item: keys.append(name)
                        if isinstance(item, h5py.Dataset) else None)
    assert len(keys) == 2 * 3 and all(k.endswith(("lora_kernel_a", "lora_kernel_b"))
                                      for k in keys)
    # A fresh model of the same base weights, without LoRA, takes the file's settings.
    other = causal_lm(num_layers=1)
    other.set_weights([np.array(v) for v in model.weights if "lora" not in v.path])
    other.load_lora_weights(path)
    assert other.lora_settings == model.lora_settings
    x, _ = data()
    np.testing.assert_allclose(logits(other, x), logits(model, x), atol=1e-5)


def test_adapter_file_errors(tmp_path):
    model = causal_lm(num_layers=1)
    with pytest.raises(ValueError, match="call enable_lora first"):
        model.save_lora_weights(str(tmp_path / "a.lora.h5"))
    model.enable_lora(2)
    with pytest.raises(ValueError, match=r"filepath must end in '.lora.h5'. Received"):
        model.save_lora_weights(str(tmp_path / "a.h5"))
    path = str(tmp_path / "a.lora.h5")
    model.save_lora_weights(path)
    other = causal_lm(num_layers=1)
    other.enable_lora(4)
    with pytest.raises(ValueError, match="were saved with"):
        other.load_lora_weights(path)
    deeper = causal_lm(num_layers=2)
    with pytest.raises(ValueError, match="lacks"):
        deeper.load_lora_weights(path)


@pytest.mark.parametrize("make, inputs, frozen", [
    (lambda: LoRAEinsumDense("btd,dhk->bthk", output_shape=(None, 2, 4)),
     np.ones((1, 3, 6), "float32"), "kernel"),
    (lambda: ExpertWeights(num_experts=2, units=4), np.ones((2, 3, 6), "float32"),
     "expert_kernel"),
    (lambda: TokenEmbedding(10, 6, tie_weights=False), np.array([[1, 2, 3]]),
     "reverse_embeddings"),
], ids=["einsum_dense", "expert_weights", "token_embedding"])
def test_layers_with_their_own_adapters_check_and_add_them_alike(make, inputs, frozen):
    layer = make()
    with pytest.raises(ValueError, match=r"before it is built .*Received: built=False"):
        layer.enable_lora(2)
    layer(inputs)
    assert "rank=0" in raises_naming("rank", lambda: layer.enable_lora(0))
    assert "lora_alpha=-1.0" in raises_naming("lora_alpha",
                                              lambda: layer.enable_lora(2, lora_alpha=-1.0))
    assert not has_lora(layer)
    layer.enable_lora(2)
    assert has_lora(layer) and (layer.lora_rank, layer.lora_alpha) == (2, 2)
    assert [v.dtype for v in (layer.lora_kernel_a, layer.lora_kernel_b)] == ["float32"] * 2
    trainable = {v.name for v in layer.trainable_variables}
    assert {"lora_kernel_a", "lora_kernel_b"} <= trainable and frozen not in trainable
    with pytest.raises(ValueError, match="LoRA is already enabled on .*Received: rank=3"):
        layer.enable_lora(3)


def test_head_projection_lora_is_the_update_of_the_flattened_matrix():
    rng = np.random.default_rng(2)
    inputs = rng.normal(size=(2, 3, 6)).astype("float32")
    dense = LoRAEinsumDense("btd,dhk->bthk", output_shape=(None, 2, 4), bias_axes="hk")
    dense(inputs)
    base = keras.ops.convert_to_numpy(dense.kernel)
    dense.enable_lora(3, lora_alpha=6)
    dense.lora_kernel_b.assign(rng.normal(size=(3, 2, 4)).astype("float32"))
    flat = np.array(dense.lora_kernel_a) @ np.array(dense.lora_kernel_b).reshape(3, 8)
    merged = base + 2.0 * flat.reshape(6, 2, 4)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(dense.kernel), merged, atol=1e-5)
    expected = np.einsum("btd,dhk->bthk", inputs, merged) + np.array(dense.bias)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(dense(inputs)), expected, atol=1e-4)
    dense.quantize("int8")  # the int8 product plus the float update
    np.testing.assert_allclose(keras.ops.convert_to_numpy(dense(inputs)), expected, atol=0.05)
    with pytest.raises(ValueError, match="LoRA is already enabled on"):
        dense.enable_lora(2)


def test_expert_weights_lora_equals_the_merged_kernel():
    rng = np.random.default_rng(1)
    layer = ExpertWeights(num_experts=3, units=5)
    inputs = rng.normal(size=(3, 4, 6)).astype("float32")
    layer(inputs)
    layer.enable_lora(2, lora_alpha=3)
    layer.lora_kernel_b.assign(rng.normal(size=(3, 2, 5)).astype("float32"))
    kernel = np.array(layer.expert_kernel)
    merged = kernel + 1.5 * np.array(layer.lora_kernel_a) @ np.array(layer.lora_kernel_b)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer.kernel), merged, rtol=1e-5, atol=1e-5)
    expected = np.einsum("grd,gdf->grf", inputs, merged) + np.array(layer.expert_bias)[:, None]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(inputs)), expected, rtol=1e-4, atol=1e-4)
    index = np.array([2, 0, 2], "int32")
    expected = np.einsum("grd,gdf->grf", inputs, merged[index]) + \
        np.array(layer.expert_bias)[index][:, None]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(inputs, expert_index=index)), expected,
                               rtol=1e-4, atol=1e-4)
    assert [v.name for v in layer.trainable_variables] == ["expert_bias", "lora_kernel_a",
                                                           "lora_kernel_b"]
    with pytest.raises(ValueError, match="rank must be a positive int. Received: rank=0"):
        ExpertWeights(2, 3).enable_lora(0)


def test_quantize_keeps_float_adapters_over_an_int8_base(tmp_path):
    model = trained(causal_lm(num_layers=1), ["query", "value", "ffn_hidden"])
    x, y = data()
    before = logits(model, x)
    adapters = [np.array(v) for v in model.trainable_variables]
    model.quantize("int8")
    assert model.backbone.transformer_stack.blocks[0].feedforward.hidden_dense \
        .quantization_mode == "int8"
    np.testing.assert_allclose(logits(model, x), before, atol=0.05)
    assert [np.array(v) for v in model.trainable_variables if "lora" in v.path][0].shape == \
        adapters[0].shape
    assert {v.path.rsplit("/", 1)[-1] for v in model.trainable_variables} == \
        {"lora_kernel_a", "lora_kernel_b"}
    path = str(tmp_path / "qlora.keras")
    model.save(path)
    np.testing.assert_allclose(logits(keras.saving.load_model(path), x), logits(model, x),
                               atol=1e-5)


@pytest.mark.skipif(BACKEND == "torch", reason="Keras exports SavedModels from torch only "
                    "through torch_xla; the torch test below uses torch.export")
def test_export_saved_model_serves_the_lora_logits(tmp_path):
    import tensorflow as tf

    model = trained(causal_lm(num_layers=1), ["query", "value"])
    x, _ = data()
    path = str(tmp_path / "saved_model")
    model.export(path, verbose=False)
    artefact = tf.saved_model.load(path)  # held: its functions reference its variables
    served = artefact.serve({name: tf.constant(value) for name, value in x.items()})
    np.testing.assert_allclose(np.asarray(served), logits(model, x), atol=1e-4)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.export is the PyTorch backend's format")
def test_torch_export_serves_the_lora_logits(tmp_path):
    import torch

    model = trained(causal_lm(num_layers=1), ["query", "value"])
    x, _ = data()
    path = str(tmp_path / "model.pt2")
    model.export(path, format="torch")
    module = torch.export.load(path).module()
    with torch.no_grad():
        served = module({name: torch.from_numpy(value) for name, value in x.items()})
    np.testing.assert_allclose(served.detach().numpy(), logits(model, x), atol=1e-4)


def test_structured_pruning_refuses_head_projections_with_adapters():
    from keras_xf.surgery import prune_structure

    model = causal_lm(num_layers=1)
    model.enable_lora(2, targets=["query"])
    with pytest.raises(ValueError, match="LoRA-enabled or quantised projection"):
        prune_structure(model, heads=[[0]])


def test_backbone_lora_round_trips_in_the_task_and_generates(tmp_path):
    model = causal_lm(num_layers=1)
    model.backbone.enable_lora(2, targets=["query", "value", "ffn_output"])
    assert model.lora_settings is None and model.backbone.lora_settings["rank"] == 2
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    x, y = data()
    model.fit(x, y, epochs=2, verbose=0)
    path = str(tmp_path / "task.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(logits(loaded, x), logits(model, x), atol=1e-5)
    # Greedy generation decodes with the adapters: its first new token is the argmax of
    # the full forward pass at the prompt's last position.
    prompts = np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 0, 0]], "int32")
    generated = model.generate({"token_ids": prompts, "padding_mask": prompts != 0},
                               max_length=6, stop_token_ids=None, sampler="greedy")
    full = logits(model, {"token_ids": prompts, "padding_mask": (prompts != 0).astype("int32")})
    np.testing.assert_array_equal(generated["token_ids"][[0, 1], [3, 4]],
                                  full[[0, 1], [2, 3]].argmax(-1))


def test_output_head_adapters_train_save_and_merge(tmp_path):
    model = causal_lm(num_layers=1, tie_embeddings=False)
    x, y = data()
    before = logits(model, x)
    model.enable_lora(2, alpha=4, targets=["output_head"])
    embedding = model.backbone.embeddings.token_embedding
    assert [v.path.rsplit("/", 1)[-1] for v in model.trainable_variables] == \
        ["lora_kernel_a", "lora_kernel_b"]
    np.testing.assert_allclose(logits(model, x), before, atol=1e-5)
    model.compile(optimizer=keras.optimizers.Adam(3e-2))
    history = model.fit(x, y, epochs=4, verbose=0).history["loss"]
    assert history[-1] < history[0]
    merged = keras.ops.convert_to_numpy(embedding.reverse_embeddings) + 2.0 * (
        keras.ops.convert_to_numpy(embedding.lora_kernel_a)
        @ keras.ops.convert_to_numpy(embedding.lora_kernel_b))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(embedding.reverse_kernel), merged,
                               atol=1e-5)
    path = str(tmp_path / "head.keras")
    model.save(path)
    np.testing.assert_allclose(logits(keras.saving.load_model(path), x), logits(model, x),
                               atol=1e-5)
    with pytest.raises(ValueError, match="tied to the token table takes no adapters"):
        causal_lm(num_layers=1).enable_lora(2, targets=["output_head"])


def float_shapes_kept_for_backward(function, inputs):
    """The shapes of the floating-point tensors that automatic differentiation keeps from
    the forward pass of `function(*inputs)` for its backward pass: PyTorch's saved tensors,
    JAX's residuals of `jax.vjp`, and on TensorFlow the forward tensors that the gradient
    ops of a traced `tf.function` read."""
    if BACKEND == "torch":
        import torch

        shapes = set()

        def pack(tensor):
            if tensor.is_floating_point():
                shapes.add(tuple(tensor.shape))
            return tensor

        tensors = [torch.tensor(x, requires_grad=True) for x in inputs]
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            function(*tensors)
        return shapes
    if BACKEND == "jax":
        import jax

        _, backward = jax.vjp(function, *inputs)
        return {tuple(leaf.shape) for leaf in jax.tree_util.tree_leaves(backward)
                if jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating)}
    import tensorflow as tf

    @tf.function
    def step(*tensors):
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            value = function(*tensors)
        return tape.gradient(value, tensors)

    graph = step.get_concrete_function(*[tf.TensorSpec(x.shape, x.dtype) for x in inputs]).graph
    backward = [op for op in graph.get_operations() if op.name.startswith("gradient_tape/")]
    return {tuple(t.shape) for op in backward for t in op.inputs
            if t.dtype.is_floating and not t.op.name.startswith("gradient_tape/")}


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("tie_embeddings", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("shape", [(2, 8), (4, 20)], ids=["few_rows", "many_rows"])
def test_quantised_head_trains_without_a_float_copy_of_its_table(mode, tie_embeddings, shape):
    # A frozen quantised output head passes the gradient of the logits to the hidden states
    # (towards the adapters below it) as its dequantised table does, and its backward pass
    # dequantises the table again: no float `[V, d]` copy is kept from the forward pass.
    model = causal_lm(num_layers=1, tie_embeddings=tie_embeddings)
    model.quantize(mode)
    model.enable_lora(2)
    embedding = model.backbone.embeddings.token_embedding
    table = keras.ops.convert_to_numpy(embedding.output_table())
    assert table.shape == (VOCAB, WIDTH) and table.dtype == np.float32
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=shape + (WIDTH,)).astype("float32")
    weights = keras.ops.convert_to_tensor(rng.normal(size=shape + (VOCAB,)).astype("float32"))

    def weighted_logits(h):
        return keras.ops.sum(embedding(h, reverse=True) * weights)

    value, (gradient,) = value_and_gradients(weighted_logits, [hidden])
    np.testing.assert_allclose(value, np.sum((hidden @ table.T) * np.asarray(weights)),
                               rtol=1e-4)
    np.testing.assert_allclose(gradient, np.asarray(weights) @ table, rtol=1e-4, atol=1e-5)
    kept = float_shapes_kept_for_backward(weighted_logits, [hidden])
    assert not kept & {table.shape, table.shape[::-1]}, kept


@pytest.mark.parametrize("tie_embeddings, targets", [
    (True, ["query", "value", "ffn_hidden"]),
    (False, ["query", "value", "ffn_hidden"]),
    (False, ["query", "value", "output_head"]),
], ids=["tied", "untied", "untied_with_head_adapters"])
def test_chunked_loss_of_a_quantised_base_is_the_plain_loss(tie_embeddings, targets):
    # `ChunkedCrossEntropy` forms the logits from `output_table()`: the dequantised table
    # (with the head's adapters), not the integer values.
    model = causal_lm(num_layers=1, tie_embeddings=tie_embeddings)
    model.quantize("int8")
    model.enable_lora(4, alpha=8, targets=targets)
    x, y = data()
    def losses():  # plain, then chunked (the model stays compiled with it)
        values = []
        for loss in ("auto", ChunkedCrossEntropy(16)):
            model.compile(optimizer=keras.optimizers.Adam(3e-2), loss=loss, weighted_metrics=[])
            values.append(model.evaluate(x, y, verbose=0))
        return values

    np.testing.assert_allclose(*losses(), rtol=1e-5)
    history = model.fit(x, y, epochs=6, verbose=0).history["loss"]  # chunked
    assert history[-1] < history[0] - 0.05, history
    np.testing.assert_allclose(*losses(), rtol=1e-5)
