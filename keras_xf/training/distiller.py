"""A student trained with `fit` from a frozen teacher: word-level and hidden-state
knowledge distillation (survey §5.7)."""

import keras
from keras import ops

from keras_xf.ops.checks import check_positive_number
from keras_xf.ops.distillation import SOFT_LOSSES
from keras_xf.ops.distillation import hidden_state_loss
from keras_xf.ops.distillation import soft_target_loss

# Inputs whose boolean mask marks the real positions of an output, in order of preference.
_MASK_INPUTS = ("decoder_padding_mask", "padding_mask")


def _check_weight(name, value, upper=None):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    if ok and upper is not None:
        ok = value <= upper
    if not ok:
        bounds = "a number >= 0" if upper is None else f"a number in [0, {upper}]"
        raise ValueError(f"{name} must be {bounds}. Received: {name}={value!r}")
    return float(value)


def _check_hidden_states(hidden_states):
    """`hidden_states` as a list of `(teacher_feature, student_feature, mask_input)`."""
    if hidden_states is None:
        return []
    if not isinstance(hidden_states, (list, tuple)):
        raise ValueError(
            "hidden_states must be a list of (teacher_feature, student_feature) or "
            "(teacher_feature, student_feature, mask_input) entries. Received: "
            f"hidden_states={hidden_states!r}"
        )
    pairs = []
    for entry in hidden_states:
        ok = isinstance(entry, (list, tuple)) and len(entry) in (2, 3)
        ok = ok and all(isinstance(s, str) for s in entry[:2])
        ok = ok and (len(entry) == 2 or entry[2] is None or isinstance(entry[2], str))
        if not ok:
            raise ValueError(
                "Each entry of hidden_states must be (teacher_feature, student_feature) or "
                "(teacher_feature, student_feature, mask_input), feature names strings and "
                f"mask_input a string or None. Received: {entry!r}"
            )
        pairs.append((entry[0], entry[1], entry[2] if len(entry) == 3 else "auto"))
    return pairs


def _feature_layer(model, feature):
    """The layer of `model` that `feature` names (the part before any `/`)."""
    name = feature.partition("/")[0]
    names = [layer.name for layer in model.layers]
    if name == "backbone" and name not in names:  # the task's backbone: its nested model
        nested = [layer.name for layer in model.layers if isinstance(layer, keras.Model)]
        if len(nested) == 1:
            name = nested[0]
    if name not in names:
        raise ValueError(f"hidden_states names {feature!r}, which is not a layer of "
                         f"{model.name} ({names})")
    return model.get_layer(name)


def _keyed(output, feature, layer, model):
    """The part of a layer's output that `feature` names: a key of its dict output after `/`,
    else the output itself."""
    key = feature.partition("/")[2]
    if isinstance(output, dict):
        if key not in output:
            raise ValueError(
                f"hidden_states names {feature!r}: the layer {layer.name!r} of {model.name} "
                f"returns a dict, so give one of its keys after '/': {sorted(output)}"
            )
        return output[key]
    if key:
        raise ValueError(
            f"hidden_states names {feature!r}, but the layer {layer.name!r} of {model.name} "
            "returns a single tensor: leave out '/key'"
        )
    return output


def feature_outputs(model, features):
    """`model`'s graph run again on new `keras.Input`s, keeping the outputs of the layers that
    `features` name: `(inputs, outputs, states)`, `states[i]` the symbolic output named by
    `features[i]`.

    A feature is `"layer"` or `"layer/key"` (a key of a layer's dict output), `layer` a layer
    of the functional `model` or `"backbone"` for the task's backbone (its one nested model,
    e.g. `"backbone/encoder_sequence_output"`). The graph runs through `keras.models.
    clone_model` with each layer kept (the weights are `model`'s) and each call recorded, so
    a layer called more than once in `model` (a tied embedding) is refused as ambiguous.
    """
    layers = [_feature_layer(model, feature) for feature in features]
    calls = {id(layer): [] for layer in layers}

    def call_and_record(layer, *args, **kwargs):
        output = layer(*args, **kwargs)
        if id(layer) in calls:
            calls[id(layer)].append(output)
        return output

    graph = keras.models.clone_model(model, clone_function=lambda layer: layer,
                                     call_function=call_and_record)
    states = []
    for feature, layer in zip(features, layers):
        outputs = calls[id(layer)]
        if len(outputs) != 1:
            raise ValueError(
                f"hidden_states names {feature!r}, but the layer {layer.name!r} is called "
                f"{len(outputs)} times in {model.name}: name a layer called once"
            )
        states.append(_keyed(outputs[0], feature, layer, model))
    return graph.input, graph.output, states


@keras.saving.register_keras_serializable(package="keras_xf")
class Distiller(keras.distillation.Distiller):
    """Trains `student` from a frozen `teacher` with `fit` (survey §5.7).

    The loss of a batch is

        L = α · L_hard(y, z) + (1 − α) · T² Σ_i w_i Loss(p̃_i, p_i) / Σ_i w_i
            + β · Σ_k Σ_i w_i ‖h̃^k_i − W_k h^k_i‖² / (d_k Σ_i w_i)

    where `z` are the student's logits, `p̃_i = softmax(z̃_i/T)` and `p_i = softmax(z_i/T)`
    the teacher's and the student's distributions at temperature `T` (word-level
    distillation, `Loss` the KL divergence or cross-entropy), `L_hard` the compiled loss on
    the labels, and `h̃^k`, `h^k` the chosen teacher and student hidden states of the
    `k`-th pair of `hidden_states` (hidden-state distillation, Romero et al., 2014), `W_k` a
    learned `Dense` projection to the teacher's width `d_k` when the widths differ (identity
    otherwise). `w_i` are the `sample_weight` given to `fit` or, without one, the padding
    mask of the position (`decoder_padding_mask` or `padding_mask`), so padding never
    enters a loss. Losses are computed in float32. Sequence-level distillation is a change
    of data, not of loss: see `sequence_distillation_data`.

    Extends `keras.distillation.Distiller` (its validation of the pair of models, its
    frozen teacher, `compile` and loss trackers) with masks, the `T²`-scaled soft loss and
    projected hidden states of keras_xf models. The teacher runs in inference mode and
    receives no gradient; the trainable weights are the student's and the projections'.
    After `fit`, `distiller.student` is the trained model.

    Args:
        teacher: a trained functional `keras.Model` (any keras_xf task: `CausalLM`,
            `Seq2SeqLM`, `TextClassifier`, …), frozen here.
        student: a functional `keras.Model` with the same inputs and output shape.
        temperature: float `T > 0`.
        alpha: float in `[0, 1]`, the weight `α` of the hard-label loss.
        soft_loss: `"kl"` or `"cross_entropy"`.
        hidden_states: optional list of `(teacher_feature, student_feature)` or
            `(teacher_feature, student_feature, mask_input)`: a feature is a layer of the
            model (`"layer"`, or `"layer/key"` for a key of its dict output; `"backbone"`
            names the task's backbone, e.g. `"backbone"` for a `CausalLM`'s final states or
            `"backbone/encoder_sequence_output"` for a `Seq2SeqLM`'s encoder).
            `mask_input` is the input whose mask weighs the positions of that feature:
            `"auto"` (default) takes `encoder_padding_mask` for an encoder feature and the
            logits' mask otherwise; `None` weighs every position alike.
        hidden_state_weight: float `β >= 0`.
        name: model name.

    Example:
    >>> distiller = Distiller(teacher, student, temperature=2.0, alpha=0.5,
    ...                       hidden_states=[("backbone", "backbone")])
    >>> distiller.compile("adam")  # the hard-label loss: sparse cross-entropy on logits
    >>> distiller.fit(x, y, sample_weight=mask, epochs=1)
    >>> student = distiller.student
    """

    def __init__(self, teacher, student, temperature=2.0, alpha=0.5, soft_loss="kl",
                 hidden_states=None, hidden_state_weight=1.0, name="distiller", **kwargs):
        for role, model in (("teacher", teacher), ("student", student)):
            if not isinstance(model, keras.Model) or getattr(model, "inputs", None) is None:
                raise ValueError(
                    f"{role} must be a functional keras.Model (a keras_xf task). Received: "
                    f"{role}={type(model).__name__}"
                )
        check_positive_number("temperature", temperature)
        alpha = _check_weight("alpha", alpha, upper=1.0)
        if soft_loss not in SOFT_LOSSES:
            raise ValueError(f"soft_loss must be one of {SOFT_LOSSES}. Received: "
                             f"soft_loss={soft_loss!r}")
        pairs = _check_hidden_states(hidden_states)
        hidden_state_weight = _check_weight("hidden_state_weight", hidden_state_weight)
        super().__init__(
            teacher, student,
            distillation_losses=keras.distillation.LogitsDistillation(temperature=temperature),
            student_loss_weight=alpha, name=name, **kwargs,
        )
        self.temperature = float(temperature)
        self.alpha = alpha
        self.soft_loss = soft_loss
        self.hidden_states = pairs
        self.hidden_state_weight = hidden_state_weight
        self._input_names = [tensor.name for tensor in keras.tree.flatten(student.inputs)]
        self._build_hidden_states(pairs)
        self.hidden_state_loss_tracker = keras.metrics.Mean(name="hidden_state_loss")

    def _build_hidden_states(self, pairs):
        """Feature extractors (one forward pass of each model gives its logits and every
        chosen state), the projections `W_k` and the mask input of each pair."""
        self.projections, self._masks = [], []
        if not pairs:
            self._teacher_features = self._student_features = None
            return
        teacher_inputs, teacher_logits, teacher_states = feature_outputs(
            self.teacher, [pair[0] for pair in pairs])
        student_inputs, student_logits, student_states = feature_outputs(
            self.student, [pair[1] for pair in pairs])
        teacher_outputs = {"logits": teacher_logits}
        student_outputs = {"logits": student_logits}
        for index, (teacher_feature, student_feature, mask_input) in enumerate(pairs):
            teacher_state, student_state = teacher_states[index], student_states[index]
            if len(teacher_state.shape) != len(student_state.shape):
                raise ValueError(
                    f"hidden_states pair {index} needs features of one rank. Received: "
                    f"{teacher_feature!r} of shape {teacher_state.shape} and "
                    f"{student_feature!r} of shape {student_state.shape}"
                )
            teacher_outputs[f"state_{index}"] = teacher_state
            student_outputs[f"state_{index}"] = student_state
            width, student_width = teacher_state.shape[-1], student_state.shape[-1]
            projection = None
            if width != student_width:
                projection = keras.layers.Dense(width, use_bias=False, dtype=self.dtype_policy,
                                                name=f"hidden_projection_{index}")
                projection.build((None, student_width))
            self.projections.append(projection)
            self._masks.append(self._mask_input(mask_input, teacher_feature, index))
        self._teacher_features = keras.Model(teacher_inputs, teacher_outputs,
                                             name=f"{self.teacher.name}_features")
        self._student_features = keras.Model(student_inputs, student_outputs,
                                             name=f"{self.student.name}_features")

    def _mask_input(self, mask_input, feature, index):
        names = self._input_names
        if mask_input == "auto":
            if "encoder" in feature and "encoder_padding_mask" in names:
                return "encoder_padding_mask"
            return "logits"
        if mask_input is not None and mask_input not in names:
            raise ValueError(
                f"hidden_states pair {index} names mask_input={mask_input!r}, which is not an "
                f"input of the student: {names}"
            )
        return mask_input

    def _logits_weights(self, x, logits, sample_weight):
        """`w_i` of the logits' positions: `sample_weight`, else the padding mask of the
        sequence the logits cover, else none (one output per example)."""
        if sample_weight is not None:
            return sample_weight
        if len(logits.shape) > 2 and isinstance(x, dict):
            for key in _MASK_INPUTS:
                if key in x:
                    return x[key]
        return None

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if self._student_features is not None:
            student = self._student_features(x, training=training)
            teacher = self._teacher_features(x, training=False)
            y_pred = student["logits"]
        else:
            if y_pred is None:
                y_pred = self(x, training=training)
            student = {"logits": y_pred}
            teacher = {"logits": self.teacher(x, training=False)}
        logits_weights = self._logits_weights(x, y_pred, sample_weight)

        hard = ops.zeros((), "float32")
        if self.alpha > 0.0 and y is not None:
            losses = keras.tree.flatten(keras.tree.map_structure(
                lambda loss, target, output: ops.cast(loss(target, output, sample_weight),
                                                      "float32"),
                self._student_loss, y, y_pred,
            ))
            hard = losses[0] if len(losses) == 1 else ops.sum(ops.stack(losses))
        soft = soft_target_loss(teacher["logits"], y_pred, self.temperature, logits_weights,
                                kind=self.soft_loss)
        hidden = ops.zeros((), "float32")
        for index, projection in enumerate(self.projections):
            state = student[f"state_{index}"]
            if projection is not None:
                state = projection(state)
            mask = self._masks[index]
            weights = logits_weights if mask == "logits" else None if mask is None else x[mask]
            hidden = hidden + hidden_state_loss(teacher[f"state_{index}"], state, weights)

        total = self.alpha * hard + (1.0 - self.alpha) * soft + self.hidden_state_weight * hidden
        for loss in self.losses:
            total = total + ops.cast(loss, "float32")
        self.student_loss_tracker.update_state(hard)
        self.distillation_loss_tracker.update_state(soft)
        self.hidden_state_loss_tracker.update_state(hidden)
        self.total_loss_tracker.update_state(total)
        return total

    def compile(self, optimizer="adam", loss="auto", metrics=None, **kwargs):
        """Keras' `Distiller.compile`; `loss` (the hard-label loss `L_hard`) defaults to
        sparse cross-entropy on logits."""
        if isinstance(loss, str) and loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "teacher": keras.saving.serialize_keras_object(self.teacher),
            "student": keras.saving.serialize_keras_object(self.student),
            "temperature": self.temperature,
            "alpha": self.alpha,
            "soft_loss": self.soft_loss,
            "hidden_states": [list(pair) for pair in self.hidden_states],
            "hidden_state_weight": self.hidden_state_weight,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("teacher", "student"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)
