"""The same weights and batch give the same outputs and losses on TensorFlow, JAX and PyTorch.

`tests/parity_worker.py` builds a small decoder-only model from keras_xf layers (token
embedding, sinusoidal and learned positions, two pre-norm blocks with causal grouped-query
attention and a GELU feedforward, tied logits), loads every weight from
`tests/data/parity_weights.npz`, and records the logits, 10 SGD losses and the trained
weights. This test runs the worker once per backend, each in its own subprocess (a process
holds one Keras backend), and compares the backends pairwise in float32 at `rtol=1e-4`.

The test does not depend on the backend running the suite: `make test` runs it once
(`tests/once/`), and it checks all three.
"""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.session_cache import shared_once

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO_ROOT, "tests", "parity_worker.py")
BACKENDS = ("tensorflow", "jax", "torch")
TIMEOUT_S = 240
RTOL = 1e-4
# Logits and weights are O(1): an absolute floor of 1e-5 covers entries that cross zero,
# where a relative tolerance means nothing. Float32 round-off differs by ~1e-6 here.
ATOL = 1e-5
WEIGHT_PREFIX = "weight:"


def _worker_env(backend):
    env = dict(os.environ)
    env["KERAS_BACKEND"] = backend
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    # A tiny model: one thread per process keeps the three workers from fighting over cores.
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env[name] = "1"
    env["TF_NUM_INTEROP_THREADS"] = "2"
    return env


def _run_workers(out_dir):
    """Runs the worker once per backend, in parallel, writing `<out_dir>/<backend>.npz`."""
    processes = {}
    for backend in BACKENDS:
        processes[backend] = subprocess.Popen(
            [sys.executable, WORKER, str(out_dir / f"{backend}.npz")],
            cwd=REPO_ROOT,
            env=_worker_env(backend),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    failures = []
    for backend, process in processes.items():
        try:
            log, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            log, _ = process.communicate()
            failures.append(f"{backend}: timed out after {TIMEOUT_S}s\n{log[-3000:]}")
            continue
        if process.returncode != 0:
            failures.append(f"{backend}: exit code {process.returncode}\n{log[-3000:]}")
    if failures:
        pytest.fail("parity worker failed:\n" + "\n".join(failures))


@pytest.fixture(scope="session")
def results(tmp_path_factory):
    """`{backend: {name: array}}` from one worker run per backend (once per test session,
    shared by the xdist workers)."""
    out_dir = shared_once(tmp_path_factory, "parity", _run_workers)
    outputs = {}
    for backend in BACKENDS:
        with np.load(out_dir / f"{backend}.npz") as data:
            outputs[backend] = {key: data[key] for key in data.files}
    return outputs


def _pairs():
    return list(itertools.combinations(BACKENDS, 2))


def test_workers_ran_on_their_backends(results):
    for backend in BACKENDS:
        assert str(results[backend]["backend"]) == backend


def test_outputs_are_finite(results):
    for backend in BACKENDS:
        for key in ("logits", "losses", "trained_logits"):
            assert np.all(np.isfinite(results[backend][key])), (backend, key)


@pytest.mark.parametrize("first,second", _pairs())
def test_forward_logits_match(results, first, second):
    np.testing.assert_allclose(
        results[first]["logits"], results[second]["logits"], rtol=RTOL, atol=ATOL
    )


@pytest.mark.parametrize("first,second", _pairs())
def test_sgd_losses_match(results, first, second):
    losses = results[first]["losses"]
    assert losses.shape == (10,)
    np.testing.assert_allclose(losses, results[second]["losses"], rtol=RTOL, atol=1e-6)


def test_training_reduces_the_loss(results):
    for backend in BACKENDS:
        losses = results[backend]["losses"]
        assert losses[-1] < losses[0], (backend, losses)


@pytest.mark.parametrize("first,second", _pairs())
def test_trained_logits_and_weights_match(results, first, second):
    np.testing.assert_allclose(
        results[first]["trained_logits"], results[second]["trained_logits"], rtol=RTOL, atol=ATOL
    )
    weights = sorted(k for k in results[first] if k.startswith(WEIGHT_PREFIX))
    assert weights == sorted(k for k in results[second] if k.startswith(WEIGHT_PREFIX))
    for key in weights:
        np.testing.assert_allclose(
            results[first][key], results[second][key], rtol=RTOL, atol=ATOL, err_msg=key
        )
