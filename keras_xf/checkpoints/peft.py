"""PEFT LoRA adapter folders ↔ the adapters of a keras_xf model (Hu et al. 2021).

A PEFT folder holds `adapter_config.json` (`peft_type: "LORA"`, `r`, `lora_alpha`,
`target_modules`, ...) and `adapter_model.safetensors` with, for each adapted
`torch.nn.Linear` of the base model, `base_model.model.<module>.lora_A.weight [r, in]` and
`.lora_B.weight [out, r]`; PEFT computes `W x + (lora_alpha / r)·B A x` (`lora_alpha/√r` with
`use_rslora`). keras_xf's adapters hold the same matrices transposed, with the projections'
own axes: `A [*input axes, r]`, `B [r, *output axes]` (`LoRAEinsumDense`, `Dense`).

Families: the Llama layout (`LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`),
whose modules are `model.layers.<i>.self_attn.{q,k,v,o}_proj`,
`model.layers.<i>.mlp.{gate,up,down}_proj` and the untied `lm_head` (keras_xf's targets
`"query"` … `"ffn_output"` and `"output_head"`).
"""

import json
import math
import os

import keras
import numpy as np

from keras_xf.checkpoints import llama

# keras_xf target ↔ (the block's sub-layer, the PEFT module name).
MODULES = {
    "query": ("self_attn", "q_proj"), "key": ("self_attn", "k_proj"),
    "value": ("self_attn", "v_proj"), "attention_output": ("self_attn", "o_proj"),
    "ffn_gate": ("mlp", "gate_proj"), "ffn_hidden": ("mlp", "up_proj"),
    "ffn_output": ("mlp", "down_proj"),
}
# The untied output projection (`TokenEmbedding.enable_lora`) ↔ `lm_head`.
HEAD = ("output_head", "lm_head")
TARGETS = {**{module: target for target, (_, module) in MODULES.items()}, HEAD[1]: HEAD[0]}
PREFIX = "base_model.model"
# Settings of a PEFT LoRA config that keras_xf's adapters cannot express, with the value
# that they can.
_PLAIN = {"bias": "none", "use_dora": False, "lora_bias": False, "layers_to_transform": None,
          "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
          "fan_in_fan_out": False, "layer_replication": None, "target_parameters": None,
          "trainable_token_indices": None}


def _layer(block, target):
    """The projection of `block` that `target` names."""
    return {"query": lambda: block.mixer.query_dense, "key": lambda: block.mixer.key_dense,
            "value": lambda: block.mixer.value_dense,
            "attention_output": lambda: block.mixer.output_dense,
            "ffn_gate": lambda: block.feedforward.gate_dense,
            "ffn_hidden": lambda: block.feedforward.hidden_dense,
            "ffn_output": lambda: block.feedforward.output_dense}[target]()


def _blocks(model):
    """The blocks of a Llama-layout `model`, or a `ValueError` naming why it is not one."""
    try:
        llama.hf_config(model)
    except ValueError as error:
        raise ValueError("PEFT adapters are read and written for models of the Llama layout "
                         f"(Llama, Mistral, Qwen2). Received: a {type(model).__name__} that "
                         f"is none: {error}") from None
    return model.backbone.transformer_stack.blocks


def _settings(model):
    """The LoRA settings of `model` (given to it or to its backbone), or `None`."""
    return model.lora_settings or model.backbone.lora_settings


def _adapted(model, blocks, targets):
    """`[(lora_A name, lora_B name, layer)]` of every adapted projection of `model`."""
    adapted = []
    for index, block in enumerate(blocks):
        for target in targets:
            if target in MODULES:
                part, module = MODULES[target]
                adapted.append((f"{PREFIX}.model.layers.{index}.{part}.{module}",
                                _layer(block, target)))
    if HEAD[0] in targets:
        adapted.append((f"{PREFIX}.{HEAD[1]}", model.backbone.embeddings.token_embedding))
    return [(f"{name}.lora_A.weight", f"{name}.lora_B.weight", layer)
            for name, layer in adapted]


def to_peft(model, directory):
    """Writes the LoRA adapters of `model` as a PEFT adapter folder (`adapter_config.json`,
    `adapter_model.safetensors`) that `peft.PeftModel.from_pretrained` loads on the model's
    base written by `to_huggingface` (before `enable_lora`, or any base of that architecture),
    giving the LoRA model's logits.

    `lora_A = A` flattened to `[Π input axes, r]` and transposed, `lora_B = B` flattened to
    `[r, Π output axes]` and transposed; `r` and `lora_alpha` are the model's rank and alpha.

    Args:
        model: a keras_xf `CausalLM` of the Llama layout with `enable_lora` called (on it or
            its backbone).
        directory: the folder to write (created if needed).

    Raises:
        ValueError: a model without LoRA or of another layout, named in the message.

    Example:
    >>> model.enable_lora(8, alpha=16, targets=["query", "value"])  # doctest: +SKIP
    >>> to_peft(model, "path/to/adapter")  # doctest: +SKIP
    """
    from safetensors.numpy import save_file

    blocks = _blocks(model)
    settings = _settings(model)
    if settings is None:
        raise ValueError(f"{model.name} has no LoRA adapters: call enable_lora first.")
    tensors = {}
    for name_a, name_b, layer in _adapted(model, blocks, settings["targets"]):
        a = keras.ops.convert_to_numpy(layer.lora_kernel_a).astype("float32")
        b = keras.ops.convert_to_numpy(layer.lora_kernel_b).astype("float32")
        tensors[name_a] = np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)
        tensors[name_b] = np.ascontiguousarray(b.reshape(b.shape[0], -1).T)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": settings["rank"],
              "lora_alpha": settings["alpha"], "lora_dropout": 0.0, "use_rslora": False,
              "target_modules": sorted(m for m, t in TARGETS.items()
                                       if t in settings["targets"]),
              "base_model_name_or_path": None, "inference_mode": True, **_PLAIN}
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "adapter_config.json"), "w") as file:
        json.dump(config, file, indent=2)
    save_file(tensors, os.path.join(directory, "adapter_model.safetensors"),
              metadata={"format": "pt"})


def read_config(directory):
    """`(rank, alpha, targets)` of a PEFT LoRA folder's `adapter_config.json`, as keras_xf's
    `enable_lora` takes them (`use_rslora`'s scale `α/√r` is `α·√r / r`); a `ValueError`
    naming a setting keras_xf's adapters cannot express."""
    with open(os.path.join(directory, "adapter_config.json")) as file:
        config = json.load(file)
    if config.get("peft_type") != "LORA":
        raise ValueError(f"The adapter in {directory} must be a LoRA adapter. Received: "
                         f"peft_type={config.get('peft_type')!r}")
    for key, plain in _PLAIN.items():
        if config.get(key) not in (None, plain, [], {}):  # unset, or PEFT's default
            raise ValueError(f"keras_xf reads PEFT LoRA adapters with {key}={plain!r}. "
                             f"Received: {key}={config[key]!r} in {directory}")
    modules = config.get("target_modules")
    modules = [modules] if isinstance(modules, str) else list(modules or [])
    unknown = [m for m in modules if m not in TARGETS]
    if not modules or unknown:
        raise ValueError(f"target_modules must name modules among {sorted(TARGETS)}. "
                         f"Received: target_modules={modules} in {directory}")
    rank, alpha = int(config["r"]), config["lora_alpha"]
    if config.get("use_rslora", False):
        alpha = alpha * math.sqrt(rank)
    targets = [TARGETS[m] for m in sorted(TARGETS) if m in modules]
    return rank, alpha, targets


def from_peft(model, directory):
    """Loads a PEFT LoRA adapter folder into `model`, a keras_xf `CausalLM` of the Llama
    layout holding the adapter's base weights (`from_huggingface` of the base folder); on a
    model without LoRA, `enable_lora` is called first with the adapter's rank, alpha and
    targets. The model then gives the PEFT model's logits. Returns `model`.

    Raises:
        ValueError: a config keras_xf cannot express (DoRA, biases, per-module ranks, ...),
            a model whose LoRA settings differ, or a tensor missing, of another shape, or
            left unused, named in the message.

    Example:
    >>> model = from_huggingface("path/to/base")  # doctest: +SKIP
    >>> from_peft(model, "path/to/adapter")  # doctest: +SKIP
    """
    from safetensors.numpy import load_file

    blocks = _blocks(model)
    rank, alpha, targets = read_config(directory)
    settings = _settings(model)
    wanted = {"rank": rank, "alpha": alpha, "targets": targets}
    if settings is None:
        model.enable_lora(rank, alpha=alpha, targets=targets)
    elif (settings["rank"], sorted(settings["targets"])) != (rank, sorted(targets)) or \
            not math.isclose(settings["alpha"], alpha):
        raise ValueError(f"The adapter in {directory} has the LoRA settings {wanted}; the "
                         f"model's are {settings}.")
    tensors = load_file(os.path.join(directory, "adapter_model.safetensors"))
    tensors = {name.replace(".default.", "."): value for name, value in tensors.items()}
    used = set()
    for name_a, name_b, layer in _adapted(model, blocks, targets):
        a, b = layer.lora_kernel_a, layer.lora_kernel_b
        # PEFT's `lora_A [r, Π inputs]` and `lora_B [Π outputs, r]`, transposed.
        expected = ((a.shape[-1], int(np.prod(a.shape[:-1]))),
                    (int(np.prod(b.shape[1:])), b.shape[0]))
        for name, variable, shape in zip((name_a, name_b), (a, b), expected):
            if name not in tensors:
                raise ValueError(f"The adapter in {directory} lacks tensor {name!r}.")
            if tuple(tensors[name].shape) != shape:
                raise ValueError(f"The adapter tensor {name!r} in {directory} has shape "
                                 f"{tuple(tensors[name].shape)}; the model's takes {shape}.")
            variable.assign(tensors[name].astype("float32").T.reshape(variable.shape))
            used.add(name)
    head_weight = f"{PREFIX}.{HEAD[1]}.base_layer.weight"
    if HEAD[0] in targets and head_weight in tensors:
        # PEFT saves an adapted output layer's own weight beside its adapters (and loads it
        # back over the base's): the untied `W_out` `[V, d]`, transposed.
        table = model.backbone.embeddings.token_embedding.reverse_embeddings
        if tuple(tensors[head_weight].shape[::-1]) != tuple(table.shape):
            raise ValueError(f"The adapter tensor {head_weight!r} in {directory} has shape "
                             f"{tuple(tensors[head_weight].shape)}; the model's output "
                             f"projection is {tuple(table.shape[::-1])}.")
        table.assign(tensors[head_weight].astype(table.dtype).T)
        used.add(head_weight)
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"The adapter in {directory} has tensors that no adapter of "
                         f"{model.name} takes: {unused[:10]}")
    return model
