"""Answer questions about handwritten digits with a `VisionLanguageLM` (prefix and cross-attention).

What it shows: building a `keras_xf.models.VisionLanguageLM` that generates text conditioned
on an image in its two forms, the image patches as a bidirectional prefix of a decoder-only
model (`fusion="prefix"`) and a text decoder cross-attending to an image encoder
(`fusion="cross_attention"`, optionally with Flamingo-style gated cross-attention,
`--gated`), training it with the loss on the answer tokens only, and answering held-out
questions with `generate` (greedy, KV cache, stop token).

The data needs no download: scikit-learn's `load_digits` (1797 images of 8x8 pixels) is
split into training and test images (seeded), and each image gets questions from a small
word-level vocabulary: "what digit is this ?" (answer "seven"), "is it even ?", "is it odd ?",
"is it larger than five ?", "is it smaller than two ?" and "is it a three ?" (answer "yes" or
"no"; the digits in questions range over zero to nine). An answer is right when the
generated words up to the end token equal the true answer exactly.

Run (any backend):

    KERAS_BACKEND=jax python examples/visual_qa.py --fusion both
    python examples/visual_qa.py --max-train-images 64 --epochs 1 --eval-images 8  # smoke test

Set-up that matters: learned text positions (`--position learned`) and token embeddings
scaled by √d (`VisionLanguageLM(embedding_scale=True)`; `--no-embedding-scale` turns it off).
Keras embeddings start at ±0.05 while a sinusoidal table's entries and the image states are of
size ~1, which drowns the question words: without these two, training may never learn to tell
"is it odd ?" from "is it even ?". Also an image encoder in front of the decoder in both forms
(`--vision-layers 2`; without one the prefix decoder must recognise the digit and reason about
it in the same two layers), AdamW with linear warm-up and cosine decay, and the loss on the
answer and end tokens only. Teacher-forced and generated answers agree, so the generation path
is not the limit.

With the default arguments both forms answer over 95% of the test questions exactly on every
backend, in a few minutes on a CPU.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.models import VisionLanguageLM  # noqa: E402

DIGITS = "zero one two three four five six seven eight nine".split()
WORDS = "what digit is this it even odd larger smaller than a ? yes no".split()
VOCABULARY = ["<pad>", "<sep>", "<end>"] + WORDS + DIGITS
TOKEN_ID = {word: index for index, word in enumerate(VOCABULARY)}
SEP, END = TOKEN_ID["<sep>"], TOKEN_ID["<end>"]
MAX_LENGTH = 10  # longest question (6 words) + <sep> + answer + <end>, with room to spare


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fusion", choices=("prefix", "cross_attention", "both"), default="both")
    parser.add_argument("--gated", action="store_true",
                        help="gated (Flamingo-style) cross-attention for the cross-attention form")
    parser.add_argument("--questions-per-image", type=int, default=6,
                        help="training questions drawn per training image")
    parser.add_argument("--max-train-images", type=int, default=None,
                        help="use at most this many training images (smoke tests)")
    parser.add_argument("--eval-images", type=int, default=None,
                        help="answer questions about at most this many test images")
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--intermediate-dim", type=int, default=128)
    parser.add_argument("--vision-layers", type=int, default=2,
                        help="image encoder layers in front of the decoder (both forms)")
    parser.add_argument("--position", default="learned",
                        choices=("learned", "sinusoidal", "rotary", "none"),
                        help="text positions")
    parser.add_argument("--no-embedding-scale", dest="embedding_scale", action="store_false",
                        help="token embeddings without the √d scale")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=2, help="Keras fit verbosity")
    return parser.parse_args(argv)


def load_images(test_fraction, seed):
    """Digit images `[N, 8, 8, 1]` in [0, 1] and labels, split into train and test."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError("This example reads scikit-learn's digits: pip install scikit-learn") from error
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(labels))
    test = int(round(len(labels) * test_fraction))
    return (images[order[test:]], labels[order[test:]]), (images[order[:test]], labels[order[:test]])


def ask(digit, kind, rng):
    """A question (list of words) of the given kind about `digit`, and its answer word."""
    yes_no = {True: "yes", False: "no"}
    if kind == 0:
        return "what digit is this ?".split(), DIGITS[digit]
    if kind == 1:
        return "is it even ?".split(), yes_no[digit % 2 == 0]
    if kind == 2:
        return "is it odd ?".split(), yes_no[digit % 2 == 1]
    other = int(rng.integers(10))
    if kind == 3:
        return ["is", "it", "larger", "than", DIGITS[other], "?"], yes_no[digit > other]
    if kind == 4:
        return ["is", "it", "smaller", "than", DIGITS[other], "?"], yes_no[digit < other]
    if rng.random() < 0.5:  # "is it a …": the true digit half of the time
        other = digit
    return ["is", "it", "a", DIGITS[other], "?"], yes_no[digit == other]


NUM_KINDS = 6


def make_training_set(images, labels, per_image, rng):
    """Inputs, next-token labels and weights (1 on the answer and the end token only)."""
    rows, pictures = [], []
    for image, digit in zip(images, labels):
        for kind in rng.permutation(NUM_KINDS)[:per_image] if per_image <= NUM_KINDS else (
                rng.integers(NUM_KINDS, size=per_image)):
            question, answer = ask(int(digit), int(kind), rng)
            rows.append([TOKEN_ID[w] for w in question] + [SEP, TOKEN_ID[answer], END])
            pictures.append(image)
    token_ids = np.zeros((len(rows), MAX_LENGTH), "int32")
    targets = np.zeros_like(token_ids)
    weights = np.zeros(token_ids.shape, "float32")
    for index, row in enumerate(rows):
        token_ids[index, : len(row)] = row
        targets[index, : len(row) - 1] = row[1:]
        answer_start = row.index(SEP)  # predicting the answer and the end token
        weights[index, answer_start : len(row) - 1] = 1.0
    x = {"images": np.stack(pictures), "token_ids": token_ids,
         "padding_mask": (token_ids != 0).astype("int32")}
    return x, targets, weights


def make_test_set(images, labels, rng):
    """One question of each kind per test image: prompts (question + <sep>) and answers."""
    prompts, answers, pictures = [], [], []
    for image, digit in zip(images, labels):
        for kind in range(NUM_KINDS):
            question, answer = ask(int(digit), kind, rng)
            prompts.append([TOKEN_ID[w] for w in question] + [SEP])
            answers.append(answer)
            pictures.append(image)
    return np.stack(pictures), prompts, answers


def answer_words(row, prompt_length):
    words = []
    for token in row[prompt_length:]:
        if token == END:
            break
        words.append(VOCABULARY[token])
    return " ".join(words)


def train_and_answer(fusion, args, train, test):
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x, y, weights = make_training_set(*train, args.questions_per_image, rng)
    model = VisionLanguageLM(
        vocabulary_size=len(VOCABULARY),
        image_shape=(8, 8, 1),
        patch_size=args.patch_size,
        num_layers=args.num_layers,
        hidden_dim=args.hidden_dim,
        num_heads=args.num_heads,
        intermediate_dim=args.intermediate_dim,
        max_sequence_length=MAX_LENGTH,
        fusion=fusion,
        gated_cross_attention=args.gated and fusion == "cross_attention",
        vision_layers=args.vision_layers,
        position=args.position,
        embedding_scale=args.embedding_scale,
        norm_placement="pre",
    )
    steps = -(-len(y) // args.batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(  # linear warm-up, then cosine decay
        0.0, decay_steps=max(1, args.epochs * steps), warmup_target=args.learning_rate,
        warmup_steps=min(100, args.epochs * steps // 10),
    )
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01, clipnorm=1.0))
    print(f"{fusion}: {len(y)} training questions, {model.count_params()} parameters")
    model.fit(x, y, sample_weight=weights, batch_size=args.batch_size, epochs=args.epochs,
              verbose=args.verbose)

    pictures, prompts, answers = make_test_set(*test, rng)
    correct, shown = 0, []
    chunk = 512
    for start in range(0, len(prompts), chunk):
        batch_prompts = prompts[start : start + chunk]
        generated = model.generate(
            {"images": pictures[start : start + chunk], "token_ids": batch_prompts},
            max_length=MAX_LENGTH, stop_token_ids=[END],
        )
        for row, prompt, answer in zip(generated, batch_prompts, answers[start : start + chunk]):
            given = answer_words(row, len(prompt))
            correct += given == answer
            if len(shown) < NUM_KINDS:
                shown.append((" ".join(VOCABULARY[t] for t in prompt[:-1]), given, answer))
    accuracy = correct / len(prompts)
    for question, given, answer in shown:
        print(f"  {question!r}: answered {given!r}, true {answer!r}")
    print(f"{fusion} exact-answer accuracy: {accuracy:.4f} ({len(prompts)} questions)")
    return accuracy


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    if keras.config.backend() == "torch" and "OMP_NUM_THREADS" not in os.environ:
        import torch

        # Small ops: thread hand-offs cost more than they save on a busy CPU.
        torch.set_num_threads(1)
    train, test = load_images(args.test_fraction, args.seed)
    if args.max_train_images:
        train = tuple(a[: args.max_train_images] for a in train)
    if args.eval_images:
        test = tuple(a[: args.eval_images] for a in test)
    print(f"backend {keras.config.backend()}, {len(train[1])} training / {len(test[1])} test "
          "images")
    fusions = ("prefix", "cross_attention") if args.fusion == "both" else (args.fusion,)
    results = {fusion: train_and_answer(fusion, args, train, test) for fusion in fusions}
    print("exact-answer accuracy: " + ", ".join(f"{k} {v:.4f}" for k, v in results.items()))
    print(f"time: {time.perf_counter() - started:.1f} s")
    return results


if __name__ == "__main__":
    main()
