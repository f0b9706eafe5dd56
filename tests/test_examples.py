"""Runs every script in `examples/` in a subprocess, with tiny settings, each on one backend.

Each `examples/*.py` found is a test case. Scripts listed in `TINY_RUNS` run with their tiny
arguments and must print the listed keys; any other script runs with `--help` (so a new
example is at least importable and parses its arguments) until it is given an entry here.

An example composes library features that the unit tests check on every backend; its tiny run
checks that the script itself works end to end. Each script takes JAX and PyTorch in turn by
name order (the first `jax`, the second `torch`, ...), so a suite run passes every script
once and the subprocess inherits that backend's `KERAS_BACKEND`. TensorFlow runs none: a
script's tiny run traces a graph for every model it fits, 35 to 135 s a script against 7 to
25 s on the other two, and its unit tests already cover every feature the scripts use.
"""

import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(path for path in (ROOT / "examples").glob("*.py")
                  if not path.name.startswith("_"))  # _name.py: a module the examples share
BACKENDS = ("jax", "torch")
# The scripts whose turn is this backend's.
THIS_BACKEND = [path for index, path in enumerate(EXAMPLES)
                if BACKENDS[index % len(BACKENDS)] == keras.config.backend()]

# script name -> (tiny arguments, text the run must print). "{tmp}" is a scratch folder.
TINY_RUNS = {
    "translate.py": (
        ["--examples", "64", "--eval-examples", "8", "--epochs", "1", "--batch-size", "32",
         "--max-digits", "4", "--num-layers", "1", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "32", "--num-beams", "2", "--verbose", "0"],
        ["exact match", "time:"],
    ),
    "distill_translate.py": (
        ["--examples", "64", "--eval-examples", "4", "--epochs", "1", "--batch-size", "32",
         "--max-digits", "3", "--num-layers", "2", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "32", "--num-beams", "2", "--verbose", "0",
         "--sequence-level", "--hidden-weight", "0.5"],
        ["teacher", "student, from scratch", "student, word-level distillation",
         "student, sequence-level + word-level", "tokens/s", "time:"],
    ),
    "classify.py": (
        ["--examples", "64", "--eval-examples", "32", "--epochs", "1", "--batch-size", "32",
         "--max-length", "8", "--num-layers", "1", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "32", "--verbose", "0"],
        ["held-out accuracy", "time:"],
    ),
    "train_lm.py": (
        ["--minutes", "0.02", "--max-characters", "20000", "--sequence-length", "32",
         "--batch-size", "8", "--hidden-dim", "16", "--num-layers", "1", "--num-heads", "2",
         "--sample-length", "8", "--output", "{tmp}"],
        ["validation perplexity", "sample:", "saved", "exported"],
    ),
    "memory_lm.py": (
        ["--train-characters", "4000", "--valid-characters", "2000", "--epochs", "1",
         "--hidden-dim", "16", "--num-layers", "1", "--num-heads", "2", "--batch-size", "4",
         "--chunk-length", "8", "--memory-length", "8", "--compressed-length", "4",
         "--output", "{tmp}/memory_lm.json"],
        ["memory       validation perplexity", "compressive  validation perplexity",
         "stream order validation perplexity",
         "no memory    validation perplexity", "window       validation perplexity",
         "memory model over the validation stream",
         "compressive model over the validation stream", "time:"],
    ),
    "layer_drop.py": (
        ["--steps", "2", "--num-layers", "2", "--hidden-dim", "16", "--num-heads", "2",
         "--sequence-length", "16", "--batch-size", "4", "--max-characters", "20000",
         "--eval-examples", "4"],
        ["validation loss", "layer drop 0.20", "no layer drop", "time:"],
    ),
    "export_savedmodel.py": (["--steps", "2", "--output", "{tmp}"], ["outputs match"]),
    "checkpoint_finetune.py": (
        ["--steps", "2", "--sequence-length", "16", "--batch-size", "2", "--window", "4",
         "--output", "{tmp}"],
        ["Loaded", "Fine-tuned 2 steps", "Generated:", "Wrote a MistralForCausalLM",
         "loads it as MistralForCausalLM"],
    ),
    "lora_finetune.py": (
        ["--steps", "4", "--sequence-length", "16", "--batch-size", "2", "--rank", "2",
         "--alpha", "4", "--learning-rate", "1e-2", "--new-tokens", "4",
         "--vocabulary-size", "300", "--hidden-dim", "16", "--intermediate-dim", "32",
         "--num-heads", "2", "--num-key-value-heads", "1", "--output", "{tmp}"],
        ["Enabled LoRA", "Trainable params", "Fine-tuned 4 steps", "Saved the adapters",
         "Reloaded on", "Generated on", "Wrote a PEFT adapter", "peft loads it", "time:"],
    ),
    "vit_digits.py": (
        ["--epochs", "1", "--steps", "2", "--batch-size", "16", "--num-layers", "1",
         "--hidden-dim", "16", "--num-heads", "2", "--intermediate-dim", "32", "--verbose", "0"],
        ["test accuracy", "time:"],
    ),
    "retrieval_recall.py": (
        ["--steps", "4", "--chunk-length", "8", "--chunks", "2", "--pairs", "2",
         "--top-k", "2", "--batch-size", "4", "--eval-documents", "1", "--hidden-dim", "16",
         "--verbose", "0"],
        ["retrieval held-out recall accuracy", "local     held-out recall accuracy",
         "memory    held-out recall accuracy", "time:"],
    ),
    "long_range.py": (
        ["--mixer", "all", "--sequence-length", "16", "--pairs", "2", "--steps", "2",
         "--eval-examples", "4", "--batch-size", "4", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "16", "--verbose", "0"],
        ["gated_linear: held-out accuracy", "selective_ssm: held-out accuracy",
         "attention: held-out accuracy", "time:"],
    ),
    "visual_qa.py": (
        ["--fusion", "both", "--max-train-images", "32", "--questions-per-image", "2",
         "--eval-images", "4", "--epochs", "1", "--batch-size", "32", "--num-layers", "1",
         "--hidden-dim", "16", "--num-heads", "2", "--intermediate-dim", "32",
         "--verbose", "0"],
        ["prefix exact-answer accuracy", "cross_attention exact-answer accuracy", "time:"],
    ),
    "early_exit_genre.py": (
        ["--per-genre", "16", "--validation-passages", "24", "--passage-length", "64",
         "--vocabulary-size", "64",
         "--epochs", "1", "--num-layers", "2", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "32", "--timing-examples", "2", "--output", "{tmp}/e.png"],
        ["fixed depth", "entropy", "patience 1", "batch-1 time per passage", "wrote"],
    ),
    "layer_skipping_genre.py": (
        ["--per-genre", "16", "--validation-passages", "24", "--passage-length", "64",
         "--vocabulary-size", "64", "--compute-loss-weights", "0", "0.1",
         "--thresholds", "0.5", "--epochs", "1", "--num-layers", "2", "--hidden-dim", "16",
         "--num-heads", "2", "--intermediate-dim", "32", "--timing-examples", "2",
         "--output", "{tmp}/s.png", "--results", "{tmp}/s.json"],
        ["every layer run", "λ 0.1 τ 0.5", "average layers", "batch-1 time per passage",
         "wrote"],
    ),
    "token_skipping_genre.py": (
        ["--per-genre", "16", "--validation-passages", "24", "--passage-length", "64",
         "--vocabulary-size", "64", "--capacities", "0.5", "--target-rates", "0.5",
         "--thresholds", "0.5", "--epochs", "1", "--num-layers", "2", "--hidden-dim", "16",
         "--num-heads", "2", "--intermediate-dim", "32", "--timing-batch", "4",
         "--timing-repeats", "2", "--output", "{tmp}/t.png", "--results", "{tmp}/t.json"],
        ["every token", "capacity 0.5", "learned rate 0.5 τ 0.5", "tokens processed",
         "batch 4", "passages/s", "wrote"],
    ),
    "sequence_compression_lm.py": (
        ["--strides", "2", "--steps", "2", "--batch-size", "4", "--sequence-length", "16",
         "--hidden-dim", "16", "--num-heads", "2", "--eval-examples", "8",
         "--max-characters", "20000", "--timing-repeats", "1", "--results", "{tmp}/c.json"],
        ["plain", "stride 2", "bits/byte", "train tok/s", "wrote"],
    ),
    "early_exit_lm.py": (
        ["--steps", "2", "--batch-size", "4", "--length", "16", "--num-layers", "2",
         "--hidden-dim", "16", "--num-heads", "2", "--intermediate-dim", "32",
         "--eval-windows", "4", "--prompts", "2", "--prompt-length", "8", "--new-tokens", "4",
         "--max-characters", "20000", "--criteria", "entropy", "patience",
         "--output", "{tmp}/e.png", "--results", "{tmp}/e.json"],
        ["fixed depth", "adaptive depth, teacher-forced", "greedy generation",
         "without early exit", "vs loop", "wrote"],
    ),
    "deep_post_norm.py": (
        ["--depths", "2", "--steps", "2", "--log-every", "1", "--max-characters", "5000",
         "--sequence-length", "8", "--batch-size", "4", "--hidden-dim", "8",
         "--warmup-steps", "1", "--valid-sequences", "4", "--output", "{tmp}/curves.png",
         "--results", "{tmp}/curves.json"],
        ["2 layers, post:", "2 layers, deep_norm:", "2 layers, pre:", "validation loss",
         "wrote"],
    ),
    "structured_pruning.py": (
        ["--steps", "2", "--finetune-steps", "1", "--batch-size", "4", "--length", "16",
         "--num-layers", "2", "--hidden-dim", "16", "--num-heads", "2",
         "--intermediate-dim", "32", "--score-batches", "1", "--eval-batches", "1",
         "--timing-repeats", "1", "--max-characters", "20000"],
        ["layer importance", "pruned (gradient)", "pruned (magnitude)", "tokens/s"],
    ),
}
TIMEOUT_SECONDS = 300  # generous: a tiny run is short, but the machine may be shared.


@pytest.mark.skipif(not THIS_BACKEND, reason="example scripts run on JAX and PyTorch in turn "
                    "(see the module docstring)")
@pytest.mark.parametrize("script", THIS_BACKEND, ids=[path.name for path in THIS_BACKEND])
def test_example_runs(script, tmp_path):
    arguments, expected = TINY_RUNS.get(script.name, (["--help"], ["usage"]))
    arguments = [argument.replace("{tmp}", str(tmp_path)) for argument in arguments]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, str(script), *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script.name} exited with {result.returncode}:\n{output[-4000:]}"
    for key in expected:
        assert key in result.stdout, f"{script.name} did not print {key!r}:\n{output[-4000:]}"


def test_examples_found():
    names = {path.name for path in EXAMPLES}
    assert {"translate.py", "classify.py"} <= names, names
    # Every script has its backend's turn; TensorFlow has none.
    turns = [BACKENDS[index % len(BACKENDS)] for index in range(len(EXAMPLES))]
    assert set(turns) == set(BACKENDS) and "tensorflow" not in turns


def test_every_tiny_run_names_an_example():
    assert set(TINY_RUNS) <= {path.name for path in EXAMPLES}
