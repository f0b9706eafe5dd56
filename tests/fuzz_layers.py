"""Support for `tests/test_fuzz.py`: finds every public layer, runs its docstring example, and
replays the example with one constructor argument or one call input changed.

The oracle is the house rule: a layer either runs and gives finite outputs of the shape that
its `compute_output_spec` promises, or raises a `ValueError`/`TypeError` whose message names
the argument that was changed. `python -m tests.fuzz_layers` runs every case (not a sample) and
prints the failures, one line each.
"""

import contextlib
import doctest
import functools
import importlib
import inspect
import math
import pkgutil
import random
import re
import sys

import keras
import numpy as np

import keras_xf.layers
from keras_xf.layers.mixers.sequence_mixer import SequenceMixer

EXAMPLE_FILE = "<layer docstring example>"

# Arguments of `keras.layers.Layer.__init__` (name, dtype, trainable, ...): Keras owns and
# validates them, and any dtype policy is a valid `dtype`, so they are not this library's to fuzz.
KERAS_LAYER_ARGUMENTS = frozenset(inspect.signature(keras.layers.Layer.__init__).parameters)

# Call arguments that must match the inputs' batch and length (issue 21, item 3).
PADDING_MASKS = ("padding_mask", "encoder_padding_mask")
ATTENTION_MATRICES = ("attention_mask", "attention_bias", "attention_multiplier")

# An int larger than every length in the examples (and prime, so it divides no width), yet
# small enough that a layer which accepts it as a size allocates little: sizes beyond memory
# are resource errors, not argument errors.
LARGE_INT = 37

# The generic pool of constructor values: wrong signs, zero, too large, wrong types, NaN.
VALUE_POOL = (-1, 0, LARGE_INT, -0.5, 0.5, 2.5, float("nan"), float("inf"), "x", None, True, [])


def _public(name):
    return not any(part.startswith("_") for part in name.split("."))


@functools.lru_cache(maxsize=None)
def discover_layers():
    """Every public class under `keras_xf.layers` that subclasses `keras.layers.Layer`: the
    classes exported by the package and by its subpackages, and those defined in its public
    modules (so a new layer is found before anyone remembers to export it)."""
    found = {}
    modules = [keras_xf.layers]
    for info in pkgutil.walk_packages(keras_xf.layers.__path__, "keras_xf.layers."):
        if _public(info.name):
            modules.append(importlib.import_module(info.name))
    for module in modules:
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, keras.layers.Layer)
                and value.__module__.startswith("keras_xf.layers")
                and _public(value.__module__)
                and not name.startswith("_")
                # A base class with no `call` of its own (a feedforward base), or a mixer base
                # whose template `call` runs a `mix` it does not define, is only subclassed,
                # never called; its subclasses are found here themselves.
                and value.call is not keras.layers.Layer.call
                and not (value.call is SequenceMixer.call and not hasattr(value, "mix"))
            ):
                found[value.__name__] = value
    return tuple(found[name] for name in sorted(found))


def example_source(cls):
    """The code of the `>>>` lines in the class docstring, `...` continuations joined."""
    doc = inspect.getdoc(cls) or ""
    examples = doctest.DocTestParser().get_examples(doc)
    return "".join(example.source for example in examples)


def _namespace():
    namespace = {"keras": keras, "np": np, "ops": keras.ops}
    namespace.update({name: getattr(keras_xf.layers, name) for name in dir(keras_xf.layers)
                      if not name.startswith("_")})
    namespace.update({cls.__name__: cls for cls in discover_layers()})
    return namespace


def init_parameters(cls):
    """The constructor arguments of `cls` that the fuzz test changes, in signature order."""
    return [
        name
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
        and name not in KERAS_LAYER_ARGUMENTS
    ]


def call_parameters(layer):
    return inspect.signature(layer.call).parameters


def accepts_call_argument(layer, name):
    parameters = call_parameters(layer)
    return name in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())


@contextlib.contextmanager
def isolated_keras_state():
    """Runs a case from a fresh Keras session and fixed seeds, and gives back the dtype policy
    and the Python and NumPy random states it found, so that no case leaks into another test."""
    policy = keras.config.dtype_policy()
    filtering = keras.config.is_traceback_filtering_enabled()
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    keras.utils.clear_session(free_memory=False)
    keras.config.set_dtype_policy("float32")
    # Errors as the layer raised them: Keras's wrapper would add a list of every call argument.
    keras.config.disable_traceback_filtering()
    keras.utils.set_random_seed(0)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(policy)
        if filtering:
            keras.config.enable_traceback_filtering()
        random.setstate(python_state)
        np.random.set_state(numpy_state)


class Call:
    """One call of a layer made by an example: the layer, its arguments and its outputs."""

    def __init__(self, layer, args, kwargs, outputs, top_level):
        self.layer, self.args, self.kwargs = layer, args, kwargs
        self.outputs, self.top_level = outputs, top_level


class ExampleRun:
    """Runs the docstring example of `target`, recording the constructor arguments of its
    first instance, and every call of a layer made by an example line (`top_level`) or of the
    target instance (from inside its host, as for attention patterns and biases).

    `overrides` replaces constructor arguments of the first instance of `target`."""

    def __init__(self, target, overrides=None):
        self.target = target
        self.overrides = dict(overrides or {})
        self.instance = None
        self.init_arguments = None
        self.calls = []

    def _patched_init(self, original):
        run = self
        signature = inspect.signature(original)

        def __init__(self, *args, **kwargs):
            if type(self) is run.target and run.instance is None:
                run.instance = self
                bound = signature.bind(self, *args, **kwargs)
                run.init_arguments = dict(list(bound.arguments.items())[1:])
                for name, value in run.overrides.items():
                    bound.arguments[name] = value
                args, kwargs = bound.args[1:], bound.kwargs
            return original(self, *args, **kwargs)

        # Keras reads the constructor's signature to record its arguments: keep the original.
        __init__.__signature__ = signature
        return __init__

    def _patched_call(self, original):
        run = self

        @functools.wraps(original)
        def __call__(layer, *args, **kwargs):
            # A layer may wrap `__call__` (the blocks do): skip those frames to the caller.
            frame = sys._getframe(1)
            while frame.f_code.co_name == "__call__":
                frame = frame.f_back
            top_level = frame.f_code.co_filename == EXAMPLE_FILE
            outputs = original(layer, *args, **kwargs)
            if top_level or layer is run.instance:
                run.calls.append(Call(layer, args, kwargs, outputs, top_level))
            return outputs

        return __call__

    def run(self):
        source = example_source(self.target)
        code = compile(source, EXAMPLE_FILE, "exec")
        cls = self.target
        saved_init = cls.__dict__.get("__init__")
        saved_call = keras.layers.Layer.__dict__["__call__"]
        cls.__init__ = self._patched_init(cls.__init__)
        keras.layers.Layer.__call__ = self._patched_call(saved_call)
        try:
            exec(code, _namespace())
        finally:
            keras.layers.Layer.__call__ = saved_call
            if saved_init is None:
                del cls.__init__
            else:
                cls.__init__ = saved_init
        return self

    def main_call(self):
        """The call that the call-input cases change: the target's first call from an example
        line, else (for a layer that only its host calls) the host's first such call."""
        own = [c for c in self.calls if c.top_level and c.layer is self.instance]
        top = [c for c in self.calls if c.top_level]
        return (own or top)[0]


# Output checks ------------------------------------------------------------------------------

def _is_tensor(value):
    return keras.ops.is_tensor(value) or isinstance(value, np.ndarray)


def _symbolic(value):
    if _is_tensor(value):
        return keras.KerasTensor(tuple(value.shape), dtype=keras.backend.standardize_dtype(
            value.dtype))
    return value


def _leaves(structure):
    return [leaf for leaf in keras.tree.flatten(structure) if leaf is not None]


def check_outputs(call, where):
    """Every float output is finite; every output has the shape `compute_output_spec` gives."""
    outputs = _leaves(call.outputs)
    for i, output in enumerate(outputs):
        if not _is_tensor(output):
            continue
        array = keras.ops.convert_to_numpy(output)
        if np.issubdtype(array.dtype, np.inexact):
            assert np.all(np.isfinite(array)), (
                f"{where}: {type(call.layer).__name__} output {i} (shape {array.shape}) holds "
                f"{np.sum(~np.isfinite(array))} non-finite values"
            )
    if not call.top_level:
        return
    args = keras.tree.map_structure(_symbolic, call.args)
    kwargs = keras.tree.map_structure(_symbolic, call.kwargs)
    spec = call.layer.compute_output_spec(*args, **kwargs)
    expected = _leaves(spec)
    assert len(expected) == len(outputs), (
        f"{where}: {type(call.layer).__name__} returned {len(outputs)} tensors, its "
        f"compute_output_spec promises {len(expected)}"
    )
    for i, (output, promised) in enumerate(zip(outputs, expected)):
        received, declared = tuple(output.shape), tuple(promised.shape)
        assert len(received) == len(declared) and all(
            d is None or d == r for r, d in zip(received, declared)
        ), (
            f"{where}: {type(call.layer).__name__} output {i} has shape {received}, its "
            f"compute_output_spec promises {declared}"
        )


def names_argument(message, names):
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message)
        for name in names
    )


def check_error(error, names, where):
    """`error` is a `ValueError` or `TypeError` that names one of `names`."""
    message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    assert isinstance(error, (ValueError, TypeError)), (
        f"{where}: raised {message}; expected a ValueError or TypeError naming "
        f"{' or '.join(names)}"
    )
    assert names_argument(str(error), names), (
        f"{where}: raised {message}; the message does not name {' or '.join(names)}"
    )


# Cases --------------------------------------------------------------------------------------

def _raised(function):
    """The exception that `function()` raises, or `None`; judged outside the `except` block so
    that a failure's report is not chained to the layer's traceback."""
    try:
        function()
    except Exception as error:  # noqa: BLE001 - the oracle judges every exception
        return error
    return None


def baseline(cls):
    """The unchanged example: it runs, and its outputs pass `check_outputs`."""
    with isolated_keras_state():
        run = ExampleRun(cls).run()
        assert run.instance is not None, f"{cls.__name__}'s example never constructs it"
        assert any(c.top_level for c in run.calls), f"{cls.__name__}'s example calls no layer"
        for call in run.calls:
            check_outputs(call, f"{cls.__name__} example")
    return run


def describe_value(value):
    return "nan" if isinstance(value, float) and math.isnan(value) else repr(value)


def constructor_case(cls, name, value):
    """The example with `cls(..., name=value)`: finite outputs of the promised shape, or an
    error naming `name`."""
    where = f"{cls.__name__}({name}={describe_value(value)})"
    with isolated_keras_state():
        run = ExampleRun(cls, {name: value})
        error = _raised(run.run)
        if error is not None:
            check_error(error, [name], where)
            return "error"
        for call in run.calls:
            check_outputs(call, where)
    return "ran"


def _mask(name, batch, query_length, key_length, kind):
    """A `name` call argument: the valid shape, or one with a wrong batch, length or rank.
    `key_length` is the encoder's length for `encoder_padding_mask`."""
    if name in PADDING_MASKS:
        shape = [batch, key_length if name == "encoder_padding_mask" else query_length]
    else:
        shape = [batch, query_length, key_length]
    if kind == "batch":
        shape[0] += 1
    elif kind == "length":
        shape[-1] += 1 + LARGE_INT
    elif kind == "rank-1":
        shape = shape[1:]
    elif kind == "rank+1":
        # [batch, 1, query, key] is a valid attention matrix (one head broadcast): go to rank 5.
        extra = 1 if name in PADDING_MASKS else 2
        shape = shape[:1] + [1] * extra + shape[1:]
    if name == "attention_bias":
        return np.zeros(shape, "float32")
    if name == "attention_multiplier":
        return np.ones(shape, "float32")
    mask = np.ones(shape, bool)
    if kind == "padded" and mask.ndim >= 2:
        mask[-1, ...] = False  # a whole row (a sequence of padding only) masked out
        mask[0, ..., -1] = False
    return mask


MASK_KINDS = ("padded", "batch", "length", "rank-1", "rank+1")
INPUT_KINDS = ("scale", "length-1", "rank-1", "rank+1")


def call_cases(run):
    """The call-input cases that apply to the main call of an example run."""
    call = run.main_call()
    cases = []
    first = call.args[0] if call.args else None
    if _is_tensor(first):
        for kind in INPUT_KINDS:
            if kind == "scale" and not keras.backend.is_float_dtype(first.dtype):
                continue  # token ids: an id out of range is a value, which no layer may check
            if kind == "length-1" and len(first.shape) < 3:
                continue
            cases.append(("inputs", kind))
    if _is_tensor(first) and len(first.shape) >= 2:
        for name in PADDING_MASKS + ATTENTION_MATRICES:
            if not accepts_call_argument(call.layer, name):
                continue
            if name == "encoder_padding_mask" and call.kwargs.get("encoder_outputs") is None:
                continue  # no encoder outputs to measure it against
            for kind in MASK_KINDS:
                if kind == "padded" and name in ("attention_bias", "attention_multiplier"):
                    continue
                cases.append((name, kind))
    return cases


def _first_parameter(layer):
    return next(iter(call_parameters(layer)))


def call_case(cls, argument, kind):
    """The example's main call with one input changed: finite outputs of the promised shape,
    or an error naming the changed argument. A wrong mask shape must raise."""
    with isolated_keras_state():
        run = ExampleRun(cls).run()
        call = run.main_call()
        layer = call.layer
        args, kwargs = list(call.args), dict(call.kwargs)
        first = keras.ops.convert_to_numpy(args[0])
        layer_name = type(layer).__name__
        if type(layer) is not cls:
            layer_name += f" (in the {cls.__name__} example)"
        batch, length = first.shape[0], first.shape[1]
        named = dict(zip(call_parameters(layer), args), **kwargs)
        # Attention matrices span the queries and the keys (`value`/`key` of a cross-attention
        # call; a block's own self-attention otherwise); encoder_padding_mask the encoder.
        key_length = length
        for key in ("value", "key"):
            if _is_tensor(named.get(key)):
                key_length = tuple(named[key].shape)[1]
        encoder = named.get("encoder_outputs")
        encoder_length = tuple(encoder.shape)[1] if _is_tensor(encoder) else length
        if argument == "inputs":
            # The error may name the input, a constructor limit (a maximum length) or a mask
            # given with the call that the changed input no longer matches.
            names = [_first_parameter(layer)] + init_parameters(type(layer)) + [
                key for key, value in kwargs.items() if _is_tensor(value)
            ]
            if kind == "scale":
                args[0] = first * 1e3
            elif kind == "length-1":
                args[0] = first[:, :1]
            elif kind == "rank-1":
                args[0] = first[:, 0]
            elif kind == "rank+1":
                args[0] = first[:, None]
            shape = tuple(args[0].shape)
            where = f"{layer_name} called on {_first_parameter(layer)} of shape {shape} ({kind})"
        else:
            names = [argument]
            other = encoder_length if argument == "encoder_padding_mask" else key_length
            kwargs[argument] = _mask(argument, batch, length, other, kind)
            where = (f"{layer_name} called on inputs {first.shape} with {argument} of shape "
                     f"{kwargs[argument].shape} ({kind})")
        result = []
        error = _raised(lambda: result.append(layer(*args, **kwargs)))
        if error is not None:
            check_error(error, names, where)
            return "error"
        outputs = result[0]
        # A rank-2 attention mask [query_length, key_length] is shared by the batch.
        shared_mask = argument == "attention_mask" and kind == "rank-1"
        assert argument == "inputs" or kind == "padded" or shared_mask, (
            f"{where}: accepted; expected a ValueError naming {argument}"
        )
        check_outputs(Call(layer, tuple(args), kwargs, outputs, True), where)
    return "ran"


@functools.lru_cache(maxsize=None)
def call_cases_of(cls):
    """`call_cases` of the example of `cls`."""
    with isolated_keras_state():
        return tuple(call_cases(ExampleRun(cls).run()))


def constructor_cases(cls):
    run = ExampleRun(cls)
    with isolated_keras_state():
        run.run()
    names = list(run.init_arguments) + [
        n for n in init_parameters(cls) if n not in run.init_arguments
    ]
    return [(name, value) for name in names if name not in KERAS_LAYER_ARGUMENTS
            for value in VALUE_POOL]


def main():
    """Every case of every layer, not a sample: prints one line per failure."""
    failures = 0
    kinds = {"init", "call"}
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--init" in sys.argv:
        kinds = {"init"}
    if "--call" in sys.argv:
        kinds = {"call"}
    for cls in discover_layers():
        if only and cls.__name__ not in only:
            continue
        try:
            baseline(cls)
        except Exception as error:  # noqa: BLE001
            print(f"FAIL {cls.__name__} example: {type(error).__name__}: {error}", flush=True)
            failures += 1
            continue
        with isolated_keras_state():
            run = ExampleRun(cls).run()
        cases = [("init",) + c for c in constructor_cases(cls)] if "init" in kinds else []
        cases += [("call",) + c for c in call_cases(run)] if "call" in kinds else []
        print(f"# {cls.__name__}: {len(cases)} cases", flush=True)
        for case in cases:
            try:
                if case[0] == "init":
                    constructor_case(cls, case[1], case[2])
                else:
                    call_case(cls, case[1], case[2])
            except AssertionError as error:
                failures += 1
                print(f"FAIL {str(error).splitlines()[0][:400]}", flush=True)
            except Exception as error:  # noqa: BLE001
                failures += 1
                print(f"FAIL {cls.__name__} {case}: harness {type(error).__name__}: "
                      f"{str(error)[:300]}", flush=True)
    print(f"{failures} failures", flush=True)


if __name__ == "__main__":
    main()
