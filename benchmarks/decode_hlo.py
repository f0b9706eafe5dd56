"""What XLA makes of keras_xf's decoding loop on JAX: the copies and cache writes in the
compiled body of greedy generation's `while` loop, read from the optimised HLO.

    KERAS_BACKEND=jax python -m benchmarks.decode_hlo [--batch 1]

The model and inputs are those of `make bench` (`benchmarks/models.py`, `benchmarks/cases.py`):
keras_xf's `CausalLM` generates once (which compiles it) while XLA dumps every module it compiles
as optimised HLO text (`--xla_dump_to`). In the module holding the decoding loop, the body of
its `while` is listed by kind: `copy` instructions, fusions that write with
`dynamic-update-slice`, and fusions that copy or transpose a buffer, each with its output shape
and count per decoded token. The counts depend only on the compiler, not on the machine's load:
the structural evidence behind the profile's `copy` and `dynamic_update_slice` rows
(`benchmarks.profile_jax --phases generate`). Never run by the test suite.
"""

import argparse
import collections
import glob
import os
import re
import tempfile

DUMP = tempfile.mkdtemp(prefix="xf_decode_hlo_")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text").strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import cases  # noqa: E402
from benchmarks import config as c  # noqa: E402
from benchmarks import models  # noqa: E402

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+?)(?:\{[\d,]*\})? ([\w\-]+)\(")


def _computations(text):
    """computation name → its instruction lines."""
    found, name = {}, None
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if header:
            name = header.group(1)
            found[name] = []
        elif name is not None and line.startswith("  "):
            found[name].append(line)
    return found


def loop_body_ops(text):
    """(kind, shape) → count over the body of the largest `while` loop in an HLO module."""
    computations = _computations(text)
    bodies = re.findall(r" while\(.*?body=%([\w.\-]+)", text)
    body = max(bodies, key=lambda name: len(computations[name]))
    counts = collections.Counter()
    for line in computations[body]:
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        _, shape, opcode = match.groups()
        if opcode == "copy":
            counts[("copy", shape)] += 1
        elif opcode == "fusion":
            fused = "\n".join(computations[re.search(r"calls=%([\w.\-]+)", line).group(1)])
            if " dynamic-update-slice(" in fused:
                counts[("fusion writing with dynamic-update-slice", shape)] += 1
            elif re.search(r" (copy|transpose)\(", fused):
                counts[("fusion copying or transposing", shape)] += 1
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    keras.utils.set_random_seed(c.SEED)
    model = models.xf_causal_lm()
    inputs = cases._generation_inputs(args.batch)
    np.asarray(model.generate(inputs, stop_token_ids=None)["token_ids"])
    paths = glob.glob(os.path.join(DUMP, "*after_optimizations.txt"))
    texts = [open(path).read() for path in paths]
    text = max((t for t in texts if " while(" in t), key=len)
    print(f"keras_xf CausalLM greedy decoding, batch {args.batch}: the compiled loop body, "
          "instructions per decoded token")
    for (kind, shape), count in sorted(loop_body_ops(text).items()):
        print(f"  {count:3d}  {kind:42s} {shape}")


if __name__ == "__main__":
    main()
