"""Hugging Face checkpoint folders ↔ keras_xf task models."""

import json
import os
import warnings

import numpy as np

from keras_xf.checkpoints import bert
from keras_xf.checkpoints import bloom
from keras_xf.checkpoints import gemma
from keras_xf.checkpoints import gpt2
from keras_xf.checkpoints import llama
from keras_xf.checkpoints import mamba
from keras_xf.checkpoints import mixtral
from keras_xf.checkpoints import t5
from keras_xf.checkpoints import vit
from keras_xf.checkpoints.deferred_variables import built_without_values
from keras_xf.checkpoints.deferred_variables import initialize_unfilled
from keras_xf.checkpoints.folder_preprocessor import folder_preprocessor
from keras_xf.checkpoints.generation_config import generation_config
from keras_xf.checkpoints.safetensors_folder import SafetensorsFolder
from keras_xf.checkpoints.tokenizer_files import model_tokenizer
from keras_xf.checkpoints.tokenizer_files import write_tokenizer_files
from keras_xf.models import GenerativeTask
from keras_xf.checkpoints.sentence_transformers import SentenceTransformersFolder
from keras_xf.checkpoints.sentence_transformers import is_sentence_transformers_folder
from keras_xf.checkpoints.tensor_map import Entry
from keras_xf.checkpoints.tensor_map import TensorMap
from keras_xf.checkpoints.tensor_map import copy
from keras_xf.checkpoints.tensor_map import linear
from keras_xf.models.encoders.text_encoder import TextEncoder

# Each family: its architecture names (`ARCHITECTURES`, and `MODEL_TYPES` mapping a config's
# `model_type` to one), `build(config, dtype)`, `build_from_folder(folder, dtype)` (the model
# may depend on the tensors present: T5 1.1's own `lm_head`), `tensor_map(model, config)` and
# `hf_config(model)`.
FAMILIES = {"gpt2": gpt2, "llama": llama, "gemma": gemma, "mixtral": mixtral, "t5": t5,
            "vit": vit, "bert": bert, "bloom": bloom, "mamba": mamba}
# Architectures of a known family that keras_xf refuses, with the reason.
REFUSED = {**bert.REFUSED}


def _family_of(config, directory):
    """The family module and the architecture name of a checkpoint's config (its
    `architectures`, or its `model_type` when a writer left the architectures out)."""
    architectures = config.get("architectures") or []
    if not architectures:
        kind = config.get("model_type")
        architectures = [f.MODEL_TYPES[kind] for f in FAMILIES.values() if kind in f.MODEL_TYPES]
    for architecture in architectures:
        if architecture in REFUSED:
            raise ValueError(f"The checkpoint in {directory} is a {architecture}: "
                             f"{REFUSED[architecture]}")
    for family in FAMILIES.values():
        if any(a in family.ARCHITECTURES for a in architectures):
            return family, next(a for a in architectures if a in family.ARCHITECTURES)
    known = sorted(a for f in FAMILIES.values() for a in f.ARCHITECTURES)
    raise ValueError(
        f"The checkpoint in {directory} is a {architectures or config.get('model_type')!r}, "
        f"which keras_xf does not load. Loadable architectures: {known}"
    )


def from_huggingface(directory, dtype=None, progress=None):
    """The keras_xf task model of a local Hugging Face checkpoint folder, with every tensor
    loaded.

    Args:
        directory: a folder with `config.json` and `model.safetensors` (or sharded files with
            `model.safetensors.index.json`), as written by `save_pretrained`; or a
            sentence-transformers folder (`modules.json`, as `SentenceTransformer.save`
            writes it).
        dtype: the model's dtype policy (`"float32"`, `"bfloat16"`, `"mixed_bfloat16"`, ...);
            the Keras default when `None`. Tensors are cast to it as they are loaded.
        progress: `True` shows a progress bar (Keras' `Progbar`, in megabytes) while the
            tensors load, `False` hides it; `None` shows it for weights over 100 MB.

    A generating task's default stop ids (`stop_token_ids`, used by `generate` unless told
    otherwise) are the checkpoint's end ids: `generation_config.json`'s `eos_token_id` (an
    int or a list), else `config.json`'s.

    Returns:
        The task model, built from the model classes: a `CausalLM` (GPT-2; Llama, Mistral
        and Qwen2; Gemma; Mixtral; BLOOM; Mamba), a `Seq2SeqLM` (T5 1.0 and 1.1), a
        `VisionClassifier` (`ViTForImageClassification`), a `VisionBackbone` (a `ViTModel`
        saved without pooler: `last_hidden_state`) or a `TextEncoder` (BERT, RoBERTa,
        XLM-RoBERTa: its output is the pooler's, or the `[CLS]` state for a folder saved
        without pooler; its backbone's the last hidden state). A sentence-transformers
        folder gives a `TextEncoder` whose pooling, projection (a `Dense` module) and
        normalisation are its modules', whose preprocessor cuts texts at the folder's
        `max_seq_length` and lowercases them when it says `do_lower_case`, and whose
        `encode` applies the folder's prompts (`config_sentence_transformers.json`) as
        sentence-transformers does.
        When the folder has a `tokenizer.json`, a text task carries a preprocessor built
        from it (`keras_xf.preprocessing`: the folder's tokenizer, special tokens and chat
        template), so `generate`, `fit` and `predict` take text; without one, ids. A
        generating task's default stop ids are the folder's end ids
        (`generation_config.json`, else `config.json`).

    Raises:
        ValueError: a folder of another architecture, or a tensor that is missing, left
            unused, or of a shape that does not fit, named in the message; a
            sentence-transformers module or pooling mode keras_xf cannot express, named
            (pooling that leaves the prompt out, `include_prompt=False`, among them).

    Example:
    >>> model = from_huggingface("path/to/llama")  # doctest: +SKIP
    >>> model.generate(["To be, or"], max_length=32)  # doctest: +SKIP
    """
    # A folder's own length limit, which its library truncates to (sentence-transformers'
    # `max_seq_length`); none for other folders.
    max_length, lowercase = None, False
    if is_sentence_transformers_folder(directory):
        modules = SentenceTransformersFolder(directory)
        model = _load_sentence_transformer(modules, dtype, progress)
        tokenizer_directory = modules.transformer_directory
        max_length = modules.settings["max_seq_length"]
        lowercase = modules.settings["do_lower_case"]
    else:
        folder = SafetensorsFolder(directory)
        model = load_checkpoint(folder, dtype=dtype, progress=progress)
        if isinstance(model, GenerativeTask):
            model.stop_token_ids = end_token_ids(folder.directory, folder.config,
                                                 model.token_vocabulary_sizes())
        tokenizer_directory = os.fspath(directory)
    preprocessor = folder_preprocessor(model, tokenizer_directory, max_length=max_length,
                                       truncate=max_length is not None, lowercase=lowercase)
    if preprocessor is not None:
        model.preprocessor = preprocessor
    return model


def end_token_ids(directory, config, vocabulary_sizes=None):
    """The end ids of a checkpoint folder, a list: `generation_config.json`'s `eos_token_id`
    (an int or a list) when it names one, else `config.json`'s (`config`), else none. Ids
    outside the vocabularies in `vocabulary_sizes` (`{input: size}`) are left out with a
    warning (a generation setting should not stop a model from loading)."""
    ids = None
    path = os.path.join(directory, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as file:
            ids = json.load(file).get("eos_token_id")
    if ids is None:
        ids = config.get("eos_token_id")
    if ids is None:
        return []
    ids = [int(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]
    limit = min(vocabulary_sizes.values()) if vocabulary_sizes else None
    kept = [i for i in ids if limit is None or 0 <= i < limit]
    if len(kept) != len(ids):
        warnings.warn(f"The checkpoint in {directory} names end ids {ids}; those outside the "
                      f"vocabulary [0, {limit}) are not stop ids.", stacklevel=2)
    return kept


def _load_sentence_transformer(modules, dtype, progress):
    """The `TextEncoder` of a `SentenceTransformersFolder`: the transformer's backbone, then
    the modules' pooling, projection and normalisation. The transformer's `pooler.*` tensors
    are left out, as sentence-transformers reads only its token states."""
    folder = SafetensorsFolder(modules.transformer_directory)
    family, architecture = _family_of(folder.config, folder.directory)
    dense = modules.dense
    if family is not bert:
        raise ValueError(
            f"The transformer of {modules.directory} is a {architecture}; keras_xf loads "
            f"sentence-transformers folders of the encoders {list(bert.ARCHITECTURES)}.")
    try:
        with built_without_values():
            base = bert.build(folder.config, dtype=dtype, pooler=False)
            model = TextEncoder(
                base.backbone, pooling=modules.pooling,
                projection_dim=dense["out_features"] if dense else None,
                projection_activation=dense["activation"] if dense else None,
                normalize=modules.normalize, prompts=modules.settings["prompts"],
                default_prompt_name=modules.settings["default_prompt_name"], dtype=dtype)
        backbone_map = family.tensor_map(model.backbone, folder.config)
        TensorMap(backbone_map.entries, ignored=backbone_map.ignored + [r"pooler\..*"],
                  alias=backbone_map.alias).load(folder, architecture, progress)
        if dense:
            entries = [linear("linear.weight", model.projection.kernel)]
            if dense["bias"]:
                entries.append(copy("linear.bias", model.projection.bias))
            else:  # a bias-free Linear: the projection's bias is zero
                zeros = np.zeros(model.projection.bias.shape, "float32")
                entries.append(Entry([], [model.projection.bias], lambda a: [zeros],
                                     lambda a: []))
            TensorMap(entries).load(SafetensorsFolder(dense["directory"]), "Dense")
    finally:
        initialize_unfilled()
    return model


def load_checkpoint(folder, dtype=None, progress=None):
    """The task model of a `SafetensorsFolder` or an in-memory `ArrayCheckpoint` (see
    `from_huggingface`; `progress` as there)."""
    family, architecture = _family_of(folder.config, folder.directory)
    try:
        # Variables take their first value from the checkpoint: no random weights beside it.
        with built_without_values():
            model = family.build_from_folder(folder, dtype=dtype)
        family.tensor_map(model, folder.config).load(folder, architecture, progress)
    finally:
        initialize_unfilled()
    return model


def to_huggingface(model, directory, family=None, dtype=None):
    """Writes `model` as a Hugging Face checkpoint folder (`config.json`, `model.safetensors`)
    that `transformers` loads with equal outputs; with the text files of its preprocessor,
    so `transformers`' pipeline runs on the folder.

    A model whose preprocessor holds a `HuggingFaceTokenizer` also gets its tokenizer as
    `transformers` 5 saves one (`tokenizer.json` without padding or truncation,
    `tokenizer_config.json` with the special tokens and the model's `model_max_length`,
    `chat_template.jinja` when it has a template); a generating model gets a `generation_config.json` with its stop ids (else its
    tokenizer's end token) and its tokenizer's start and padding ids (`generation_config`).
    A model with neither a preprocessor nor stop ids gets the config and the weights alone.

    Args:
        model: a keras_xf task model that one of the families expresses (or, for BERT, a
            non-causal `TransformerBackbone`).
        directory: the folder to write (created if needed).
        family: a key of `FAMILIES` (`"gpt2"`, `"llama"`, `"gemma"`, `"mixtral"`, `"t5"`,
            `"vit"`, `"bert"`, `"bloom"`, `"mamba"`); by default the first family that
            expresses `model`.
        dtype: NumPy dtype name of the written tensors (`"float32"`, `"float16"`); the
            variables' own dtype when `None` (bfloat16 variables are written as float32).

    Returns:
        The architecture written (`"MistralForCausalLM"`, ...), as its config names it.

    Example:
    >>> model = from_huggingface("path/to/llama")  # doctest: +SKIP
    >>> to_huggingface(model, "path/to/out")  # doctest: +SKIP
    'LlamaForCausalLM'
    """
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise ImportError("Writing checkpoints needs the safetensors package: "
                          "pip install 'keras-xf[checkpoints]'") from None

    names = [family] if family is not None else list(FAMILIES)
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}. Received: family={family!r}")
    reasons = {}
    for name in names:
        try:
            config = FAMILIES[name].hf_config(model)
        except ValueError as error:
            reasons[name] = str(error)
            continue
        tensors = FAMILIES[name].tensor_map(model, config).tensors(dtype)
        tensors = {k: v.astype("float32") if v.dtype.name == "bfloat16" else v
                   for k, v in tensors.items()}
        config["dtype"] = str(next(iter(tensors.values())).dtype)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as file:
            json.dump(config, file, indent=2)
        save_file(tensors, os.path.join(directory, "model.safetensors"),
                  metadata={"format": "pt"})
        write_text_files(model, directory)
        return config["architectures"][0]
    raise ValueError(f"No checkpoint family expresses this {type(model).__name__}: {reasons}")


def write_text_files(model, directory):
    """Writes the tokenizer files and the generation config of `model` (see
    `to_huggingface`) into `directory`, when it carries them."""
    tokenizer = model_tokenizer(model)
    if tokenizer is not None:
        # The model's bound on its inputs (learned positions), when it has one.
        write_tokenizer_files(tokenizer, directory,
                              model_max_length=model.backbone.max_sequence_length)
    generation = generation_config(model)
    if generation is not None:
        with open(os.path.join(directory, "generation_config.json"), "w") as file:
            json.dump(generation, file, indent=2)
