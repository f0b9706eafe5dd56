"""What a model exports, as it declares it: the structure `model.export_endpoints()` returns.

`keras_xf.export` knows no model class. A keras_xf model (`FunctionalModel`) declares its
endpoints through its public hook `export_endpoints()`, which returns an `ExportEndpoints`;
a generating task (`GenerativeTask`) adds its `GenerationSteps`. The export functions read
only this structure (and the Keras API of the `serve` model: its variables, its torch
module's mode).
"""

import dataclasses
from typing import Any
from typing import Callable
from typing import Optional

import keras


@dataclasses.dataclass(frozen=True)
class GenerationSteps:
    """How a generating task decodes with a cache: the `generate` endpoint of a SavedModel,
    and the prefill and decoding-step programs of PyTorch.

    `c` below is what conditions the text (nothing, a source sequence, an image).

    Attributes:
        prompt_keys: `(ids name, mask name)` of the prompts among the model's inputs; the
            other inputs are the context's (`encoder_token_ids`, `images`, ...).
        pad_token_id: int, the id that pads prompts.
        default_sampler: the sampler of `generate` when export is given none: a keras-hub
            sampler or its name.
        generate_step: `generate_step(inputs, stop_token_ids=, sampler=, use_cache=True,
            prefill_length=)`: the compilable cached loop on packed prompts, returning the
            ids and the output mask under `prompt_keys`.
        recurrent_state: bool, whether a decoder layer keeps a recurrent state (which must
            see each token once): the loop then feeds the prompt from index 1 and the
            prefill writes the context alone.
        encode_context: `encode_context(**context_inputs)`: `c` encoded once.
        init_cache: `init_cache(batch_size, max_length, c)`: the empty cache, an opaque
            structure of tensors.
        prefill: `prefill(token_ids or None, cache, c)`: `(hidden [B, t, d] or None,
            cache)`, the cache holding `c` and the prompt tokens `token_ids [B, t]`.
        decode_token: `decode_token(token_ids [B, 1], cache, cache_index)`: `(logits [B, V]
            for position cache_index + 1, hidden [B, d], cache)`.
        max_length: int or `None`, the longest text the decoder takes (its position table).
    """

    prompt_keys: tuple
    pad_token_id: int
    default_sampler: Any
    generate_step: Callable
    recurrent_state: bool
    encode_context: Callable
    init_cache: Callable
    prefill: Callable
    decode_token: Callable
    max_length: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class ExportEndpoints:
    """The endpoints a model exports.

    Attributes:
        serve: the `keras.Model` (or layer) whose call on the dict of inputs is the `serve`
            endpoint, and whose variables the artefact holds.
        inputs: the input signature: `{name: keras.InputSpec}` of the dict that `serve`
            takes (`None`: the input is not a dict, and Keras' own export applies).
        max_sequence_length: int or `None`, the longest sequence `serve` takes: the bound of
            every free length (learned position tables are sliced to it).
        generation: the task's `GenerationSteps`, or `None` for a model that does not
            generate.
    """

    serve: Any
    inputs: Optional[dict]
    max_sequence_length: Optional[int] = None
    generation: Optional[GenerationSteps] = None


def input_specs(inputs):
    """`{name: keras.InputSpec}` of a functional model's named `keras.Input`s, or `None` when
    its input is not a dict."""
    if not isinstance(inputs, dict):
        return None
    return {name: keras.InputSpec(shape=tuple(tensor.shape), dtype=tensor.dtype, name=name)
            for name, tensor in inputs.items()}


def model_endpoints(model):
    """The `ExportEndpoints` of `model`: `model.export_endpoints()` for a keras_xf model, or
    `model` itself when it is one already (a model that is not keras_xf's can be exported
    by giving its `ExportEndpoints`).

    Raises:
        ValueError: for a model that is not built, or whose input is not a dict.
    """
    if isinstance(model, ExportEndpoints):
        return model
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"Export needs a built keras.Model. Received: {model!r}")
    if not isinstance(model.input, dict):
        raise ValueError(
            "keras_xf.export handles functional models with dict inputs (keras_xf's models). "
            f"Received inputs: {model.input!r}; use `model.export` directly."
        )
    return model.export_endpoints()
