"""Serving speed: tokens/s of the exported `generate` endpoint against in-Python
`model.generate` and keras-hub's `generate`, batch 1 and 8, in one run.

    KERAS_BACKEND=jax python -m benchmarks.serving_speed [--repeats 5] [--new-tokens 128]

The models are those of `cases.py` (`models.xf_causal_lm` and its anchor `models.hub_causal_lm`,
keras-hub's `GPT2CausalLM`: 4 layers, width 256, 4 heads, FFN 1024, vocabulary 8192, learned
positions, tied embeddings). Greedy decoding of a 32-token prompt (`config.PROMPT`) to
`--new-tokens` new tokens, no stop token, batch 1 and 8:

- `exported`: the keras_xf model exported with `model.export(path)` and loaded with plain
  `tf.saved_model.load`; its `generate` endpoint called with the prompts, `max_length`, empty
  `stop_token_ids` and a seed (TensorFlow and JAX). PyTorch writes no SavedModel: there it is
  the ONNX prefill and decoding step (`export_prefill`, `export_decode_step`) run by the
  greedy loop of `docs/export.md` in onnxruntime (numpy between the steps);
- `python`: `CausalLM.generate` on the prompts padded to the output width;
- `hub`: `GPT2CausalLM.generate` on the same inputs (the anchor).

Each is compiled and warmed up, then the three are timed in turn, round after round
(`measure.interleaved_seconds`), so a slow phase of the machine falls on all alike. Prints
tokens/s (medians) and the ratios to keras-hub (per round: min and max too), checks that the
exported tokens equal `model.generate`'s, and writes
`benchmarks/results/serving_speed_<backend>.json`. Never run by the test suite.
"""

import argparse
import json
import os
import pathlib
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import config as c  # noqa: E402
from benchmarks import measure  # noqa: E402
from benchmarks import models  # noqa: E402

BATCHES = (1, 8)


def prompts(batch, new_tokens):
    """`(prompt ids [B, PROMPT], padded inputs of generate [B, PROMPT + new_tokens])`."""
    rng = np.random.default_rng(c.SEED + batch)
    ids = rng.integers(1, c.VOCAB, size=(batch, c.PROMPT)).astype("int32")
    width = c.PROMPT + new_tokens
    padded = np.zeros((batch, width), "int32")
    padded[:, : c.PROMPT] = ids
    mask = np.zeros((batch, width), "int32")
    mask[:, : c.PROMPT] = 1
    return ids, {"token_ids": padded, "padding_mask": mask}


def onnx_generate(model, directory):
    """`generate(inputs)` over the model's ONNX prefill and decoding step (PyTorch): the
    greedy loop of `docs/export.md`, run by onnxruntime."""
    import onnxruntime

    from keras_xf.export import export_decode_step
    from keras_xf.export import export_prefill

    providers = ["CPUExecutionProvider"]
    prefill = onnxruntime.InferenceSession(
        export_prefill(model, str(directory / "prefill.onnx")), providers=providers)
    step = onnxruntime.InferenceSession(
        export_decode_step(model, str(directory / "step.onnx")), providers=providers)
    names = [node.name for node in step.get_inputs()]

    def generate(inputs):
        ids = np.array(inputs["token_ids"])
        mask = np.asarray(inputs["padding_mask"], bool)
        caches = prefill.run(None, {"token_ids": ids})
        for index in range(int(mask.sum(axis=1).min()), ids.shape[1]):
            logits, *caches = step.run(None, dict(zip(names, [
                ids[:, index - 1:index], np.array(index - 1, "int64"), *caches])))
            ids[:, index] = np.where(mask[:, index], ids[:, index], logits.argmax(-1))
        return {"token_ids": ids, "padding_mask": np.ones_like(mask)}  # no stop ids

    return generate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=c.NEW_TOKENS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    if c.PROMPT + args.new_tokens > c.SEQUENCE + c.NEW_TOKENS:
        parser.error(f"--new-tokens at most {c.SEQUENCE + c.NEW_TOKENS - c.PROMPT}")
    backend = keras.config.backend()
    keras.utils.set_random_seed(c.SEED)
    xf, hub = models.xf_causal_lm(), models.hub_causal_lm()
    exported = None
    if backend in ("tensorflow", "jax"):
        import tensorflow as tf

        path = pathlib.Path(tempfile.mkdtemp(prefix="serving_speed_")) / "lm"
        xf.export(str(path), verbose=False)
        exported = tf.saved_model.load(str(path))  # kept: it owns the variables
    elif backend == "torch":
        exported = onnx_generate(xf, pathlib.Path(tempfile.mkdtemp(prefix="serving_speed_")))

    results, table = [], []
    for batch in BATCHES:
        ids, inputs = prompts(batch, args.new_tokens)
        calls = {
            "python": lambda: xf.generate(dict(inputs), stop_token_ids=None),
            "hub": lambda: hub.generate(dict(inputs), stop_token_ids=None),
        }
        if backend == "torch":
            calls = {"exported": lambda: exported(inputs), **calls}
        elif exported is not None:
            request = {"token_ids": tf.constant(ids), "padding_mask": tf.ones_like(ids),
                       "max_length": tf.constant(c.PROMPT + args.new_tokens),
                       "stop_token_ids": tf.zeros([0], tf.int32), "seed": tf.constant(0)}
            calls = {"exported": lambda: exported.generate(request), **calls}
        outputs = {}
        for name, call in calls.items():  # compile and warm up
            measure.sync(call())
            outputs[name] = keras.tree.map_structure(np.asarray, call())
        for name, output in outputs.items():
            new = np.asarray(output["padding_mask"])[:, c.PROMPT:].sum()
            if new != batch * args.new_tokens:
                raise RuntimeError(f"{name}: expected {batch * args.new_tokens} new tokens, "
                                   f"got {new}")
        seconds = measure.interleaved_seconds(calls, repeats=args.repeats)
        tokens = batch * args.new_tokens
        result = {"batch": batch, "new_tokens": args.new_tokens}
        for name in calls:
            result[f"{name}_tokens_per_s"] = tokens / seconds[name]
            result[f"{name}_seconds_all"] = seconds[f"{name}_all"]
            if name != "hub":
                rounds = [h / t for t, h in zip(seconds[f"{name}_all"], seconds["hub_all"])]
                result[f"{name}_over_hub"] = seconds["hub"] / seconds[name]
                result[f"{name}_over_hub_rounds"] = rounds
        if exported is not None:
            result["exported_over_python"] = seconds["python"] / seconds["exported"]
            result["exported_tokens_equal_python"] = bool(np.array_equal(
                outputs["exported"]["token_ids"], outputs["python"]["token_ids"]))
        results.append(result)
        cells = []
        for name in ("exported", "python"):
            if name in calls:
                rounds = result[f"{name}_over_hub_rounds"]
                cells.append(f"{result[f'{name}_tokens_per_s']:,.0f} "
                             f"({result[f'{name}_over_hub']:.2f} [{min(rounds):.2f}, "
                             f"{max(rounds):.2f}])")
            else:
                cells.append("—")
        table.append(f"| {batch} | " + " | ".join(cells) + f" | {result['hub_tokens_per_s']:,.0f} |")
        print(table[-1], flush=True)
    header = ("| batch | exported `generate` tokens/s (÷ keras-hub [min, max]) | "
              "`model.generate` tokens/s (÷ keras-hub [min, max]) | keras-hub tokens/s |\n"
              "|---|---|---|---|")
    text = header + "\n" + "\n".join(table)
    load = os.getloadavg()
    cpu = measure.cpu_name()
    print(f"\nbackend {backend}, {cpu}, greedy, prompt {c.PROMPT}, {args.new_tokens} new "
          f"tokens, {args.repeats} rounds; load average {load[0]:.1f}\n{text}")
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" /
                          f"serving_speed_{backend}.json")
    output.write_text(json.dumps({
        "backend": backend, "cpu": cpu, "device": measure.device_name(), "note": args.note,
        "load_average_at_end": load, "prompt": c.PROMPT, "repeats": args.repeats,
        "exported": exported is not None, "results": results, "table": text,
        "median_exported_over_hub": statistics.median(
            [r["exported_over_hub"] for r in results]) if exported is not None else None,
    }, indent=2) + "\n")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
