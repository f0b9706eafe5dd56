"""Sparse mixture of experts against a dense FFN of the same active parameters and against
keras-hub's dense-compute MoE: training step time of one layer (survey §4.4, §5.6).

    KERAS_BACKEND=jax python -m benchmarks.moe [--tokens 2048] [--repeats 15]

Variants, all SwiGLU with width d = 256, one training step (forward, backward, SGD update) of
`Model(x -> layer(x))` on an MSE loss over a batch of `tokens` tokens (1 sequence):
- `moe`: `MixtureOfExperts(8 experts, f = 512, top_k = 2, capacity_factor = 1.25)`: sparse
  dispatch, each token through its 2 experts only;
- `moe_dropless`: the same with `capacity_factor=None` (block-padded dropless dispatch);
- `dense`: `FeedForward(hidden_dim = 2 · 512, "swiglu")`, the same active parameters per token;
- `hub_dense`: keras-hub's `MixtralSparseMoeBlock` (8 experts, f = 512, top-2), which runs every
  expert on every token and zeroes the unchosen ones (M·T expert evaluations).
The steps are timed in turn (moe, dense, hub, moe, ...) after warm-up, so that a change of
machine load affects all alike; the medians' ratios are printed with the drop rate of the
capacity-1.25 layer (random inputs, the router at its initialisation). Writes
`benchmarks/results/moe_<backend>.json`. Never run by the test suite.
"""

import argparse
import json
import pathlib
import time

D, F, EXPERTS, TOP_K, CAPACITY = 256, 512, 8, 2, 1.25


def build(variant, tokens):
    import keras

    from keras_xf.layers import FeedForward
    from keras_xf.layers import MixtureOfExperts

    if variant == "moe":
        layer = MixtureOfExperts(EXPERTS, F, top_k=TOP_K, activation="swiglu",
                                 capacity_factor=CAPACITY)
    elif variant == "moe_dropless":
        layer = MixtureOfExperts(EXPERTS, F, top_k=TOP_K, activation="swiglu",
                                 capacity_factor=None)
    elif variant == "dense":
        layer = FeedForward(TOP_K * F, activation="swiglu")
    else:
        from keras_hub.src.models.mixtral.mixtral_decoder import MixtralSparseMoeBlock

        layer = MixtralSparseMoeBlock(D, F, EXPERTS, top_k=TOP_K, router_aux_loss_coef=0.01)
    inputs = keras.Input((tokens, D), batch_size=1)
    outputs = layer(inputs)
    if isinstance(outputs, (tuple, list)):  # keras-hub's block also returns router logits
        outputs = outputs[0]
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    return model, layer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--variants", default="moe,moe_dropless,dense,hub_dense")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    import keras
    import numpy as np

    from benchmarks.measure import interleaved_seconds

    backend = keras.config.backend()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, args.tokens, D)).astype("float32")
    y = rng.standard_normal((1, args.tokens, D)).astype("float32")
    variants = args.variants.split(",")
    models, layers, steps = {}, {}, {}
    for variant in variants:
        models[variant], layers[variant] = build(variant, args.tokens)
        model = models[variant]
        steps[variant] = lambda model=model: model.train_on_batch(x, y)
        for _ in range(3):  # warm-up: compile / trace
            steps[variant]()
    start = time.perf_counter()
    timing = interleaved_seconds(steps, args.repeats)
    params = {v: int(sum(np.prod(w.shape) for w in models[v].trainable_weights))
              for v in variants}
    result = {"backend": backend, "tokens": args.tokens, "d": D, "f": F, "experts": EXPERTS,
              "top_k": TOP_K, "capacity_factor": CAPACITY, "repeats": args.repeats,
              "seconds": {v: timing[v] for v in variants},
              "seconds_all": {v: timing[f"{v}_all"] for v in variants},
              "trainable_params": params,
              "timed_wall_s": round(time.perf_counter() - start, 1)}
    if "moe" in variants:
        layer = layers["moe"]
        layer.statistics.reset_state()
        layer(x)
        stats = {k.split("/")[-1]: float(keras.ops.convert_to_numpy(v))
                 for k, v in layer.statistics.result().items()}
        result["drop_rate_at_1.25"] = stats["drop_rate"]
        result["expert_load_at_1.25"] = [stats[f"load_{i}"] for i in range(EXPERTS)]
    ratios = {}
    for variant in variants:
        for anchor in ("dense", "hub_dense"):
            if variant.startswith("moe") and anchor in variants:
                ratios[f"{variant}/{anchor}"] = timing[variant] / timing[anchor]
    result["ratios"] = ratios

    print(f"backend {backend}, {args.tokens} tokens, d={D}, f={F}, {EXPERTS} experts, top-{TOP_K}")
    for variant in variants:
        print(f"  {variant:13s} {timing[variant] * 1e3:9.1f} ms/step  "
              f"{params[variant]:>9,d} params")
    for name, value in ratios.items():
        print(f"  {name:24s} {value:.2f}")
    if "drop_rate_at_1.25" in result:
        print(f"  drop rate at capacity factor 1.25: {result['drop_rate_at_1.25']:.4f}")
    output = pathlib.Path(args.output or pathlib.Path(__file__).resolve().parent / "results"
                          / f"moe_{backend}.json")
    output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"time: {result['timed_wall_s']} s; wrote {output}")


if __name__ == "__main__":
    main()
