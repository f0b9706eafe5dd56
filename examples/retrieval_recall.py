"""Recall beyond the local window with a retrieval memory (survey §5.2.3).

What it shows: a `keras_xf.models.CausalLM` that reads a stream chunk by chunk recalls what
it saw several chunks back when one of its blocks is a `RetrievalMemoryAttention` (local
causal attention over the chunk, joined through a learned gate with attention over the
`--top-k` pairs retrieved from a memory of the `--memory-length` positions before it), and
cannot when the same block attends to its chunk only.

The task is multi-query associative recall (as in `examples/long_range.py`) laid across
chunks. A document of `--chunks` chunks of `--chunk-length` tokens starts with `--pairs`
key-value pairs `k₁ v₁ k₂ v₂ …`, then a blank filler token repeated, and ends with the same
keys in a new order, each followed by its value. The pairs lie in the first chunk and the
queries in the last, so the answer is always out of the local window, and out of
Transformer-XL's memory of one chunk too. Each row of a batch continues the stream of the
row before it (batch `c` holds chunk `c` of every row), and the memory is carried from batch
to batch (`stateful=True`); the loss and the accuracy count only the query keys.

Both models have two blocks: a causal `DepthwiseConvolution` (kernel 4), which brings each
key to its value's position (so a stored position holds the pair), then the attention block:
`RetrievalMemoryAttention` (**retrieval**), the same `MultiHeadAttention` over the chunk
alone (**local**), or Transformer-XL's `MemoryAttention` with a memory of one chunk
(**memory**), which reaches the chunk before and no further.

    KERAS_BACKEND=jax python examples/retrieval_recall.py
    python examples/retrieval_recall.py --steps 8 --eval-documents 4 --verbose 0  # smoke test

It prints each model's held-out recall accuracy (chance is 1/32) and `time:`.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_xf.layers import DepthwiseConvolution  # noqa: E402
from keras_xf.layers import FeedForward  # noqa: E402
from keras_xf.layers import MemoryAttention  # noqa: E402
from keras_xf.layers import MultiHeadAttention  # noqa: E402
from keras_xf.layers import RetrievalMemoryAttention  # noqa: E402
from keras_xf.layers import RotaryEmbedding  # noqa: E402
from keras_xf.layers import TransformerBlock  # noqa: E402
from keras_xf.layers.memory import reset_memories  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.training import StreamMemory  # noqa: E402

MODELS = ("retrieval", "local", "memory")
# Token ids: padding, one blank filler token, then disjoint key and value vocabularies.
PAD, BLANK, NUM_KEYS, NUM_VALUES = 0, 1, 32, 32
FIRST_KEY = 2
FIRST_VALUE = FIRST_KEY + NUM_KEYS
VOCABULARY_SIZE = FIRST_VALUE + NUM_VALUES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--chunk-length", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=4, help="chunks per document")
    parser.add_argument("--pairs", type=int, default=4, help="key-value pairs per document")
    parser.add_argument("--memory-length", type=int, default=None,
                        help="positions in the retrieval memory (default: (chunks - 1) * "
                        "chunk-length)")
    parser.add_argument("--top-k", type=int, default=8, help="pairs retrieved per query")
    parser.add_argument("--steps", type=int, default=2000, help="training batches (chunks)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows of the stream")
    parser.add_argument("--eval-documents", type=int, default=16,
                        help="held-out documents per row")
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=2, help="Keras fit verbosity")
    args = parser.parse_args(argv)
    if args.pairs <= 0 or 2 * args.pairs > args.chunk_length or args.pairs > NUM_KEYS:
        parser.error("need 0 < 2 * pairs <= chunk-length and pairs <= 32. Received: "
                     f"--pairs {args.pairs}, --chunk-length {args.chunk_length}")
    if args.chunks < 2:
        parser.error(f"--chunks must be at least 2. Received: --chunks {args.chunks}")
    if args.memory_length is None:
        args.memory_length = (args.chunks - 1) * args.chunk_length
    return args


def make_stream(args, documents, rng):
    """`(inputs, labels, weights)` laid out as a stream of `batch_size` rows, each of
    `documents` documents: batch `c` (rows `c·B … c·B + B − 1`) is chunk `c` of every row.
    The weights are 1 at the query keys, whose label is the recalled value."""
    rows, length = args.batch_size, args.chunks * args.chunk_length
    count, pairs = rows * documents, args.pairs
    keys = np.argsort(rng.random((count, NUM_KEYS)), axis=1)[:, :pairs] + FIRST_KEY
    values = rng.integers(FIRST_VALUE, FIRST_VALUE + NUM_VALUES, size=(count, pairs))
    tokens = np.full((count, length), BLANK)
    tokens[:, 0:2 * pairs:2], tokens[:, 1:2 * pairs:2] = keys, values
    order = np.argsort(rng.random((count, pairs)), axis=1)
    start = length - 2 * pairs
    tokens[:, start::2] = keys[np.arange(count)[:, None], order]
    tokens[:, start + 1::2] = values[np.arange(count)[:, None], order]
    labels = np.concatenate([tokens[:, 1:], np.zeros((count, 1), tokens.dtype)], axis=1)
    weights = np.zeros((count, length), "float32")
    weights[:, start::2] = 1.0

    def as_stream(array):  # [rows · documents, length] -> [chunks in all · rows, chunk]
        per_row = array.reshape(rows, documents * args.chunks, args.chunk_length)
        return np.ascontiguousarray(per_row.transpose(1, 0, 2)).reshape(-1, args.chunk_length)

    inputs = as_stream(tokens).astype("int32")
    return ({"token_ids": inputs, "padding_mask": np.ones_like(inputs)},
            as_stream(labels).astype("int32"), as_stream(weights))


def build(args, name):
    attention = MultiHeadAttention(num_heads=args.num_heads, position=RotaryEmbedding())
    mixer = attention
    if name == "retrieval":
        mixer = RetrievalMemoryAttention(attention, memory_length=args.memory_length,
                                         top_k=args.top_k, stateful=True,
                                         batch_size=args.batch_size)
    elif name == "memory":
        mixer = MemoryAttention(attention, memory_length=args.chunk_length, stateful=True,
                                batch_size=args.batch_size)
    convolution = TransformerBlock(DepthwiseConvolution(kernel_size=4, causal=True),
                                   FeedForward(2 * args.hidden_dim), norm_placement="pre")
    block = TransformerBlock(mixer, FeedForward(2 * args.hidden_dim), norm_placement="pre")
    model = CausalLM(vocabulary_size=VOCABULARY_SIZE, num_layers=2,
                     hidden_dim=args.hidden_dim, block=[convolution, block], position="none",
                     max_sequence_length=2 * args.chunk_length)
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=0.01,
                                                   clipnorm=1.0),
                  weighted_metrics=["sparse_categorical_accuracy"])
    return model


def train_and_evaluate(args, name, train, test):
    keras.utils.set_random_seed(args.seed)
    model = build(args, name)
    x, y, w = train
    start = time.perf_counter()
    model.fit(x, y, sample_weight=w, batch_size=args.batch_size, shuffle=False,
              epochs=1, steps_per_epoch=args.steps, callbacks=[StreamMemory()],
              verbose=args.verbose)
    seconds = time.perf_counter() - start
    reset_memories(model)
    x, y, w = test
    result = model.evaluate(x, y, sample_weight=w, batch_size=args.batch_size, verbose=0,
                            callbacks=[StreamMemory()], return_dict=True)
    accuracy = result["sparse_categorical_accuracy"]
    print(f"{name:<9} held-out recall accuracy {accuracy:.3f} ({args.steps} steps, "
          f"{seconds:.0f} s)", flush=True)
    return accuracy


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    train_documents = -(-args.steps // args.chunks)
    train = make_stream(args, train_documents, rng)
    test = make_stream(args, args.eval_documents, rng)
    print(f"backend: {keras.config.backend()}; documents of {args.chunks} chunks of "
          f"{args.chunk_length} tokens, {args.pairs} pairs; retrieval from a memory of "
          f"{args.memory_length}, "
          f"top {args.top_k}", flush=True)
    for name in args.models.split(","):
        train_and_evaluate(args, name, train, test)
    print(f"time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
