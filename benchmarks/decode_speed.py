"""Time per generated token against the context length: recurrent mixers keep a fixed-size
state, a key-value cache grows with the context (survey §5.5.2, §5.5.3).

    KERAS_BACKEND=jax python -m benchmarks.decode_speed [--contexts 256,1024,4096]

A tiny `CausalLM` (2 layers, width 64, 4 heads, FFN 128, vocabulary 256) per mixer; for each
context `n`, greedy `CausalLM.generate` from a one-token prompt to `n` tokens (compiled and
warmed up first), so the loop decodes `n − 1` tokens one at a time against a cache of `n`
positions. The time per token is the median over repeats of the loop's time divided by
`n − 1`: a key-value cache is read in full at every step (its cost grows with `n`), a
recurrent state is not. The cache size is that of `CausalLM.init_cache(1, n)`, in bytes.
Prints a table with the ratios to the shortest context and writes
`benchmarks/results/decode_speed_<backend>.json`. Never run by the test suite.
"""

import argparse
import json
import os
import pathlib
import statistics
import time

CONTEXTS = (256, 1024, 4096)
VOCABULARY, LAYERS, WIDTH, HEADS, FFN = 256, 2, 64, 4, 128


def _attention():
    from keras_xf.layers import MultiHeadAttention

    return MultiHeadAttention(num_heads=HEADS, causal=True)


def _linear(decay):
    def make():
        from keras_xf.layers import LinearAttention

        return LinearAttention(HEADS, feature_map="elu", decay=decay, causal=True)

    return make


def _ssm(selective):
    def make():
        from keras_xf.layers import StateSpaceMixer

        return StateSpaceMixer(16, selective=selective)

    return make


def _layer(name, *args, **kwargs):
    def make():
        import keras_xf.layers

        return getattr(keras_xf.layers, name)(*args, **kwargs)

    return make


# name -> factory of a causal mixer with the cache protocol. One line per mixer.
MIXERS = {
    "attention_kv_cache": _attention,
    "linear": _linear(None),
    "gated_linear": _linear("gated"),
    "ssm": _ssm(False),
    "selective_ssm": _ssm(True),
    "depthwise_conv": _layer("DepthwiseConvolution", 4, causal=True),
    "lightweight_conv": _layer("LightweightConvolution", 31, HEADS, causal=True),
    "dynamic_conv": _layer("DynamicConvolution", 31, HEADS, causal=True),
    "conformer_conv": _layer("ConformerConvolution", 31, causal=True, normalization="layer_norm"),
    "lstm": _layer("RecurrentMixer", "lstm"),
    "average_attention": _layer("AverageAttention"),
}


def build_lm(mixer, max_length):
    from keras_xf.layers import FeedForward
    from keras_xf.layers import TransformerBlock
    from keras_xf.models import CausalLM

    block = TransformerBlock(MIXERS[mixer](), FeedForward(FFN), norm_placement="pre")
    return CausalLM(vocabulary_size=VOCABULARY, num_layers=LAYERS, hidden_dim=WIDTH,
                    num_heads=HEADS, intermediate_dim=FFN, max_sequence_length=max_length,
                    block=block, norm_placement="pre")


def cache_bytes(cache):
    import keras
    import numpy as np

    return int(sum(np.prod(keras.ops.shape(c)) *
                   np.dtype(keras.backend.standardize_dtype(c.dtype)).itemsize
                   for c in keras.tree.flatten(cache)))


def measure(mixer, context, repeats):
    import keras
    import numpy as np

    lm = build_lm(mixer, context)
    prompt = np.ones((1, 1), "int32")

    def run():
        return keras.tree.map_structure(np.asarray, lm.generate(prompt, max_length=context))

    run()  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) / (context - 1))
    return {"mixer": mixer, "context": context, "ms_per_token": 1e3 * statistics.median(times),
            "ms_per_token_all": [1e3 * t for t in times],
            "cache_bytes": cache_bytes(lm.init_cache(1, context))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    parser.add_argument("--mixers", default=",".join(MIXERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--note", default="", help="recorded with the results (e.g. load)")
    parser.add_argument("--output", help="JSON path (default benchmarks/results/...)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    backend = keras.config.backend()
    contexts = [int(n) for n in args.contexts.split(",")]
    mixers = args.mixers.split(",")
    unknown = [m for m in mixers if m not in MIXERS]
    if unknown:
        parser.error(f"unknown mixers {unknown}; choose from {list(MIXERS)}")
    results = []
    for mixer in mixers:
        for context in contexts:
            result = measure(mixer, context, args.repeats)
            print(f"  {mixer} context {context}: {result['ms_per_token']:.2f} ms/token, "
                  f"cache {result['cache_bytes']:,} B", flush=True)
            results.append(result)
    by_key = {(r["mixer"], r["context"]): r for r in results}
    lines = ["| mixer | " + " | ".join(f"{n:,}: ms/token (cache B)" for n in contexts) +
             f" | t({contexts[-1]:,}) / t({contexts[0]:,}) |", "|---" * (len(contexts) + 2) + "|"]
    for mixer in mixers:
        cells = [f"{by_key[mixer, n]['ms_per_token']:.2f} ({by_key[mixer, n]['cache_bytes']:,})"
                 for n in contexts]
        ratio = by_key[mixer, contexts[-1]]["ms_per_token"] / by_key[mixer, contexts[0]]["ms_per_token"]
        lines.append(f"| {mixer} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    text = "\n".join(lines)
    load = os.getloadavg()
    print(f"\nbackend {backend}, greedy generate, batch 1, {LAYERS} layers of width {WIDTH}, "
          f"one-token prompt; load average {load[0]:.1f}\n" + text)
    output = pathlib.Path(args.output or pathlib.Path(__file__).parent / "results" /
                          f"decode_speed_{backend}.json")
    output.write_text(json.dumps({"backend": backend, "load_average_at_end": load,
                                  "note": args.note, "results": results, "table": text},
                                 indent=2) + "\n")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
