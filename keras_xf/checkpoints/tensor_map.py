"""The map between a checkpoint's tensor names and a keras_xf model's variables."""

import re

import keras
import numpy as np

from keras_xf.checkpoints.deferred_variables import fill
from keras_xf.checkpoints.load_progress import LoadProgress
from keras_xf.checkpoints.variable_values import variable_value


class Entry:
    """Checkpoint tensors `names` ↔ model `variables`.

    `to_model(arrays)` turns the checkpoint arrays (in the order of `names`) into one array
    per variable; `to_checkpoint(arrays)` is its inverse.
    """

    def __init__(self, names, variables, to_model, to_checkpoint):
        self.names, self.variables = list(names), list(variables)
        self.to_model, self.to_checkpoint = to_model, to_checkpoint


def copy(name, variable, flat=False):
    """A tensor stored as the variable holds it (embeddings, norm scales, biases), or flat
    with `flat=True` (a `[H·Dh]` bias of a `[H, Dh]` variable)."""
    shape = tuple(variable.shape)
    return Entry([name], [variable], lambda a: [a[0].reshape(shape)],
                 lambda a: [a[0].reshape(-1) if flat else a[0]])


def linear(name, variable, input_axes=1):
    """A `torch.nn.Linear` weight `[out, in]` ↔ a kernel whose first `input_axes` axes are
    its inputs (`[d, H, Dh]` queries: 1; `[H, Dh, d]` attention outputs: 2)."""
    shape = tuple(variable.shape)
    inputs = int(np.prod(shape[:input_axes]))
    return Entry([name], [variable], lambda a: [a[0].T.reshape(shape)],
                 lambda a: [a[0].reshape(inputs, -1).T])


def transposed(name, variable):
    """A tensor stored as the transpose of the variable (a tied-off output projection)."""
    return Entry([name], [variable], lambda a: [a[0].T], lambda a: [a[0].T])


def stacked(names, variable):
    """One `torch.nn.Linear` weight `[out, in]` per expert (`names[i]` for expert `i`) ↔ a
    stacked kernel `[M, in, out]` (a `MixtureOfExperts` `expert_kernel_*`)."""
    return Entry(names, [variable], lambda a: [np.stack([w.T for w in a])],
                 lambda a: [w.T for w in a[0]])


def split(name, variables, axis, to_model_each=None, to_checkpoint_each=None):
    """One fused tensor (GPT-2's `c_attn` holds q, k and v) ↔ equal parts along `axis`."""
    to_model_each = to_model_each or [lambda a: a] * len(variables)
    to_checkpoint_each = to_checkpoint_each or [lambda a: a] * len(variables)
    return Entry(
        [name], variables,
        lambda a: [f(p) for f, p in zip(to_model_each, np.split(a[0], len(variables), axis))],
        lambda a: [np.concatenate([f(p) for f, p in zip(to_checkpoint_each, a)], axis)],
    )


def _bytes(variable):
    return int(np.prod(variable.shape)) * np.dtype(
        keras.backend.standardize_dtype(variable.dtype)).itemsize


class ArrayCheckpoint:
    """A checkpoint held in memory, `{name: array}` and its `config.json` dict, that stands
    in for a `SafetensorsFolder` (a keras-hub backbone's weights under Hugging Face names).

    Args:
        config: the Hugging Face config dict.
        tensors: `{checkpoint tensor name: NumPy array}`.
        directory: how messages name the checkpoint's source.
    """

    def __init__(self, config, tensors, directory="memory"):
        self.config, self.directory = config, directory
        self._tensors = dict(tensors)

    def keys(self):
        return sorted(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def shape(self, name):
        return tuple(np.shape(self._tensors[name]))

    def __getitem__(self, name):
        if name not in self._tensors:
            raise ValueError(f"The checkpoint in {self.directory} has no tensor {name!r}.")
        return self._tensors[name]


class TensorMap:
    """Every tensor of a checkpoint family, each mapped to the variables it fills.

    Args:
        entries: `Entry` objects.
        ignored: regular expressions of checkpoint tensors that carry nothing to load
            (buffers that a framework saves, an output projection tied to the embeddings).
        alias: optional function from a checkpoint's tensor name to the name `entries` use
            (older writers' names); two tensors with one alias raise a `ValueError`.
    """

    def __init__(self, entries, ignored=(), alias=None):
        self.entries = list(entries)
        self.ignored = [re.compile(p) for p in ignored]
        self.alias = alias

    def _is_ignored(self, name):
        return any(p.fullmatch(name) for p in self.ignored)

    def _stored_names(self, folder):
        """`{name the entries use: name in the folder}`."""
        if self.alias is None:
            return {name: name for name in folder.keys()}
        stored = {}
        for name in folder.keys():
            alias = self.alias(name)
            if alias in stored:
                raise ValueError(f"The checkpoint in {folder.directory} holds both "
                                 f"{stored[alias]!r} and {name!r}, two names of {alias!r}.")
            stored[alias] = name
        return stored

    def load(self, folder, architecture, progress=None):
        """Assigns every variable from `folder` (a `SafetensorsFolder` or `ArrayCheckpoint`),
        with a progress bar over the variables' bytes (`progress`: `True`, `False`, or `None`
        for one above 100 MB, as `LoadProgress`); raises a `ValueError` naming the tensor
        that is missing, of the wrong shape, or left unused."""
        stored = self._stored_names(folder)
        for entry in self.entries:
            for name in entry.names:
                if name not in stored:
                    raise ValueError(
                        f"The {architecture} checkpoint in {folder.directory} lacks tensor "
                        f"{name!r}."
                    )
        # Largest tensors first: their conversion buffers come and go while few variables
        # hold memory, so the peak is the weights plus the copies of a small tensor.
        entries = sorted(self.entries, key=lambda e: -sum(
            int(np.prod(folder.shape(stored[n]))) for n in e.names))
        bar = LoadProgress(sum(_bytes(v) for e in entries for v in e.variables), progress)
        used = set()
        for entry in entries:
            arrays = [folder[stored[name]] for name in entry.names]
            try:
                values = entry.to_model(arrays)
            except ValueError as error:
                raise ValueError(self._shape_message(entry, arrays, error)) from None
            if any(tuple(v.shape) != tuple(var.shape) for v, var in zip(values, entry.variables)):
                raise ValueError(self._shape_message(entry, arrays, None))
            # Each variable takes its own copy (a backend may keep the array it is given as
            # the variable's memory, which must not be a read-only mapping); then the
            # mappings go.
            values = [variable_value(v, var.dtype, arrays)
                      for v, var in zip(values, entry.variables)]
            del arrays
            for i, variable in enumerate(entry.variables):
                fill(variable, values[i])
                values[i] = None  # one tensor at a time beside the variables
                bar.advance(_bytes(variable))
            used.update(entry.names)
        bar.finish()
        unused = [stored[n] for n in sorted(stored)
                  if n not in used and not self._is_ignored(n)]
        if unused:
            raise ValueError(
                f"The {architecture} checkpoint in {folder.directory} has tensors that no "
                f"variable takes: {unused[:10]}{' ...' if len(unused) > 10 else ''}"
            )

    @staticmethod
    def _shape_message(entry, arrays, error):
        shapes = {n: tuple(a.shape) for n, a in zip(entry.names, arrays)}
        wanted = {v.path: tuple(v.shape) for v in entry.variables}
        return (f"Checkpoint tensor shapes {shapes} do not fit the variables {wanted}"
                + (f" ({error})" if error else ""))

    def tensors(self, dtype=None):
        """`{name: array}` of every checkpoint tensor, from the variables' values. An entry
        may hold a tensor instead of a variable: the merged kernel `W + (α/r)·A·B` that a
        LoRA-enabled layer's `kernel` gives, so a LoRA model is written merged."""
        result = {}
        for entry in self.entries:
            values = [keras.ops.convert_to_numpy(v.value if isinstance(v, keras.Variable) else v)
                      for v in entry.variables]
            if dtype is not None:
                values = [v.astype(dtype) for v in values]
            for name, array in zip(entry.names, entry.to_checkpoint(values)):
                result[name] = np.ascontiguousarray(array)
        return result
