"""Shared fixtures. Tests never choose the backend: `KERAS_BACKEND` does."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Tests run tiny shapes, where XLA's LLVM optimisation passes cost far more compile time than
# they save at run time. Subprocesses inherit the flag.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from the float32 policy, a fresh name scope and fixed seeds."""
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.config.backend()}"

