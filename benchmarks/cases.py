"""Benchmark cases. Each runs in its own process (`python -m benchmarks.cases NAME`), so that
its peak memory is its own, and prints one JSON line. The `*_interleaved` cases are the A/B
pairs of `make bench`: both models in one process, timed in alternating rounds."""

import json
import os
import sys

import keras
import numpy as np

from benchmarks import config as c
from benchmarks import measure
from benchmarks import models
from benchmarks import report


def _training_data(steps):
    rng = np.random.default_rng(c.SEED)
    ids = rng.integers(1, c.VOCAB, size=(c.BATCH * steps, c.SEQUENCE + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    return x, ids[:, 1:]


def _fit(model, x, y):
    """One epoch of `model.fit` on arrays. keras-hub's `fit` batches arrays with grain or
    tf.data; where neither is installed (a GPU machine with JAX or PyTorch alone) its model is
    fitted by `keras.Model.fit`: the same train step, on Keras's own array adapter, as
    keras_xf's models."""
    fit = model.fit
    if model.__class__.__module__.startswith("keras_hub"):
        from keras_hub.src.utils import pipeline_model

        if pipeline_model.grain is None and pipeline_model.tf is None:
            fit = lambda *a, **k: keras.Model.fit(model, *a, **k)  # noqa: E731
    return fit(x, y, batch_size=c.BATCH, epochs=1, shuffle=False, verbose=0).history


def _fit_throughput(model, chunked_loss=False):
    """Tokens/s of `model.fit` over `TRAIN_STEPS` steps, after a warm-up fit that compiles."""
    x, y = _training_data(c.TRAIN_STEPS)
    models.compile_for_training(model, chunked_loss)
    rss_before = measure.peak_rss_mb()

    def fit():
        return _fit(model, x, y)

    seconds = measure.median_seconds(fit, warmup=1, repeats=c.REPEATS)
    tokens_per_second = c.TRAIN_STEPS * c.BATCH * c.SEQUENCE / seconds
    return {
        "tokens_per_s": tokens_per_second,
        "step_ms": 1000 * seconds / c.TRAIN_STEPS,
        "flops_per_s": tokens_per_second * models.training_flops_per_token(),
        "peak_rss_mb": measure.peak_rss_mb(),
        "rss_before_training_mb": rss_before,
    }


def train_xf():
    keras.utils.set_random_seed(c.SEED)
    return _fit_throughput(models.xf_causal_lm())


def train_interleaved():
    """Training tokens/s of both models in one process, their timed fits alternating for
    `ROUNDS` rounds, so that a slow or fast phase of the machine (or of the allocator) falls on
    both alike; the ratio is the median of the rounds' ratios. The matmul probe of model FLOP
    utilisation runs in the same process, before and after the rounds (the faster counts).
    Memory is measured by the separate `train_xf` / `train_hub` cases."""
    x, y = _training_data(c.TRAIN_STEPS)
    keras.utils.set_random_seed(c.SEED)
    # keras_xf twice: with the loss on its logits (the like-for-like pair) and with
    # `ChunkedCrossEntropy` (its own way to train a CausalLM without the [tokens, V] logits).
    contenders = {"xf": models.compile_for_training(models.xf_causal_lm()),
                  "xf_chunked": models.compile_for_training(models.xf_causal_lm(), True),
                  "hub": models.compile_for_training(models.hub_causal_lm())}
    fits = {name: (lambda m=model: _fit(m, x, y)) for name, model in contenders.items()}
    for fit in fits.values():
        for _ in range(1 + c.WARMUP):  # the first fit compiles
            measure.sync(fit())
    probes = [measure.peak_matmul_flops(c.MATMUL_SIZE, _probe_dtype())]
    seconds = measure.interleaved_seconds(fits, repeats=c.ROUNDS)
    probes.append(measure.peak_matmul_flops(c.MATMUL_SIZE, _probe_dtype()))
    tokens = c.TRAIN_STEPS * c.BATCH * c.SEQUENCE
    pair = report.pair_summary(seconds["xf_all"], seconds["hub_all"], tokens)
    chunked = report.pair_summary(seconds["xf_chunked_all"], seconds["hub_all"], tokens)
    flops = models.training_flops_per_token()
    return {
        "pairs": {"training": pair, "training_chunked_loss": chunked},
        "flops_per_token": flops,
        "matmul_probes_flops_per_s": probes,
        "peak_matmul_flops_per_s": max(probes),
        "matmul_probe_dtype": _probe_dtype(),
        "mfu": {side: report.model_flop_utilisation(pair[f"{side}_per_s"], flops, max(probes))
                for side in ("xf", "hub")},
    }


def train_xf_chunked():
    """`train_xf` with `ChunkedCrossEntropy`: its peak memory against `train_xf`'s."""
    keras.utils.set_random_seed(c.SEED)
    return _fit_throughput(models.xf_causal_lm(), chunked_loss=True)


def train_chunked_interleaved():
    """Training tokens/s of the same `CausalLM` with the plain loss on its logits and with
    `ChunkedCrossEntropy`, from the same weights, their timed fits alternating in one
    process (as `train_interleaved`)."""
    x, y = _training_data(c.TRAIN_STEPS)
    keras.utils.set_random_seed(c.SEED)
    weights = models.xf_causal_lm().get_weights()
    fits = {}
    for name, chunked in (("plain", False), ("chunked", True)):
        model = models.compile_for_training(models.xf_causal_lm(), chunked)
        model.set_weights(weights)
        fits[name] = (lambda m=model: m.fit(x, y, batch_size=c.BATCH, epochs=1, shuffle=False,
                                             verbose=0).history)
        measure.sync(fits[name]())
    seconds = measure.interleaved_seconds(fits, repeats=c.ROUNDS)
    tokens = c.TRAIN_STEPS * c.BATCH * c.SEQUENCE
    return {
        "plain_tokens_per_s": tokens / seconds["plain"],
        "chunked_tokens_per_s": tokens / seconds["chunked"],
        "round_ratios": [p / q for q, p in zip(seconds["chunked_all"], seconds["plain_all"])],
    }


def train_hub():
    keras.utils.set_random_seed(c.SEED)
    return _fit_throughput(models.hub_causal_lm())


def _generation_inputs(batch):
    rng = np.random.default_rng(c.SEED)
    length = c.PROMPT + c.NEW_TOKENS
    ids = np.zeros((batch, length), "int32")
    ids[:, : c.PROMPT] = rng.integers(1, c.VOCAB, size=(batch, c.PROMPT))
    mask = np.zeros((batch, length), "int32")
    mask[:, : c.PROMPT] = 1
    return {"token_ids": ids, "padding_mask": mask}


def _check_generated(output, batch):
    generated = np.asarray(output["padding_mask"])[:, c.PROMPT :].sum()
    if generated != batch * c.NEW_TOKENS:
        raise RuntimeError(f"expected {batch * c.NEW_TOKENS} new tokens, got {generated}")


def _generation_throughput(model):
    results = {}
    for batch in c.GENERATION_BATCHES:
        inputs = _generation_inputs(batch)

        def generate():
            return model.generate(dict(inputs), stop_token_ids=None)

        seconds = measure.median_seconds(generate, warmup=c.WARMUP, repeats=c.GENERATION_REPEATS)
        _check_generated(generate(), batch)
        results[f"batch_{batch}_tokens_per_s"] = batch * c.NEW_TOKENS / seconds
    return results


def generate_interleaved():
    """Greedy generation tokens/s of both models at each batch size of `GENERATION_BATCHES`,
    in one process: every round times keras_xf and keras-hub at each batch in turn."""
    keras.utils.set_random_seed(c.SEED)
    contenders = {"xf": models.xf_causal_lm(), "hub": models.hub_causal_lm()}
    calls = {}
    for batch in c.GENERATION_BATCHES:
        inputs = _generation_inputs(batch)
        for name, model in contenders.items():
            calls[f"{name}_{batch}"] = (
                lambda m=model, i=inputs: m.generate(dict(i), stop_token_ids=None))
    for key, call in calls.items():
        for _ in range(c.WARMUP):
            _check_generated(measure.sync(call()), int(key.split("_")[1]))
    seconds = measure.interleaved_seconds(calls, repeats=c.ROUNDS)
    return {"pairs": {
        f"batch_{batch}": report.pair_summary(seconds[f"xf_{batch}_all"],
                                              seconds[f"hub_{batch}_all"], batch * c.NEW_TOKENS)
        for batch in c.GENERATION_BATCHES
    }}


def generate_xf():
    keras.utils.set_random_seed(c.SEED)
    return _generation_throughput(models.xf_causal_lm())


def generate_hub():
    keras.utils.set_random_seed(c.SEED)
    return _generation_throughput(models.hub_causal_lm())


def _encoder_inputs(with_segments):
    rng = np.random.default_rng(c.SEED)
    shape = (c.ENCODER_BATCH * c.TRAIN_STEPS, c.ENCODER_SEQUENCE)
    x = {"token_ids": rng.integers(1, c.VOCAB, size=shape).astype("int32"),
         "padding_mask": np.ones(shape, "int32")}
    if with_segments:
        x["segment_ids"] = np.zeros(shape, "int32")
    return x


def _encoder_throughput(model, with_segments):
    x = _encoder_inputs(with_segments)

    def predict():
        return model.predict(x, batch_size=c.ENCODER_BATCH, verbose=0)

    seconds = measure.median_seconds(predict, warmup=1, repeats=c.REPEATS)
    return {"sequences_per_s": len(x["token_ids"]) / seconds}


def encode_xf():
    keras.utils.set_random_seed(c.SEED)
    return _encoder_throughput(models.xf_text_encoder(), with_segments=False)


def encode_hub():
    keras.utils.set_random_seed(c.SEED)
    return _encoder_throughput(models.hub_text_encoder(), with_segments=True)


def encode_interleaved():
    """Encoder sequences/s (`predict`) of both encoders in one process, alternating rounds."""
    keras.utils.set_random_seed(c.SEED)
    contenders = {"xf": (models.xf_text_encoder(), _encoder_inputs(with_segments=False)),
                  "hub": (models.hub_text_encoder(), _encoder_inputs(with_segments=True))}
    calls = {name: (lambda m=model, x=x: m.predict(x, batch_size=c.ENCODER_BATCH, verbose=0))
             for name, (model, x) in contenders.items()}
    for call in calls.values():
        for _ in range(1 + c.WARMUP):  # the first call compiles
            measure.sync(call())
    seconds = measure.interleaved_seconds(calls, repeats=c.ROUNDS)
    sequences = len(contenders["xf"][1]["token_ids"])
    return {"pairs": {"encoder": report.pair_summary(seconds["xf_all"], seconds["hub_all"],
                                                     sequences)}}


def _probe_dtype():
    """The matmul probe's dtype: the compute dtype of the policy the models run under."""
    return keras.config.dtype_policy().compute_dtype


def peak_matmul():
    return {"flops_per_s": measure.peak_matmul_flops(c.MATMUL_SIZE, _probe_dtype())}


def _torch_on_gpu():
    import torch

    return torch.cuda.is_available()


def train_xf_bf16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    keras.utils.set_random_seed(c.SEED)
    if keras.config.backend() == "torch" and not _torch_on_gpu():
        # Without bf16 hardware (AVX512-BF16, AMX) eager PyTorch emulates bf16 matmuls slowly:
        # time fewer steps so that the case ends in minutes.
        c.TRAIN_STEPS, c.REPEATS = c.TORCH_BF16_STEPS, 1
    return _fit_throughput(models.xf_causal_lm())


def _text_batches(steps, length=None):
    """Character ids of the default corpus (Shakespeare, or the standard library's
    docstrings), cut into `steps` batches of `length`-token next-token examples (`length`:
    `CURVE_SEQUENCE` by default)."""
    length = c.CURVE_SEQUENCE if length is None else length
    from keras_xf.datasets import load_text_corpus

    text, _ = load_text_corpus()
    ids = np.frombuffer(text.encode("utf-8"), dtype="uint8").astype("int32")
    count = c.BATCH * steps
    rng = np.random.default_rng(c.SEED)
    starts = rng.integers(0, len(ids) - length - 1, size=count)
    windows = np.stack([ids[s : s + length + 1] for s in starts])
    x = {"token_ids": windows[:, :-1], "padding_mask": np.ones_like(windows[:, :-1])}
    return x, windows[:, 1:]


def bf16_curves():
    """float32 and `mixed_bfloat16` training of the same model from the same weights on the
    same text for `CURVE_STEPS` steps: how closely the two loss curves agree."""
    x, y = _text_batches(c.CURVE_STEPS)
    keras.utils.set_random_seed(c.SEED)
    weights = models.xf_causal_lm().get_weights()
    curves = {}
    for policy in ("float32", "mixed_bfloat16"):
        keras.config.set_dtype_policy(policy)
        keras.utils.set_random_seed(c.SEED)
        model = models.compile_for_training(models.xf_causal_lm())
        model.set_weights(weights)
        means = []
        callback = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: means.append(float(logs["loss"]))
        )
        model.fit(x, y, batch_size=c.BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[callback])
        # Keras reports the running mean of the epoch's loss; recover each step's loss.
        means = np.array(means)
        steps = np.arange(1, len(means) + 1)
        curves[policy] = means * steps - np.concatenate([[0.0], means[:-1] * steps[:-1]])
    keras.config.set_dtype_policy("float32")
    window = 20
    smooth = {k: np.convolve(v, np.ones(window) / window, mode="valid") for k, v in curves.items()}
    difference = np.abs(smooth["mixed_bfloat16"] - smooth["float32"]) / smooth["float32"]
    return {
        "steps": c.CURVE_STEPS,
        "sequence_length": c.CURVE_SEQUENCE,
        "float32_first_loss": float(curves["float32"][0]),
        "float32_last_loss": float(smooth["float32"][-1]),
        "bf16_last_loss": float(smooth["mixed_bfloat16"][-1]),
        "max_relative_difference": float(difference.max()),
        "float32_curve": curves["float32"].round(4).tolist(),
        "bf16_curve": curves["mixed_bfloat16"].round(4).tolist(),
    }


CASES = {
    "peak_matmul": peak_matmul,
    "train_xf": train_xf,
    "train_hub": train_hub,
    "train_interleaved": train_interleaved,
    "generate_interleaved": generate_interleaved,
    "encode_interleaved": encode_interleaved,
    "train_xf_chunked": train_xf_chunked,
    "train_chunked_interleaved": train_chunked_interleaved,
    "train_xf_bf16": train_xf_bf16,
    "generate_xf": generate_xf,
    "generate_hub": generate_hub,
    "encode_xf": encode_xf,
    "encode_hub": encode_hub,
    "bf16_curves": bf16_curves,
}


if __name__ == "__main__":
    # python -m benchmarks.cases NAME ['{"DROPOUT": 0.1, ...}']: settings of config.py to override
    name = sys.argv[1]
    c.apply(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    keras.config.set_dtype_policy(c.POLICY)
    if c.FLASH_ATTENTION:
        keras.config.enable_flash_attention()
    result = CASES[name]()
    result.update({"case": name, "backend": keras.config.backend(), "pid": os.getpid()})
    print("BENCHMARK_RESULT " + json.dumps(result))
