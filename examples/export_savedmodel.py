"""Train a tiny `CausalLM`, save it as `.keras`, reload it and export it for serving.

What it shows: the round trip a deployment takes. A decoder-only `keras_xf.models.CausalLM`
learns a toy task (count upwards modulo the vocabulary) for a few steps, is saved as a
`.keras` file, reloaded with `keras.saving.load_model`, exported with Keras' `model.export`,
and the exported artefact is reloaded *without keras_xf* and checked against the Keras model,
at the export batch shape and at a different batch size and sequence length:

- TensorFlow and JAX: a SavedModel (`model.export(path)`) with two endpoints: `serve` (the
  logits) and `generate` (the cached decoding loop of `model.generate`). Generation is served
  from a separate Python process that imports only TensorFlow, and its tokens are compared
  with `model.generate`'s.
- PyTorch: an ONNX file (`model.export(path, format="onnx")`, run with onnxruntime; needs
  `onnx`, `onnxscript`, `onnxruntime`) and a `torch.export` program (`format="torch"`,
  `.pt2`). Keras cannot write a SavedModel from PyTorch here (it needs `torch_xla`).

Run (any backend):

    KERAS_BACKEND=jax python examples/export_savedmodel.py
    KERAS_BACKEND=torch python examples/export_savedmodel.py --steps 2 --output /tmp/lm_export

It prints the largest absolute difference between the artefact's logits and the model's, and
"outputs match" when every one is within `--tolerance`; on TensorFlow and JAX also
"generated tokens match" when the served `generate` returns `model.generate`'s tokens.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.models import CausalLM  # noqa: E402

# What a serving process runs: TensorFlow and the SavedModel, no keras_xf.
SERVE_GENERATION = """
import json, sys
import tensorflow as tf
path, request = sys.argv[1], json.loads(sys.argv[2])
loaded = tf.saved_model.load(path)
outputs = loaded.generate({key: tf.constant(value, tf.int32) for key, value in request.items()})
assert "keras_xf" not in sys.modules
print(json.dumps({key: value.numpy().astype(int).tolist() for key, value in outputs.items()}))
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-length", type=int, default=12)
    parser.add_argument("--vocabulary-size", type=int, default=32)
    parser.add_argument("--hidden-dim", type=int, default=16)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--output", default=None,
                        help="folder for the .keras file and the exports (default: a temp folder)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest accepted |artefact - model| logit difference")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def counting_batch(rng, batch_size, length, vocabulary_size):
    """Rows `s, s+1, s+2, ...` (mod V, ids from 1); the last row is right-padded."""
    start = rng.integers(1, vocabulary_size, size=(batch_size, 1))
    ids = (start + np.arange(length + 1)[None]) % (vocabulary_size - 1) + 1
    mask = np.ones((batch_size, length), "int32")
    mask[-1, length // 2:] = 0
    inputs = {"token_ids": (ids[:, :-1] * mask).astype("int32"), "padding_mask": mask}
    return inputs, ids[:, 1:].astype("int32"), mask


def main(argv=None):
    args = parse_args(argv)
    began = time.time()
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    backend = keras.config.backend()
    output = args.output or tempfile.mkdtemp(prefix="keras_xf_export_")
    os.makedirs(output, exist_ok=True)

    # 1. Build and briefly train.
    model = CausalLM(
        vocabulary_size=args.vocabulary_size,
        num_layers=args.num_layers,
        hidden_dim=args.hidden_dim,
        num_heads=args.num_heads,
        intermediate_dim=2 * args.hidden_dim,
        max_sequence_length=4 * args.sequence_length,
    )
    model.compile()
    x, y, weights = counting_batch(rng, args.batch_size * max(args.steps, 1),
                                   args.sequence_length, args.vocabulary_size)
    if args.steps > 0:
        history = model.fit(x, y, sample_weight=weights, batch_size=args.batch_size, epochs=1,
                            steps_per_epoch=args.steps, verbose=0)
        print(f"backend: {backend}; trained {args.steps} steps, "
              f"loss {history.history['loss'][-1]:.3f}")

    # 2. Save as .keras and reload.
    keras_path = os.path.join(output, "causal_lm.keras")
    model.save(keras_path)
    model = keras.saving.load_model(keras_path)
    print(f"saved and reloaded {keras_path}")

    # 3. Export what this backend supports, and reload each artefact without keras_xf.
    runners = {}
    if backend in ("tensorflow", "jax"):
        import tensorflow as tf

        path = os.path.join(output, "saved_model")
        model.export(path, verbose=False)  # endpoints `serve` and `generate`
        served = tf.saved_model.load(path)
        runners[f"SavedModel {path}"] = lambda inputs: np.asarray(
            served.serve({name: tf.constant(value) for name, value in inputs.items()})
        )
        check_generation(model, path, rng, args)
    else:
        import torch

        path = os.path.join(output, "causal_lm.onnx")
        model.export(path, format="onnx")
        try:
            import onnxruntime
        except ImportError:
            print(f"wrote {path}; install onnxruntime to check it")
        else:
            session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
            runners[f"ONNX {path}"] = lambda inputs: session.run(None, inputs)[0]

        path = os.path.join(output, "causal_lm.pt2")
        model.export(path, format="torch")
        program = torch.export.load(path).module()

        def run_program(inputs):
            with torch.no_grad():
                tensors = {name: torch.from_numpy(value) for name, value in inputs.items()}
                return program(tensors).detach().cpu().numpy()

        runners[f"torch.export {path}"] = run_program

    # 4. Compare with the Keras model at the training shape and at a new one.
    worst = 0.0
    for batch_size, length in ((args.batch_size, args.sequence_length),
                               (3, args.sequence_length + 5)):
        inputs, _, _ = counting_batch(rng, batch_size, length, args.vocabulary_size)
        expected = model.predict(inputs, verbose=0)
        for name, run in runners.items():
            difference = float(np.max(np.abs(run(inputs) - expected)))
            worst = max(worst, difference)
            print(f"{name} [{batch_size}, {length}]: max |difference| {difference:.2e}")
    if worst > args.tolerance:
        raise SystemExit(f"outputs differ: {worst:.2e} > {args.tolerance:.0e}")
    print(f"outputs match (max |difference| {worst:.2e})")
    print(f"time: {time.time() - began:.1f}s")


def check_generation(model, path, rng, args):
    """Serves `generate` from another process (TensorFlow only) and compares its tokens with
    `model.generate` (greedy, the compile sampler)."""
    inputs, _, _ = counting_batch(rng, 2, args.sequence_length // 2, args.vocabulary_size)
    max_length = 2 * args.sequence_length
    request = {**{key: value.tolist() for key, value in inputs.items()},
               "max_length": max_length, "stop_token_ids": [], "seed": 0}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    served = subprocess.run([sys.executable, "-c", SERVE_GENERATION, path, json.dumps(request)],
                            check=True, capture_output=True, text=True, env=env,
                            cwd=tempfile.gettempdir())
    tokens = np.array(json.loads(served.stdout.strip().splitlines()[-1])["token_ids"])
    expected = model.generate(inputs, max_length=max_length)["token_ids"]
    print(f"served generate (TensorFlow only): {tokens[0].tolist()}")
    if not np.array_equal(tokens, expected):
        raise SystemExit(f"generated tokens differ:\n{tokens}\n{expected}")
    print("generated tokens match model.generate")


if __name__ == "__main__":
    main()
