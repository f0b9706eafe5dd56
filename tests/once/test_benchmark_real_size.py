"""`benchmarks/real_size.py --tiny` runs on every backend: each dtype and batch gets both
libraries' rates and the ratio between them, and batch 1 the bandwidth bound (a check that
the benchmark runs, not a measurement: decoding rates of so small a model may be missing).
The int8 rows, whose code is the same on every backend, run under JAX only."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("backend, dtypes", [
    ("tensorflow", ("float32",)), ("jax", ("float32", "int8")), ("torch", ("float32",))])
def test_tiny_run_reports_both_libraries(backend, dtypes, tmp_path):
    output = tmp_path / "real_size.json"
    command = [sys.executable, "-m", "benchmarks.real_size", "--tiny", "--dtypes",
               ",".join(dtypes), "--folder", str(tmp_path / "folder"), "--output", str(output)]
    env = dict(os.environ, KERAS_BACKEND=backend)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["backend"] == backend and report["bandwidth_gb_s"] > 0
    rows = {(row["dtype"], row["batch"]): row for row in report["results"]}
    assert set(rows) == {(dtype, batch) for dtype in dtypes for batch in (1, 8)}
    for (dtype, batch), row in rows.items():
        assert set(row["libraries"]) == {"keras_xf", "transformers"}
        for library in row["libraries"].values():
            assert library["generate_tokens_per_s"]["median"] > 0
            assert library["ttft_s"]["median"] > 0
        assert row["keras_xf_over_transformers"]["generate"]["ratio"] > 0
        if batch == 1:
            assert row["bound_tokens_per_s"] > 0
