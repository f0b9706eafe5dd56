"""Deep post-norm language models on Shakespeare: plain post-norm against DeepNorm and the
depth-scaled initialisation (survey §4.2.1, §4.2.2).

For each depth (24 and 48 layers by default) it trains three character-level `CausalLM`s of
the same width, from the same data order, and draws their training-loss curves to a PNG:

- `post`: post-norm `LNorm(F(z) + z)` with Keras's default initialisation;
- `post+ds_init`: the same residual, each sub-layer `l` initialised by Xavier with
  `gain = 1/√l` (`depth_initialization={"method": "sub_layer_depth", "b": 0.5}`);
- `deep_norm`: DeepNorm, `LNorm(α·z + F(z))` with `α = (2L)^{1/4}` and the value, output
  and feedforward projections initialised with gain `β = (8L)^{-1/4}` (`deep_norm`).

and, as a reference, `pre`: pre-norm `F(LNorm(z)) + z` with a final norm (`--variants`).
A run whose loss turns non-finite stops and is reported as diverged; a run whose validation
loss stays at the unigram model's (the character frequencies alone) is reported as not
learning.

    KERAS_BACKEND=jax python examples/deep_post_norm.py            # docs/images/deep_post_norm.png
    KERAS_BACKEND=jax python examples/deep_post_norm.py --depths 6 --steps 20 --output /tmp/p.png
"""

import argparse
import json
import math
import time

import keras
import numpy as np

import keras_xf
from keras_xf.training import language_model_examples

VARIANTS = ("post", "post+ds_init", "deep_norm", "pre")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 48])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS[:3]), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=240, help="training steps per model")
    parser.add_argument("--log-every", type=int, default=10, help="steps per loss point")
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-3,
                        help="Adam, constant, no warm-up (where deep post-norm struggles)")
    parser.add_argument("--max-characters", type=int, default=400_000)
    parser.add_argument("--output", default="docs/images/deep_post_norm.png")
    parser.add_argument("--results", default=None,
                        help="also write the curves to this JSON file")
    parser.add_argument("--draw-from", nargs="+", default=None,
                        help="draw the curves of earlier --results files instead of training "
                             "(e.g. one run per depth, in parallel)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def build_model(variant, num_layers, args):
    residual = {"norm_placement": "pre" if variant == "pre" else "post"}
    initialization = None
    if variant == "post+ds_init":
        initialization = {"method": "sub_layer_depth", "a": 1.0, "b": 0.5}
    elif variant == "deep_norm":
        constants = keras_xf.layers.deep_norm(decoder_layers=num_layers)["decoder"]
        residual = constants.residual_arguments()
        initialization = constants.depth_initialization()
    block = keras_xf.layers.TransformerBlock(
        mixer=keras_xf.layers.MultiHeadAttention(num_heads=args.num_heads),
        feedforward=keras_xf.layers.FeedForward(4 * args.hidden_dim, activation="gelu"),
        **residual,
    )
    return keras_xf.models.CausalLM(
        vocabulary_size=256,
        num_layers=num_layers,
        hidden_dim=args.hidden_dim,
        block=block,
        max_sequence_length=args.sequence_length,
        # RoPE: an added sinusoid table drowns the small token embeddings of a narrow model,
        # which then sits at the unigram loss for hundreds of steps at any depth.
        position="rotary",
        depth_initialization=initialization,
    )


def train(variant, num_layers, data, args):
    """Per-point mean training losses (one point every `log_every` steps) and the final
    validation loss; the losses stop at the first non-finite one."""
    keras.utils.set_random_seed(args.seed)
    model = build_model(variant, num_layers, args)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate))
    x, y, valid_x, valid_y = data
    points = max(1, args.steps // args.log_every)
    history = model.fit(
        x, y, batch_size=args.batch_size, epochs=points, steps_per_epoch=args.log_every,
        callbacks=[keras.callbacks.TerminateOnNaN()], shuffle=False, verbose=0,
    )
    losses = [float(v) for v in history.history["loss"]]
    finite = all(math.isfinite(v) for v in losses) and len(losses) == points
    valid = float("nan")
    if finite:
        valid = float(model.evaluate(valid_x, valid_y, batch_size=args.batch_size, verbose=0,
                                     return_dict=True)["loss"])
    return losses, valid, finite


def draw(results, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depths = sorted({key[0] for key in results if key != "unigram"})
    figure, axes = plt.subplots(1, len(depths), figsize=(5 * len(depths), 3.6), squeeze=False)
    for axis, depth in zip(axes[0], depths):
        for variant in VARIANTS:
            if (depth, variant) not in results:
                continue
            losses, _, finite = results[(depth, variant)]
            steps = np.arange(1, len(losses) + 1) * args.log_every
            label = variant if finite else f"{variant} (diverged)"
            axis.plot(steps, losses, label=label, color=f"C{VARIANTS.index(variant)}")
        axis.axhline(results["unigram"], color="gray", linestyle=":", label="unigram model")
        axis.set_title(f"{depth}-layer CausalLM, d={args.hidden_dim}, Adam {args.learning_rate}")
        axis.set_xlabel("training step")
        axis.set_ylabel("training loss (nats/char)")
        axis.set_ylim(bottom=0)
        axis.legend()
    figure.tight_layout()
    figure.savefig(args.output, dpi=100)


def save_results(results, path):
    entries = [{"depth": key[0], "variant": key[1], "losses": value[0], "valid": value[1],
                "finite": value[2]} for key, value in results.items() if key != "unigram"]
    with open(path, "w") as file:
        json.dump({"unigram": results["unigram"], "runs": entries}, file)


def load_results(paths):
    results = {}
    for path in paths:
        with open(path) as file:
            saved = json.load(file)
        results["unigram"] = saved["unigram"]
        for run in saved["runs"]:
            results[(run["depth"], run["variant"])] = (run["losses"], run["valid"], run["finite"])
    return results


def main():
    args = parse_args()
    if args.draw_from:
        draw(load_results(args.draw_from), args)
        print(f"wrote {args.output}")
        return
    text, corpus = keras_xf.datasets.load_text_corpus()
    ids = np.frombuffer(text[: args.max_characters].encode("utf-8"), np.uint8).astype("int32")
    split = int(len(ids) * 0.95)
    length = args.sequence_length
    x, y, _ = language_model_examples(ids[:split], length)
    valid_x, valid_y, _ = language_model_examples(ids[split:], length)
    order = np.random.default_rng(args.seed).permutation(len(y))
    x = {key: value[order] for key, value in x.items()}
    data = (x, y[order], {k: v[:64] for k, v in valid_x.items()}, valid_y[:64])
    print(f"backend: {keras.config.backend()}; corpus: {corpus}, {len(ids):,} characters; "
          f"width {args.hidden_dim}, {args.steps} steps of {args.batch_size}x{length}, "
          f"Adam {args.learning_rate}")

    counts = np.bincount(ids[:split], minlength=256) + 1.0
    unigram = float(-np.log(counts / counts.sum())[data[3]].mean())
    print(f"unigram model validation loss: {unigram:.3f}")
    results = {"unigram": unigram}
    start = time.perf_counter()
    for depth in args.depths:
        for variant in args.variants:
            losses, valid, finite = train(variant, depth, data, args)
            results[(depth, variant)] = (losses, valid, finite)
            status = "diverged"
            if finite:
                status = "learns" if valid < unigram - 0.05 else "does not learn"
            print(f"{depth} layers, {variant}: first loss {losses[0]:.3f}, final training "
                  f"loss {losses[-1]:.3f}, validation loss {valid:.3f} ({status})")
            if args.results:  # after each model, so that a cut-short run keeps its curves
                save_results(results, args.results)
    draw(results, args)
    print(f"wrote {args.output}")
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
