"""llama.cpp GGUF files → keras_xf `CausalLM`s, through the Hugging Face families."""

import warnings

from keras_xf.checkpoints.convert import load_checkpoint
from keras_xf.checkpoints.folder_preprocessor import task_preprocessor
from keras_xf.checkpoints.gguf_checkpoint import GGUFCheckpoint
from keras_xf.checkpoints.gguf_tokenizer import gguf_tokenizer


def _stop_ids(metadata, vocabulary_size, source):
    """The file's end ids: `tokenizer.ggml.eos_token_id`, then `eot_token_id` (the end of a
    chat turn, as Llama 3's `<|eot_id|>`), those inside the vocabulary."""
    ids = []
    for key in ("eos_token_id", "eot_token_id"):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))
    kept = [i for i in ids if 0 <= i < vocabulary_size]
    if len(kept) != len(ids):
        warnings.warn(f"The GGUF file {source} names end ids {ids}; those outside the "
                      f"vocabulary [0, {vocabulary_size}) are not stop ids.", stacklevel=3)
    return kept


def from_gguf(path, dtype=None, progress=None):
    """The keras_xf `CausalLM` of a llama.cpp GGUF file of the Llama family, every tensor
    dequantised, with the file's tokenizer as its preprocessor.

    The file's metadata becomes a Hugging Face config (`{arch}.embedding_length` →
    `hidden_size`, `attention.head_count_kv` → `num_key_value_heads`, `rope.freq_base` →
    the rotary base, no `output.weight` → tied embeddings, ...) and its tensors are read
    under Hugging Face names (`blk.0.attn_q.weight` → `model.layers.0.self_attn.q_proj.weight`),
    llama.cpp's changes reversed (the rotary permutation of Llama's query and key rows,
    Gemma's `1 + w` norm scales); the model is then built and loaded by the family's
    Hugging Face converter, as `from_huggingface` does for a folder.

    Args:
        path: a `.gguf` file whose `general.architecture` is `llama` (Llama, Mistral),
            `qwen2` or `gemma`, with tensors of the types in
            `gguf_checkpoint.SUPPORTED_TYPES` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
            Q5_1 and the K-quants Q2_K to Q6_K), dequantised by the `gguf` package.
        dtype: the model's dtype policy; the Keras default when `None`.
        progress: `True` shows a progress bar (Keras' `Progbar`, in megabytes) while the
            tensors load, `False` hides it; `None` shows it for weights over 100 MB.

    Returns:
        A `CausalLM` whose preprocessor holds a `HuggingFaceTokenizer` built from the file's
        `tokenizer.ggml.*` metadata (byte-level or SentencePiece BPE, its special tokens and
        chat template), when the file has a vocabulary; its stop ids are the file's end and
        end-of-turn ids.

    Raises:
        ValueError: a file that is not GGUF, truncated or damaged; an architecture or tensor
            type keras_xf does not read, named with what is supported; a missing, misshapen
            or unused tensor.

    Example:
    >>> model = from_gguf("path/to/model-Q8_0.gguf")  # doctest: +SKIP
    >>> model.generate(["To be, or"], max_length=32)  # doctest: +SKIP
    """
    checkpoint = GGUFCheckpoint(path)
    tokenizer = gguf_tokenizer(checkpoint.metadata, checkpoint.directory)
    model = load_checkpoint(checkpoint, dtype=dtype, progress=progress)
    model.stop_token_ids = _stop_ids(checkpoint.metadata, checkpoint.config["vocab_size"],
                                     checkpoint.directory)
    if tokenizer is not None:
        preprocessor = task_preprocessor(model, tokenizer)
        if preprocessor is not None:
            model.preprocessor = preprocessor
    return model
