"""Shared fixtures. Tests never choose the backend: `KERAS_BACKEND` does."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Tests run tiny shapes, where XLA's compile time far exceeds the run time it saves: no LLVM
# optimisation passes, and the CPU backend's older emitters, which compile the many one-op
# programs of eager JAX about a third faster than its fusion emitters. Subprocesses inherit
# the flags; flags already set are kept.
TEST_XLA_FLAGS = {"xla_backend_optimization_level": "0", "xla_cpu_use_fusion_emitters": "false"}
for _flag, _value in TEST_XLA_FLAGS.items():
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_flag}={_value}".strip()

import gc  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Objects alive once the backends are imported are moved to the permanent generation, which
# garbage collections skip; what the tests create is collected as usual.
gc.freeze()


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from the float32 policy, a fresh name scope and fixed seeds."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True, scope="session")
def _young_generation_collections():
    """Explicit `gc.collect()` calls collect the young generation only.

    Keras runs a full collection whenever a layer drops a variable (`Layer.__delattr__`, so
    that device buffers go at once; `quantize` drops every kernel). A full collection walks
    every object of a test process that holds the backends and thousands of compiled ops:
    0.2 to 0.4 s a call, a third of the quantisation tests' time. Tests keep no device memory
    worth freeing at once; Python's own collections run as usual.
    """
    full_collect = gc.collect

    def young_collect(generation=2):
        return full_collect(0)

    gc.collect = young_collect
    yield
    gc.collect = full_collect


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.config.backend()}"

