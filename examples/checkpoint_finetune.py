"""Load a Hugging Face checkpoint, swap a survey variant in, fine-tune, generate, write back.

    KERAS_BACKEND=jax python examples/checkpoint_finetune.py --checkpoint path/to/llama
    KERAS_BACKEND=torch python examples/checkpoint_finetune.py        # a stand-in checkpoint

The checkpoint is a local folder (`config.json`, safetensors, `tokenizer.json`) of a Llama,
Mistral or Qwen2 model. Without `--checkpoint` the example writes a small random Llama and a
byte-level BPE tokenizer trained on Shakespeare into a temporary folder first (this needs
`transformers` and `tokenizers`; nothing is downloaded).

Then it
1. loads the model with `from_huggingface` and the tokenizer with `HuggingFaceTokenizer`;
2. gives every attention layer a sliding window (`LocalPattern`, survey §5.1): the same
   weights in a model whose attention sees only the last `--window` tokens;
3. fine-tunes it for a few steps with `fit` on Shakespeare;
4. generates from a string prompt;
5. writes it back with `to_huggingface`: a Llama with a sliding window is a Mistral, so the
   folder is a `MistralForCausalLM` checkpoint, and when `transformers` is installed the
   example loads it there and checks that the logits agree.
"""

import argparse
import copy
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from _stand_in import write_stand_in  # noqa: E402
from keras_xf.datasets.shakespeare import load_text_corpus  # noqa: E402
from keras_xf.layers import LocalPattern  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from keras_xf.checkpoints import HuggingFaceTokenizer  # noqa: E402
from keras_xf.checkpoints import from_huggingface  # noqa: E402
from keras_xf.checkpoints import to_huggingface  # noqa: E402
from keras_xf.training import language_model_examples  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a Llama, Mistral or Qwen2 checkpoint folder")
    parser.add_argument("--output", default=os.path.join(tempfile.gettempdir(),
                                                         "keras_xf_finetuned"))
    parser.add_argument("--window", type=int, default=32, help="sliding-window size")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sequence-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt", default="ROMEO:")
    return parser.parse_args()


def with_sliding_window(model, window):
    """The same model, its attention limited to the last `window` keys (same weights)."""
    config = copy.deepcopy(model.get_config())
    block = config["backbone"]["config"]["block"]
    mixer = block["config"]["mixer"]["config"]
    mixer["pattern"] = keras.saving.serialize_keras_object(LocalPattern(window_left=window - 1))
    variant = CausalLM.from_config(config)
    variant.set_weights(model.get_weights())
    return variant


def main():
    args = parse_args()
    text, corpus = load_text_corpus()
    folder = args.checkpoint
    if folder is None:
        folder = tempfile.mkdtemp(prefix="keras_xf_stand_in_")
        write_stand_in(folder, text)
        print(f"Wrote a stand-in Llama checkpoint to {folder}")

    model = from_huggingface(folder)
    tokenizer = HuggingFaceTokenizer(folder)
    print(f"Loaded {model.count_params():,} parameters on {keras.config.backend()}")

    model = with_sliding_window(model, args.window)
    ids = tokenizer(text[:200_000])
    x, y, weights = language_model_examples(ids, args.sequence_length)
    count = args.steps * args.batch_size
    model.compile(optimizer=keras.optimizers.AdamW(1e-3))
    history = model.fit(x={k: v[:count] for k, v in x.items()}, y=y[:count],
                        sample_weight=weights[:count], batch_size=args.batch_size, epochs=1)
    print(f"Fine-tuned {args.steps} steps on {corpus}: loss {history.history['loss'][-1]:.3f}")

    generated = model.generate(tokenizer([args.prompt]), max_length=48)
    print("Generated:", repr(tokenizer.detokenize(generated)[0]))

    architecture = to_huggingface(model, args.output)
    print(f"Wrote a {architecture} checkpoint to {args.output}")
    try:
        import torch
        import transformers
    except ImportError:
        return
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(args.output).eval()
    sample = np.asarray(x["token_ids"][:2])
    with torch.no_grad():
        expected = reloaded(torch.tensor(sample, dtype=torch.long)).logits.numpy()
    actual = keras.ops.convert_to_numpy(model({"token_ids": sample,
                                               "padding_mask": np.ones_like(sample)}))
    difference = np.abs(actual - expected).max()
    print(f"transformers loads it as {type(reloaded).__name__}: largest logit difference "
          f"{difference:.2e}")
    if difference > 1e-3:
        raise SystemExit("The written checkpoint does not reproduce the model's logits.")


if __name__ == "__main__":
    main()
