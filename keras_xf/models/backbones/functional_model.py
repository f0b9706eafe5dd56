"""Base class of keras_xf's functional models (backbones and tasks)."""

import keras

from keras_xf.export import ExportEndpoints
from keras_xf.export import export_model
from keras_xf.export import input_specs
from keras_xf.models.backbones.arguments import check_input_token_ids
from keras_xf.models.backbones.arguments import check_model_inputs
from keras_xf.models.backbones import lora
from keras_xf.models.backbones.task_preprocessing import preprocessed
from keras_xf.models.backbones.task_preprocessing import preprocessed_validation
from keras_xf.models.backbones.task_preprocessing import task_preprocessor
from keras_xf.models.backbones.torch_module import register_module_parameters
from keras_xf.models.backbones.torch_module import sets_attributes_before_module_init
from keras_xf.ops.keras_internals import sublayers


class FunctionalModel(keras.Model):
    """A functional `keras.Model` whose config holds hyperparameters only.

    Subclasses build their layers, wire `keras.Input`s through them, call
    `super().__init__(inputs, outputs, dtype=…)`, then record their hyperparameters with
    `arguments.record_config(self, locals())`; `get_config` returns them and `from_config`
    is `cls(**config)`. Call inputs are checked against the model's named inputs.

    What the model exports it declares through `export_endpoints()` (read by
    `keras_xf.export`, which knows no model class).
    """

    # The longest sequence the model takes (its position table), or `None`: unbounded, or
    # that of a sub-model (a task's backbone). Models with the argument record it.
    max_sequence_length = None
    # The sub-model a task is built on (a `TransformerBackbone`, `Seq2SeqBackbone`, ...), or
    # `None` for a backbone itself. Tasks set it.
    backbone = None
    # The `keras_xf.preprocessing.Preprocessor` subclass a task takes as `preprocessor=`, or
    # `None`: the model takes ids only. Tasks set it.
    preprocessor_class = None
    _preprocessor = None
    # `(rank, alpha, targets)` after `enable_lora` on this model, else `None`.
    _lora_settings = None

    def __init__(self, *args, dtype=None, **kwargs):
        check_known_arguments(type(self), kwargs)
        super().__init__(*args, **kwargs)
        self._initialized = True
        register_module_parameters(self)
        if dtype is not None:
            self.dtype_policy = keras.dtype_policies.get(dtype)

    def __setattr__(self, name, value):
        # Layers assigned before the functional `__init__` are tracked by the graph instead;
        # until then the model keeps them in its own instance dictionary.
        if sets_attributes_before_module_init(vars(self).get("_initialized", False)):
            vars(self)[name] = value
            return
        super().__setattr__(name, value)

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(quantized_policy_map(self)),
            **getattr(self, "_hyperparameters", {}),
        }
        if self.preprocessor is not None:
            config["preprocessor"] = keras.saving.serialize_keras_object(self.preprocessor)
        if self.lora_settings is not None:
            config["lora"] = self.lora_settings
        return config

    # LoRA ----------------------------------------------------------------------------------
    def enable_lora(self, rank, alpha=None, targets=None):
        """Adds LoRA adapters (Hu et al. 2021) to the projections `targets` and freezes every
        other variable: each projection computes with `W + (alpha/rank)·A·B`, `A [d_in, rank]`
        random, `B [rank, d_out]` zero (so the model starts as it was), `W` frozen, and only
        the `A`s and `B`s train (`summary()` counts them alone as trainable).

        Call it before `compile`. Feedforward projections use Keras' `Dense.enable_lora`;
        attention projections (`LoRAEinsumDense`) learn the update of their whole matrix,
        into heads `A [d, rank]`, `B [rank, H, Dh]` (PEFT's `q_proj` LoRA, where Keras'
        `EinsumDense` would learn one update per head); each expert of a mixture of experts
        gets its own `A`, `B` (`ExpertWeights.enable_lora`), and an untied output head its
        `A [d, rank]`, `B [rank, V]` (`TokenEmbedding.enable_lora`).
        The settings are saved in the model's config: a `.keras` file reloads with the same
        adapters, unmerged and trainable. `to_huggingface` writes the merged weights;
        `quantize` quantises the frozen `W` and keeps the adapters in float (QLoRA).

        Args:
            rank: int > 0, the rank `r` of each update.
            alpha: number > 0, the scale numerator (`alpha / rank` scales `A·B`); `rank` when
                `None` (a scale of 1), as Keras and keras-hub.
            targets: names of the projections to adapt, among `"query"`, `"key"`, `"value"`,
                `"attention_output"` (every attention layer's), `"ffn_hidden"`, `"ffn_gate"`,
                `"ffn_output"` (every `FeedForward`'s, shared experts included),
                `"expert_in"`, `"expert_gate"`, `"expert_out"` (every mixture of experts'
                stacked experts), `"output_head"` (the untied output projection of a
                `TokenEmbedding`, `A [d, rank]`, `B [rank, V]`). Default `("query",
                "value")`, keras-hub's.

        Raises:
            ValueError: a bad `rank` or `alpha`, an unknown target or one the model lacks,
                a target in a frozen layer (`trainable=False`), `"output_head"` on tied
                embeddings, or LoRA already enabled.

        Example:
        >>> model = CausalLM(vocabulary_size=64, hidden_dim=16, num_heads=2,  # doctest: +SKIP
        ...                  intermediate_dim=32, num_layers=2)
        >>> model.enable_lora(4, targets=["query", "value", "ffn_hidden"])  # doctest: +SKIP
        """
        rank, alpha, targets = lora.check_settings(rank, alpha, targets)
        lora.enable(self, rank, alpha, targets)
        self._lora_settings = (rank, alpha, targets)

    @property
    def lora_settings(self):
        """`{"rank", "alpha", "targets"}` given to this model's `enable_lora`, or `None`."""
        if self._lora_settings is None:
            return None
        rank, alpha, targets = self._lora_settings
        return {"rank": rank, "alpha": alpha, "targets": list(targets)}

    def save_lora_weights(self, filepath):
        """Writes only the adapters (each projection's `A` and `B`, float32) and the LoRA
        settings to `filepath`, an HDF5 file whose name ends in `.lora.h5` (keras-hub's
        suffix). Adapters are keyed `"<i>/<layer name>/lora_kernel_a"` by their order in the
        model, so any model of the same architecture loads them."""
        lora.save(self, self.lora_settings, filepath)

    def load_lora_weights(self, filepath):
        """Loads adapters that `save_lora_weights` wrote. On a model without LoRA, enables it
        first with the file's rank, alpha and targets; on one with LoRA, the settings must be
        the file's. Raises a `ValueError` naming a setting that differs, or an adapter
        that is missing, of another shape, or left unused."""
        stored = lora.read_settings(filepath)
        if self.lora_settings is None:
            self.enable_lora(**stored)
        elif self.lora_settings != stored:
            raise ValueError(f"The adapters in {filepath} were saved with {stored}; this model's "
                             f"LoRA settings are {self.lora_settings}.")
        lora.load(self, filepath)

    # Text in -------------------------------------------------------------------------------
    @property
    def preprocessor(self):
        """The task's preprocessor (strings in: `fit`, `evaluate`, `predict` and
        `generate` take text), or `None`: the model takes ids only. Settable, checked
        against `preprocessor_class`; saved in the model's config."""
        return self._preprocessor

    @preprocessor.setter
    def preprocessor(self, preprocessor):
        self._preprocessor = task_preprocessor(type(self), preprocessor)

    def fit(self, x=None, y=None, *args, sample_weight=None, validation_data=None, **kwargs):
        """Keras `fit`; with a preprocessor, `x` may be text (and `validation_data` a
        tuple of text and labels), preprocessed on the host first."""
        x, y, sample_weight = preprocessed(self.preprocessor, x, y, sample_weight)
        validation_data = preprocessed_validation(self.preprocessor, validation_data)
        return super().fit(x, y, *args, sample_weight=sample_weight,
                           validation_data=validation_data, **kwargs)

    def evaluate(self, x=None, y=None, *args, sample_weight=None, **kwargs):
        """Keras `evaluate`; with a preprocessor, `x` may be text."""
        x, y, sample_weight = preprocessed(self.preprocessor, x, y, sample_weight)
        return super().evaluate(x, y, *args, sample_weight=sample_weight, **kwargs)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        lora_settings = config.pop("lora", None)
        model = cls(**config)
        # Sub-models recorded at construction (a task's backbone) hold a float policy: the
        # saved map names their quantised layers, which Keras quantises when given the policy.
        policy = keras.dtype_policies.get(config["dtype"]) if config.get("dtype") else None
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            paths = set(policy)
            for layer in sublayers(model, include_self=True):
                if layer.path in paths and layer.quantization_mode is None:
                    layer.dtype_policy = policy[layer.path]
        if lora_settings is not None:  # before the weights load: they hold the adapters
            model.enable_lora(**lora_settings)
        return model

    def compile_from_config(self, config):
        """Re-compiles a loaded model with its saved optimizer, loss and metrics (tasks
        override `compile` to give defaults, so Keras leaves this to them)."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if hasattr(self, "optimizer") and self.built:
            self.optimizer.build(self.trainable_variables)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """Keras' `export` with the batch and sequence lengths of the artefact left free.

        Keras' own export gives every free dimension its own symbol, so on JAX a padding
        mask cannot broadcast against its ids. Here `"tf_saved_model"` (the default, on
        TensorFlow and JAX) declares each sequence's shared batch and length
        (`keras_xf.export.export_saved_model`); on PyTorch `"onnx"` and `"torch"` do the same
        through `torch.export` (`export_onnx`, `export_torch`). A format the backend cannot
        export (`"tf_saved_model"` on PyTorch, `"onnx"` on TensorFlow / JAX) raises a
        `ValueError` that names what to use instead. Arguments are Keras'; see
        `keras_xf.export.export_model` and `docs/export.md`.
        """
        return export_model(self, filepath, format=format, verbose=verbose,
                            input_signature=input_signature, **kwargs)

    def export_endpoints(self):
        """What `model.export` writes: an `keras_xf.export.ExportEndpoints` whose `serve`
        endpoint is the model's call on its named inputs (their `keras.InputSpec`s), with
        free lengths bounded by the smallest `max_sequence_length` of the model and its
        sub-models. A generating task adds its generation steps (`GenerativeTask`)."""
        limits = [layer.max_sequence_length for layer in self._flatten_layers()
                  if isinstance(layer, FunctionalModel) and layer.max_sequence_length]
        return ExportEndpoints(serve=self, inputs=input_specs(self.input),
                               max_sequence_length=min(limits) if limits else None)

    def __call__(self, *args, **kwargs):
        # Checked before Keras' own input checks and any backend op, so that a bad input
        # raises the same ValueError, naming the input, on every backend.
        inputs = args[0] if args else kwargs.get("inputs")
        check_model_inputs(self, inputs)
        check_input_token_ids(self, inputs)
        return super().__call__(*args, **kwargs)

    def predict(self, x, *args, **kwargs):
        """Keras `predict`; with a preprocessor, `x` may be text. Token ids given as numpy
        arrays or lists are checked against the vocabulary first (`token_vocabulary_sizes`),
        since the step Keras compiles sees them only as traced tensors."""
        x, _, _ = preprocessed(self.preprocessor, x)
        check_input_token_ids(self, x)
        return super().predict(x, *args, **kwargs)

    def token_vocabulary_sizes(self):
        """`{input name: vocabulary size}` of the inputs that hold token ids, which calls and
        `predict` check to lie in `[0, size)` when given as numpy arrays or lists. A task
        answers for its backbone's inputs; a backbone names its own (none by default)."""
        if self.backbone is None or not isinstance(self.input, dict):
            return {}
        return {name: size for name, size in self.backbone.token_vocabulary_sizes().items()
                if name in self.input}


def layer_dtype(dtype):
    """The policy that sub-layers created before `super().__init__` should use."""
    return keras.dtype_policies.get(dtype) if dtype is not None else None


def quantized_policy_map(model):
    """`model`'s policy, or after `model.quantize(...)` a `DTypePolicyMap` from each quantised
    layer's path to its policy (keras-hub's `Backbone` does the same): sub-layers built with it,
    or given it by `from_config`, rebuild their quantised variables when a `.keras` file loads."""
    policy = model.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return policy
    policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=policy)
    for layer in sublayers(model, include_self=True):
        if layer.quantization_mode is not None:
            policy_map[layer.path] = layer.dtype_policy
    return policy_map if len(policy_map) else policy


# What a model passes on to `keras.Model`'s functional `__init__`; Keras drops other keywords
# without a word, so a misspelt model argument would be ignored.
FUNCTIONAL_ARGUMENTS = ("inputs", "outputs", "name", "trainable")


def check_known_arguments(model_class, kwargs):
    """Refuses keywords that reached the functional `__init__` but are none of `inputs`,
    `outputs`, `name`, `trainable`: arguments the model (or its backbone) does not take."""
    unknown = sorted(set(kwargs) - set(FUNCTIONAL_ARGUMENTS))
    if unknown:
        raise ValueError(
            f"{model_class.__name__} does not take the arguments {unknown}: expected those of "
            f"{model_class.__name__}.__init__. Received: "
            + ", ".join(f"{name}={kwargs[name]!r}" for name in unknown)
        )
