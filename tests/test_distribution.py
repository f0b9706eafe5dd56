"""`keras_xf.distribution.layout_map`: the layout rules on every backend, and `fit` under
`keras.distribution.ModelParallel` / `DataParallel` on 8 virtual JAX CPU devices."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_xf.distribution import layout_map
from keras_xf.distribution import variable_axes
from tests.distribution_worker import expert_model
from tests.session_cache import shared_once
from tests.models import tiny


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO_ROOT, "tests", "distribution_worker.py")
TIMEOUT_S = 300
SIZES = dict(tiny.SIZES, num_heads=4, num_layers=1)

jax_only = pytest.mark.skipif(
    keras.config.backend() != "jax",
    reason="Keras implements keras.distribution.ModelParallel (variable sharding by a "
    "LayoutMap) and DataParallel for the JAX backend only",
)


def _mesh(shape=(2, 4), axes=("batch", "model")):
    # Named devices: the mesh is only read for its axes, so every backend can build one.
    devices = [f"cpu:{i}" for i in range(int(np.prod(shape)))]
    return keras.distribution.DeviceMesh(shape, axes, devices)


def _axes_by_role(model, mesh, **kwargs):
    """`{path suffix: axes}` read back through the LayoutMap, for every variable."""
    layouts = layout_map(model, mesh, **kwargs)
    found = {}
    for variable in model.variables:
        layout = layouts[variable.path]
        parts = variable.path.split("/")
        found.setdefault("/".join(parts[-2:]), set()).add(None if layout is None else layout.axes)
    return found


def test_causal_lm_heads_hidden_units_and_vocabulary():
    model = tiny.causal_lm(**SIZES)
    found = _axes_by_role(model, _mesh())
    assert found["query/kernel"] == found["key/kernel"] == found["value/kernel"] == {
        (None, "model", None)}
    assert found["query/bias"] == {("model", None)}
    assert found["attention_output/kernel"] == {("model", None, None)}
    assert found["attention_output/bias"] == {None}
    assert found["hidden/kernel"] == {(None, "model")} and found["hidden/bias"] == {("model",)}
    assert found["output/kernel"] == {("model", None)} and found["output/bias"] == {None}
    assert found["token_embedding/embeddings"] == {("model", None)}
    assert found["norm/gamma"] == found["norm/beta"] == {None}


def test_width_embedding_untied_learned_positions_and_gated_feedforward():
    model = tiny.causal_lm(**SIZES, tie_embeddings=False, position="learned", activation="swiglu")
    found = _axes_by_role(model, _mesh(), embedding="width")
    assert found["token_embedding/embeddings"] == {(None, "model")}
    assert found["token_embedding/reverse_embeddings"] == {("model", None)}
    assert found["position_embedding/embeddings"] == {(None, "model")}
    assert found["gate/kernel"] == {(None, "model")}
    found = _axes_by_role(model, _mesh(), embedding="vocabulary")
    assert found["token_embedding/reverse_embeddings"] == {(None, "model")}
    assert found["position_embedding/embeddings"] == {None}
    found = _axes_by_role(model, _mesh(), embedding=None)
    assert found["token_embedding/embeddings"] == {None}


@pytest.mark.parametrize("factory", [tiny.seq2seq_lm, tiny.text_classifier, tiny.text_encoder])
def test_every_model_shards_all_its_attention_and_feedforward_layers(factory):
    model = factory(**SIZES)
    axes = variable_axes(model, _mesh())
    kernels = [v.path for v in model.variables if v.path.endswith(("query/kernel", "hidden/kernel"))]
    assert kernels and all(path in axes for path in kernels)
    if factory is tiny.seq2seq_lm:  # encoder, decoder self- and cross-attention
        assert sum(p.endswith("query/kernel") for p in axes) == 3


def test_the_map_applies_to_a_fresh_instance():
    """Keys ignore auto-numbered names: the map built from one instance shards another."""
    first = tiny.causal_lm(**SIZES)
    layouts = layout_map(first, _mesh())
    second = tiny.causal_lm(**SIZES)
    assert [v.path for v in first.variables] != [v.path for v in second.variables]
    expected = variable_axes(second, _mesh())
    for variable in second.variables:
        layout = layouts[variable.path]
        assert (None if layout is None else layout.axes) == expected.get(variable.path)


def test_grouped_query_attention_keeps_few_key_value_heads_replicated():
    model = tiny.causal_lm(**SIZES, num_key_value_heads=2)
    found = _axes_by_role(model, _mesh())
    assert found["query/kernel"] == {(None, "model", None)}
    assert found["key/kernel"] == found["value/kernel"] == found["key/bias"] == {None}
    found = _axes_by_role(model, _mesh((4, 2)))
    assert found["key/kernel"] == {(None, "model", None)}


def test_expert_weights_on_the_expert_axis():
    model = expert_model()
    found = _axes_by_role(model, _mesh())  # no "expert" axis: the model axis
    assert found["experts/expert_kernel_in"] == found["experts/expert_kernel_out"] == {
        ("model", None, None)}
    assert found["experts/router_kernel"] == {None}
    mesh = _mesh((2, 2, 2), ("batch", "expert", "model"))
    assert _axes_by_role(model, mesh)["experts/expert_kernel_in"] == {("expert", None, None)}
    assert _axes_by_role(model, mesh, expert_axis="batch")["experts/expert_kernel_in"] == {
        ("batch", None, None)}


def test_errors():
    model = tiny.causal_lm(num_layers=1, vocabulary_size=30)  # 2 heads, 30 tokens
    with pytest.raises(ValueError, match=r"does not divide dimension 0 \(size 30\).*token_embedding"):
        layout_map(model, _mesh())
    with pytest.raises(ValueError, match=r"'model' \(size 4\) does not divide dimension 1 \(size 2\).*query/kernel"):
        layout_map(model, _mesh(), embedding=None)  # 2 heads on 4 devices
    with pytest.raises(ValueError, match=r"does not divide dimension 0 \(size 6\).*expert_kernel_in"):
        layout_map(expert_model(num_experts=6), _mesh())
    with pytest.raises(ValueError, match="model_axis must be an axis.*Received: model_axis='tensor'"):
        layout_map(model, _mesh(), model_axis="tensor")
    with pytest.raises(ValueError, match="expert_axis must be an axis.*expert_axis='experts'"):
        layout_map(model, _mesh(), expert_axis="experts")
    with pytest.raises(ValueError, match="embedding must be one of.*embedding='rows'"):
        layout_map(model, _mesh(), embedding="rows")
    with pytest.raises(ValueError, match="device_mesh must be a keras.distribution.DeviceMesh"):
        layout_map(model, (2, 4))


def _run_worker(out_dir):
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS=" ".join([os.environ.get("XLA_FLAGS", ""),
                                   "--xla_force_host_platform_device_count=8"]).strip(),
               PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.run([sys.executable, WORKER, str(out_dir / "results.json")],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT_S)
    if process.returncode != 0:
        pytest.fail(f"distribution worker failed:\n{(process.stdout + process.stderr)[-3000:]}")


@pytest.fixture(scope="session")
def distributed(tmp_path_factory):
    """The worker's results from one subprocess with 8 virtual CPU devices (once per test
    session, shared by the xdist workers)."""
    out_dir = shared_once(tmp_path_factory, "distribution", _run_worker)
    with open(out_dir / "results.json") as f:
        return json.load(f)


@jax_only
def test_model_parallel_fit_matches_one_device(distributed):
    assert distributed["devices"] == 8
    run = distributed["causal_lm"]
    np.testing.assert_allclose(run["sharded"], run["single"], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(run["sharded"]))


@jax_only
@pytest.mark.parametrize("name", ["causal_lm", "text_classifier"])
def test_variables_are_sharded_as_declared(distributed, name):
    run = distributed[name]
    assert len(run["declared"]) >= 10
    assert run["declared"]["embeddings/token_embedding/embeddings"] == (
        ["model", None] if name == "causal_lm" else [None, "model"])
    for path, spec in run["specs"].items():
        assert spec == run["declared"].get(path, [None] * len(spec)), path


@jax_only
def test_data_parallel_fit_matches_one_device(distributed):
    run = distributed["data_parallel"]
    np.testing.assert_allclose(run["sharded"], run["single"], rtol=1e-5, atol=1e-6)


@jax_only
def test_expert_weights_are_sharded_on_the_expert_mesh_axis(distributed):
    assert distributed["experts"] == {
        "experts/expert_kernel_in": ["expert", None, None],
        "experts/expert_kernel_out": ["expert", None, None],
        "experts/router_kernel": [None, None],
    }


@jax_only
def test_mixture_of_experts_fit_shards_experts_and_matches_one_device(distributed):
    run = distributed["moe_lm"]
    np.testing.assert_allclose(run["sharded"], run["single"], rtol=1e-5, atol=1e-6)
    experts = {p: a for p, a in run["declared"].items() if "/expert_" in p}
    assert {"/".join(p.rsplit("/", 2)[1:]) for p in experts} >= {"experts_in/expert_kernel",
                                                                  "experts_out/expert_kernel"}
    assert all(axes[0] == "model" for axes in experts.values()), experts
    for path, spec in run["specs"].items():
        assert spec == run["declared"].get(path, [None] * len(spec)), path
