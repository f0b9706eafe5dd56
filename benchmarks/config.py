"""The benchmark configuration: one GPT-2-like decoder and one BERT-like encoder.

Both libraries get the same sizes, the same dropout (GPT-2's and BERT's default of 0.1), the
same optimizer (AdamW), the same loss and the same data.
"""

VOCAB = 8192
LAYERS = 4
WIDTH = 256
HEADS = 4
FFN = 1024
SEQUENCE = 256
BATCH = 8
DROPOUT = 0.1
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
INTERLEAVED_REPEATS = 5  # timed fits of each model, alternating, in `train_interleaved`
TORCH_BF16_STEPS = 2  # eager PyTorch bf16 on a CPU without AVX512-BF16 takes seconds a step

# bf16 against float32: loss curves over this many steps of the same model, on sequences of
# CURVE_SEQUENCE characters (shorter than SEQUENCE so that 2 x 200 steps take minutes on CPU).
CURVE_STEPS = 200
CURVE_SEQUENCE = 64

# `ChunkedCrossEntropy`: tokens per chunk of the loss over the tied output (a [1024, 8192]
# float32 block, 32 MB, in place of the batch's [2048, 8192]).
LOSS_CHUNK = 1024

SEED = 0
