"""keras-hub backbones → keras_xf task models, through keras-hub's own Hugging Face export."""

import tempfile

from keras_xf.models.huggingface.convert import from_huggingface


def from_keras_hub(backbone, dtype=None):
    """The keras_xf task model with the weights of an in-memory keras-hub backbone.

    keras-hub writes the backbone as a Hugging Face checkpoint folder with its own exporter
    (`keras_hub.src.utils.transformers.export`: GPT-2, Llama 3, Mistral, Qwen, Gemma), into a
    temporary folder that `from_huggingface` reads; so the name map is the one keras-hub and
    `transformers` already agree on, and the checks of `from_huggingface` apply.

    Args:
        backbone: a keras-hub backbone (`keras_hub.models.GPT2Backbone`, `Llama3Backbone`,
            `MistralBackbone`, `QwenBackbone`, `GemmaBackbone`, ...).
        dtype: the dtype policy of the keras_xf model (see `from_huggingface`).

    Returns:
        The keras_xf task model (a `CausalLM` for these backbones).
    """
    try:
        from keras_hub.src.utils.transformers.export.hf_exporter import MODEL_CONFIGS
        from keras_hub.src.utils.transformers.export.hf_exporter import export_backbone
    except ImportError:
        raise ImportError("Converting keras-hub backbones needs keras-hub with its Hugging "
                          "Face exporter: pip install 'keras-hub>=0.20'") from None
    name = type(backbone).__name__
    if name not in MODEL_CONFIGS:
        raise ValueError(f"backbone must be one that keras-hub exports to Hugging Face "
                         f"({sorted(MODEL_CONFIGS)}). Received: a {name}")
    with tempfile.TemporaryDirectory() as directory:
        export_backbone(backbone, directory, include_lm_head=True)
        return from_huggingface(directory, dtype=dtype)
