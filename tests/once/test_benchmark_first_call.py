"""`benchmarks/first_call.py --tiny` runs: three fresh processes (no cache, a cold cache, a
warm one), each with its load time and first-call times per prompt length (a check that the
benchmark runs, not a measurement). One backend: the processes are what is exercised, and
`enable_compilation_cache` is tested on every backend in tests/generation."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_run_reports_every_mode(tmp_path):
    output = tmp_path / "first_call.json"
    command = [sys.executable, "-m", "benchmarks.first_call", "--tiny", "--prompt-lengths",
               "12", "--folder", str(tmp_path / "folder"), "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, KERAS_BACKEND="jax"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert report["backend"] == "jax" and report["new_tokens"] == 8
    assert list(report["results"]) == ["no cache", "cache, cold", "cache, warm"]
    for mode, result in report["results"].items():
        assert result["cache_enabled"] == (mode != "no cache")
        assert result["load_s"] > 0
        calls = result["calls"]["12"]
        assert calls["first_token_s"] > 0 and calls["generate_s"] > 0
    assert "| cache, warm | 12 |" in done.stdout
