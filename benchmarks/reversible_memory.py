"""Peak training memory of reversible stacks against ordinary stacks, by depth (issue 25).

Each configuration trains a few steps in its own process (so that its peak resident memory is
its own, as `benchmarks/cases.py` runs its cases) and reports the peak RSS of training minus
the resident memory after the model was built and run once in inference: the memory the
backward pass needs. The stacks:

- `ordinary`: `TransformerStack` of pre-norm `TransformerBlock`s (autodiff keeps every
  layer's activations);
- `reversible_plain`: `ReversibleStack(recompute=False)`, the same reversible equations under
  plain autodiff (the control);
- `reversible`: `ReversibleStack(recompute=True)`, whose custom gradient keeps the last
  outputs only and recomputes each layer's inputs.

The activations (`[B, T, d]` and `[B, T, 4d]` tensors per layer: batch 8, 512 positions,
width 128) outweigh the weights (0.2 M parameters per layer). PyTorch runs eagerly, so its
peak resident memory is the training step's own; under XLA (TensorFlow, JAX) the peak
also holds the compiler's memory.

    KERAS_BACKEND=torch python -m benchmarks.reversible_memory [--depths 8,16,32]
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KINDS = ("ordinary", "reversible_plain", "reversible")


def run_case(kind, depth, args):
    import keras
    import numpy as np

    from benchmarks import measure
    from keras_xf.layers import FeedForward
    from keras_xf.layers import MultiHeadAttention
    from keras_xf.layers import ReversibleStack
    from keras_xf.layers import TransformerBlock
    from keras_xf.layers import TransformerStack

    keras.utils.set_random_seed(0)
    block = TransformerBlock(MultiHeadAttention(args.heads), FeedForward(4 * args.width),
                             norm_placement="pre")
    if kind == "ordinary":
        stack = TransformerStack(block, depth)
    else:
        stack = ReversibleStack(block, depth, recompute=kind == "reversible")
    inputs = keras.Input((args.length, args.width))
    model = keras.Model(inputs, stack(inputs, use_causal_mask=True))
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse", jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.length, args.width)).astype("float32")
    y = rng.normal(size=x.shape).astype("float32")
    model.predict(x, batch_size=args.batch, verbose=0)
    before = measure.peak_rss_mb()
    history = model.fit(x, y, batch_size=args.batch, epochs=args.steps, verbose=0)
    peak = measure.peak_rss_mb()
    return {
        "kind": kind,
        "depth": depth,
        "parameters": int(model.count_params()),
        "rss_before_training_mb": round(before, 1),
        "peak_rss_mb": round(peak, 1),
        "training_increment_mb": round(peak - before, 1),
        "loss": float(history.history["loss"][-1]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="8,16,32")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--case", nargs=2, metavar=("KIND", "DEPTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        result = run_case(args.case[0], int(args.case[1]), args)
        print("RESULT " + json.dumps(result))
        return
    import keras

    from benchmarks import measure

    print(f"backend {keras.config.backend()}, CPU {measure.cpu_name()}; batch {args.batch}, "
          f"length {args.length}, width {args.width}, heads {args.heads}, {args.steps} steps")
    # glibc serves large blocks from mmap and returns them on free, so that the peak resident
    # memory follows the live tensors rather than the heap's fragmentation.
    environment = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    results = []
    for depth in [int(d) for d in args.depths.split(",")]:
        for kind in args.kinds.split(","):
            command = [sys.executable, "-m", "benchmarks.reversible_memory", "--case", kind,
                       str(depth)] + [f"--{k}={getattr(args, k)}" for k in
                                      ("batch", "length", "width", "heads", "steps")]
            process = subprocess.run(command, capture_output=True, text=True, env=environment)
            lines = [l for l in process.stdout.splitlines() if l.startswith("RESULT ")]
            if process.returncode or not lines:
                sys.stderr.write(process.stdout[-2000:] + process.stderr[-4000:])
                raise SystemExit(f"case {kind} {depth} failed")
            result = json.loads(lines[-1][len("RESULT "):])
            results.append(result)
            print(f"{kind:>17} L={depth:>2}: {result['parameters']:>8,} parameters, training "
                  f"needs {result['training_increment_mb']:7.1f} MB above inference "
                  f"(peak RSS {result['peak_rss_mb']:.0f} MB)", flush=True)
    print("JSON " + json.dumps(results))


if __name__ == "__main__":
    main()
