"""Runs keras_xf models under `keras.distribution` on 8 virtual CPU devices (JAX only).

Usage: `XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax
python tests/distribution_worker.py OUT.json`

On a 2×4 mesh (`batch`, `model`): trains a single-device `CausalLM` two SGD steps, then a
fresh instance with the same initial weights under `ModelParallel(layout_map=layout_map(...))`
(vocabulary-sharded embedding), recording the losses of both and every variable's sharding
spec; then the same under `DataParallel`. Records the sharding of a `TextClassifier` built
under a width-sharded layout map, and of a model holding mixture-of-experts style
`expert_*` weights on an `expert` mesh axis, and trains a `CausalLM` whose blocks are
`MixtureOfExperts` with its experts on the model axis. Writes the results as JSON for
`tests/test_distribution.py`.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.distribution import layout_map  # noqa: E402
from keras_xf.distribution import variable_axes  # noqa: E402
from keras_xf.layers import MixtureOfExperts  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.models import TextClassifier  # noqa: E402

SIZES = dict(vocabulary_size=32, hidden_dim=16, num_heads=4, intermediate_dim=32,
             max_sequence_length=12, num_layers=1)
BATCH, LENGTH, STEPS = 8, 8, 2


@keras.saving.register_keras_serializable(package="keras_xf_tests")
class ExpertBank(keras.layers.Layer):
    """A stand-in for a mixture-of-experts layer: `M` expert FFNs whose weights are
    variables `expert_kernel_in [M, d, f]` and `expert_kernel_out [M, f, d]`, mixed by a
    softmax gate (dense: every expert sees every token)."""

    def __init__(self, num_experts=4, hidden_dim=8, **kwargs):
        super().__init__(**kwargs)
        self.num_experts = num_experts
        self.hidden_dim = hidden_dim

    def build(self, inputs_shape):
        d = inputs_shape[-1]
        self.expert_kernel_in = self.add_weight(
            name="expert_kernel_in", shape=(self.num_experts, d, self.hidden_dim))
        self.expert_kernel_out = self.add_weight(
            name="expert_kernel_out", shape=(self.num_experts, self.hidden_dim, d))
        self.router_kernel = self.add_weight(name="router_kernel", shape=(d, self.num_experts))

    def call(self, inputs):
        hidden = keras.ops.relu(keras.ops.einsum("btd,mdf->btmf", inputs, self.expert_kernel_in))
        outputs = keras.ops.einsum("btmf,mfd->btmd", hidden, self.expert_kernel_out)
        gates = keras.ops.softmax(keras.ops.matmul(inputs, self.router_kernel), axis=-1)
        return keras.ops.einsum("btm,btmd->btd", gates, outputs)

    def get_config(self):
        return {**super().get_config(), "num_experts": self.num_experts,
                "hidden_dim": self.hidden_dim}


def expert_model(num_experts=4, width=16):
    inputs = keras.Input((LENGTH, width))
    return keras.Model(inputs, ExpertBank(num_experts, name="experts")(inputs))


def _batch(model, seed=0):
    rng = np.random.default_rng(seed)
    x = {"token_ids": rng.integers(1, 32, size=(BATCH, LENGTH)).astype("int32"),
         "padding_mask": np.ones((BATCH, LENGTH), "int32")}
    x["padding_mask"][1, 5:] = 0
    if isinstance(model, CausalLM):
        return x, rng.integers(1, 32, size=(BATCH, LENGTH)).astype("int32")
    return x, rng.integers(0, 2, size=(BATCH,)).astype("int32")


def _train(model, weights, x, y):
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(0.5))
    history = model.fit(x, y, batch_size=BATCH, epochs=STEPS, shuffle=False, verbose=0)
    return [float(v) for v in history.history["loss"]]


def _specs(model):
    return {v.path: [None if a is None else str(a) for a in v.value.sharding.spec]
            + [None] * (len(v.shape) - len(v.value.sharding.spec))
            for v in model.variables if len(v.shape)}


def _run(make, mesh, embedding, train=True):
    reference = make()
    weights = reference.get_weights()
    x, y = _batch(reference)
    single = _train(reference, weights, x, y) if train else None
    layouts = layout_map(reference, mesh, embedding=embedding)
    declared = {p: list(a) for p, a in variable_axes(reference, mesh, embedding=embedding).items()}
    distribution = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch")
    with distribution.scope():
        model = make()
        specs = _specs(model)
        sharded = _train(model, weights, x, y) if train else None
    # The reference model's paths (auto-numbered names differ between the two instances)
    # in the same order as the distributed model's variables.
    pairs = {r.path: m.path for r, m in zip(reference.variables, model.variables)}
    declared = {pairs[p]: a for p, a in declared.items()}
    return {"single": single, "sharded": sharded, "specs": specs, "declared": declared}, (
        weights, x, y)


def main(out_path):
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
    results = {"devices": len(devices)}

    def causal_lm():
        return CausalLM(**SIZES)

    def classifier():
        return TextClassifier(num_classes=2, **SIZES)

    results["causal_lm"], (weights, x, y) = _run(causal_lm, mesh, "vocabulary")
    results["text_classifier"], _ = _run(classifier, mesh, "width", train=False)

    def moe_lm():  # 4 experts on the 4 devices of the model axis (the mesh has no expert axis)
        block = TransformerBlock(MultiHeadAttention(4), MixtureOfExperts(4, 16, top_k=2),
                                 norm_placement="pre")
        return CausalLM(block=block, **SIZES)

    results["moe_lm"], _ = _run(moe_lm, mesh, "vocabulary")

    with keras.distribution.DataParallel(devices=devices).scope():
        data_parallel = _train(causal_lm(), weights, x, y)
    results["data_parallel"] = {"single": results["causal_lm"]["single"],
                                "sharded": data_parallel}

    expert_mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "expert"), devices)
    reference = expert_model()
    layouts = layout_map(reference, expert_mesh, model_axis="expert")
    with keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch").scope():
        results["experts"] = _specs(expert_model())

    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
