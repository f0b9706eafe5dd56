"""Fine-tune a Llama folder with LoRA, then reload the adapters on another backend and in PEFT.

    KERAS_BACKEND=jax python examples/lora_finetune.py --checkpoint path/to/llama
    KERAS_BACKEND=torch python examples/lora_finetune.py        # a stand-in checkpoint

The checkpoint is a local folder (`config.json`, safetensors, `tokenizer.json`) of a Llama,
Mistral or Qwen2 model, the layout whose PEFT module names keras_xf maps. Without
`--checkpoint` the example writes a small random Llama and a byte-level BPE tokenizer trained
on Shakespeare into a temporary folder first (this needs `transformers` and `tokenizers`;
nothing is downloaded).

Then it
1. loads the model with `from_huggingface` and calls `enable_lora(rank, alpha=...,
   targets=...)`: adapters `A`, `B` on the projections named, everything else frozen, as the
   trainable count of `summary()` shows;
2. fine-tunes the adapters for a few steps with `fit` on Shakespeare, printing the loss of
   the training windows before and after;
3. writes the adapters alone with `save_lora_weights` (a `.lora.h5` file);
4. runs itself in a subprocess on another backend (JAX → PyTorch; PyTorch and TensorFlow →
   JAX), which loads the checkpoint again, calls `load_lora_weights`, computes the logits of
   a few windows and greedily continues a prompt: both backends' logits and tokens are
   printed and must agree;
5. writes a PEFT adapter folder with `to_peft`; when `peft` is installed, loads it with
   `peft.PeftModel` on the `transformers` base model and checks that the logits agree.

Result on the stand-in with the default settings (JAX, reloaded on PyTorch): 32,768 of
590,464 parameters trainable (rank 8 on the seven projections of both blocks), the training
loss 6.96 -> 6.69 after 40 steps, the adapters moving the logits by up to 2.46; the reloaded
model's logits within 5e-7 of JAX's with the same 16 greedy tokens (line breaks: 40 steps
teach a random model little beyond Shakespeare's short lines), and `peft`'s within 5e-7.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from _stand_in import write_stand_in  # noqa: E402
from keras_xf.checkpoints import HuggingFaceTokenizer  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_peft  # noqa: E402
from keras_xf.datasets.shakespeare import load_text_corpus  # noqa: E402
from keras_xf.training import language_model_examples  # noqa: E402

# The backend that reloads the adapters, for each backend that trains them.
OTHER_BACKEND = {"jax": "torch", "torch": "jax", "tensorflow": "jax"}
ADAPTERS = "adapters.lora.h5"
PROBE = "probe.npz"  # the windows and the prompt that both backends run
RELOADED = "reloaded.npz"  # the other backend's results
# The largest logit difference accepted between backends and libraries, relative to the
# largest logit (at least 1).
TOLERANCE = 1e-3


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", "--folder", dest="checkpoint",
                        help="a Llama, Mistral or Qwen2 checkpoint folder")
    parser.add_argument("--output", default=os.path.join(tempfile.gettempdir(),
                                                         "keras_xf_lora"),
                        help="folder for the adapter file and the PEFT adapter")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--targets", nargs="+",
                        default=["query", "key", "value", "attention_output", "ffn_gate",
                                 "ffn_hidden", "ffn_output"],
                        help="the projections that get adapters (enable_lora's targets)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--prompt", default="ROMEO:")
    parser.add_argument("--new-tokens", type=int, default=16)
    # The stand-in checkpoint's sizes (without --checkpoint).
    parser.add_argument("--vocabulary-size", type=int, default=1024)
    parser.add_argument("--hidden-dim", type=int, default=128)
    parser.add_argument("--intermediate-dim", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-key-value-heads", type=int, default=2)
    parser.add_argument("--reload", metavar="FOLDER",
                        help="load the checkpoint and FOLDER's adapter file on this backend "
                             "and write the results beside them (the example runs itself so "
                             "on the other backend)")
    return parser.parse_args()


def results(model, probe, new_tokens):
    """`(logits of the probe's windows, greedy continuation of its prompt)` as numpy."""
    windows = probe["token_ids"]
    logits = keras.ops.convert_to_numpy(
        model({"token_ids": windows, "padding_mask": np.ones_like(windows)}))
    prompt = [list(probe["prompt_ids"])]
    tokens = model.generate(prompt, max_length=len(probe["prompt_ids"]) + new_tokens,
                            stop_token_ids=None)
    return logits, np.asarray(keras.ops.convert_to_numpy(tokens)).reshape(-1)


def reload(args):
    """Step 4 on this backend: the base checkpoint, the adapter file, the probe's results."""
    model = from_huggingface(args.checkpoint)
    model.load_lora_weights(os.path.join(args.reload, ADAPTERS))
    probe = np.load(os.path.join(args.reload, PROBE))
    logits, tokens = results(model, probe, args.new_tokens)
    np.savez(os.path.join(args.reload, RELOADED), logits=logits, tokens=tokens)


def reload_on(backend, args):
    """Runs this script with `--reload` on `backend`; its results."""
    command = [sys.executable, os.path.abspath(__file__), "--checkpoint", args.checkpoint,
               "--reload", args.output, "--new-tokens", str(args.new_tokens)]
    run = subprocess.run(command, env=dict(os.environ, KERAS_BACKEND=backend),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"Reloading on {backend} failed:\n{run.stderr[-4000:]}")
    reloaded = np.load(os.path.join(args.output, RELOADED))
    return reloaded["logits"], reloaded["tokens"]


def peft_logits(checkpoint, adapter, windows):
    """The logits of `windows` from `peft.PeftModel` over the `transformers` base, or `None`
    when `peft` is not installed."""
    try:
        import peft
        import torch
        import transformers
    except ImportError:
        return None
    base = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)
    adapted = peft.PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return adapted(torch.tensor(windows, dtype=torch.long)).logits.float().numpy()


def main():
    args = parse_args()
    if args.reload:
        reload(args)
        return
    started = time.perf_counter()
    backend = keras.config.backend()
    keras.utils.set_random_seed(0)  # the adapters' initial A
    text, corpus = load_text_corpus()
    if args.checkpoint is None:
        args.checkpoint = tempfile.mkdtemp(prefix="keras_xf_stand_in_")
        write_stand_in(args.checkpoint, text, vocabulary_size=args.vocabulary_size,
                       hidden_dim=args.hidden_dim, intermediate_dim=args.intermediate_dim,
                       num_layers=args.num_layers, num_heads=args.num_heads,
                       num_key_value_heads=args.num_key_value_heads)
        print(f"Wrote a stand-in Llama checkpoint to {args.checkpoint}")
    os.makedirs(args.output, exist_ok=True)

    # The next-token task, and the windows and prompt that the backends and PEFT compare.
    model = from_huggingface(args.checkpoint)
    tokenizer = HuggingFaceTokenizer(args.checkpoint)
    ids = tokenizer(text[:200_000])
    x, y, weights = language_model_examples(ids, args.sequence_length)
    count = args.steps * args.batch_size
    x, y, weights = {k: v[:count] for k, v in x.items()}, y[:count], weights[:count]
    probe = {"token_ids": x["token_ids"][:2],
             "prompt_ids": np.asarray(tokenizer([args.prompt])[0], "int32")}
    base_logits, _ = results(model, probe, 1)

    # 1. LoRA on the loaded model: the adapters alone are trainable.
    model.enable_lora(args.rank, alpha=args.alpha, targets=args.targets)
    printed = []
    model.summary(print_fn=lambda line, *rest, **kwargs: printed.append(line))
    counts = [line.strip() for block in printed for line in block.splitlines()
              if "params:" in line]
    print(f"Enabled LoRA (rank {args.rank}, alpha {args.alpha:g}) on {args.targets} "
          f"({backend}). summary(): " + "; ".join(counts))

    # 2. Fine-tuning; the loss of the training windows before and after.
    model.compile(optimizer=keras.optimizers.AdamW(args.learning_rate))

    def loss():
        return model.evaluate(x, y, sample_weight=weights, batch_size=args.batch_size,
                              verbose=0, return_dict=True)["loss"]

    before = loss()
    model.fit(x, y, sample_weight=weights, batch_size=args.batch_size, epochs=1, verbose=0)
    after = loss()
    print(f"Fine-tuned {args.steps} steps on {corpus}: loss {before:.3f} -> {after:.3f}")
    if not after < before:
        raise SystemExit("Fine-tuning the adapters did not lower the loss.")
    logits, tokens = results(model, probe, args.new_tokens)
    tolerance = TOLERANCE * max(1.0, np.abs(logits).max())
    print(f"The adapters move the logits by up to {np.abs(logits - base_logits).max():.2e}")

    # 3. The adapters alone.
    path = os.path.join(args.output, ADAPTERS)
    model.save_lora_weights(path)
    print(f"Saved the adapters to {path} ({os.path.getsize(path):,} bytes)")

    # 4. The same adapters on another backend: the same logits and tokens.
    np.savez(os.path.join(args.output, PROBE), **probe)
    other = OTHER_BACKEND[backend]
    other_logits, other_tokens = reload_on(other, args)
    difference = np.abs(logits - other_logits).max()
    print(f"Reloaded on {other}: largest logit difference from {backend} {difference:.2e}")
    print(f"Generated on {backend}: {tokens.tolist()} "
          f"{tokenizer.detokenize(tokens[None])[0]!r}")
    print(f"Generated on {other}: {other_tokens.tolist()} "
          f"{tokenizer.detokenize(other_tokens[None])[0]!r}")
    if difference > tolerance or not np.array_equal(tokens, other_tokens):
        raise SystemExit(f"The adapters reloaded on {other} do not reproduce the model.")

    # 5. A PEFT adapter of the same model.
    adapter = os.path.join(args.output, "peft")
    to_peft(model, adapter)
    print(f"Wrote a PEFT adapter to {adapter}")
    expected = peft_logits(args.checkpoint, adapter, probe["token_ids"])
    if expected is not None:
        difference = np.abs(logits - expected).max()
        print(f"peft loads it on the transformers model: largest logit difference "
              f"{difference:.2e}")
        if difference > tolerance:
            raise SystemExit("The PEFT adapter does not reproduce the model's logits.")
    print(f"time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
