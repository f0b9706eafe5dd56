"""The benchmark configuration: one GPT-2-like decoder and one BERT-like encoder.

Both libraries get the same sizes, the same dropout, the same optimizer (AdamW), the same loss
and the same data. Dropout is 0, the performance issue's protocol (`--dropout 0.1` gives GPT-2's
and BERT's default). `python -m benchmarks.run --quick` overrides the names in `QUICK`.
"""

VOCAB = 8192
LAYERS = 4
WIDTH = 256
HEADS = 4
FFN = 1024
SEQUENCE = 256
BATCH = 8
DROPOUT = 0.0
LEARNING_RATE = 1e-4

# Cached generation: a 32-token prompt and 128 new tokens, greedy, batch 1 and 8.
PROMPT = 32
NEW_TOKENS = 128
GENERATION_BATCHES = (1, 8)

# Encoder inference.
ENCODER_BATCH = 8
ENCODER_SEQUENCE = 256

# Timing: untimed warm-up calls, then the median of timed repeats.
WARMUP = 2
TRAIN_STEPS = 8  # optimizer steps per timed repeat
REPEATS = 3
GENERATION_REPEATS = 5  # generation is noisier and cheap to repeat
ROUNDS = 5  # alternating rounds of each A/B pair in the `*_interleaved` cases (at least 3)
MATMUL_SIZE = 2048  # the matmul probe of model FLOP utilisation: a MATMUL_SIZE² float32 matmul
TORCH_BF16_STEPS = 2  # eager PyTorch bf16 on a CPU without AVX512-BF16 takes seconds a step

# bf16 against float32: loss curves over this many steps of the same model, on sequences of
# CURVE_SEQUENCE characters (shorter than SEQUENCE so that 2 x 200 steps take minutes on CPU).
CURVE_STEPS = 200
CURVE_SEQUENCE = 64

# `ChunkedCrossEntropy`: tokens per chunk of the loss over the tied output (a [1024, 8192]
# float32 block, 32 MB, in place of the batch's [2048, 8192]).
LOSS_CHUNK = 1024

SEED = 0

# Precision and attention kernel of both models (`--policy`, `--flash-attention`): the Keras
# dtype policy set before the models are built, and Keras's global flash-attention switch
# (`keras.config.enable_flash_attention()`), which keras-hub's and keras_xf's attention both
# follow. The matmul probe of model FLOP utilisation runs in the policy's compute dtype.
POLICY = "float32"
FLASH_ATTENTION = False

# `--quick`: the same cases, small enough to smoke-test the harness in minutes (not a measurement).
QUICK = {
    "SEQUENCE": 64,
    "TRAIN_STEPS": 1,
    "WARMUP": 1,
    "REPEATS": 1,
    "GENERATION_REPEATS": 1,
    "ROUNDS": 3,
    "PROMPT": 8,
    "NEW_TOKENS": 8,
    "ENCODER_SEQUENCE": 64,
    "MATMUL_SIZE": 512,
    "CURVE_STEPS": 30,
}


def apply(overrides):
    """Sets the names of `overrides` (a dict) in this module, for the case about to run."""
    unknown = sorted(k for k in overrides if k not in globals() or not k.isupper())
    if unknown:
        raise ValueError(f"unknown benchmark settings {unknown}; expected names from "
                         f"benchmarks/config.py such as 'DROPOUT', 'ROUNDS'")
    globals().update(overrides)
