"""No private cross-module reaches: a library file reads and writes private attributes of its
own objects only (`self`, `cls`, `super()`, `type(self)`, the class being defined), and imports
nothing from `keras.src` or `keras_hub.src`. What Keras or keras-hub offer no public route for
goes through `keras_xf/ops/keras_internals.py`, one function each with its reason."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "keras_xf"
INTERNALS = "keras_xf/ops/keras_internals.py"
PRIVATE_PACKAGES = ("keras.src", "keras_hub.src")
ATTRIBUTE_FUNCTIONS = {"getattr", "hasattr", "setattr", "delattr"}
OBJECT_METHODS = {"__getattribute__", "__setattr__", "__delattr__"}

# The few files that still reach past an owner's public names, each with its reason.
ALLOWED = {
    "keras_xf/generation/traced_loop.py":
        "the torch decoding step reads its variables' tensors directly: `.value` costs a "
        "Python call per variable per generated token",
    "keras_xf/models/backbones/arguments.py":
        "record_config reads the calling __init__'s parameters (sys._getframe) and records "
        "them on the model it was called for",
    "keras_xf/models/adaptive/stop_classifier_trainer.py":
        "the trainer drives the language model's own stop-classifier and output-table steps",
}


def _relative(path):
    return path.relative_to(ROOT).as_posix()


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _in_private_package(module):
    return any(module == p or module.startswith(p + ".") for p in PRIVATE_PACKAGES)


def _is_allowed(relative):
    return relative == INTERNALS or any(
        relative.startswith(entry) if entry.endswith("/") else relative == entry
        for entry in ALLOWED)


class _Reaches(ast.NodeVisitor):
    """The private attributes a module touches on objects that are not its own, and its
    imports from private packages."""

    def __init__(self):
        self.classes = []
        self.found = []

    def _own(self, node):
        if isinstance(node, ast.Name):
            return node.id in ("self", "cls") or node.id in self.classes
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "super":
                return True
            return (node.func.id == "type" and len(node.args) == 1
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
        return False

    def _report(self, node, text):
        self.found.append(f"{node.lineno}: {text}")

    def visit_ClassDef(self, node):
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node):
        if _is_private(node.attr) and not self._own(node.value):
            self._report(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node):
        function = node.func
        builtin = isinstance(function, ast.Name) and function.id in ATTRIBUTE_FUNCTIONS
        forced = (isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name)
                  and function.value.id == "object" and function.attr in OBJECT_METHODS)
        if ((builtin or forced)
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)
                and not self._own(node.args[0])):
            self._report(node, ast.unparse(node))
        self.generic_visit(node)

    def visit_Import(self, node):
        for alias in node.names:
            if _in_private_package(alias.name):
                self._report(node, f"import of {alias.name}")

    def visit_ImportFrom(self, node):
        module = node.module or ""
        if _in_private_package(module):
            self._report(node, f"import of {module}")
            return
        for alias in node.names:  # `from keras import src`
            if _in_private_package(f"{module}.{alias.name}"):
                self._report(node, f"import of {module}.{alias.name}")


def reaches(source):
    """`"line: expression"` for each private reach in the Python `source`."""
    visitor = _Reaches()
    visitor.visit(ast.parse(source))
    return visitor.found


SOURCES = sorted(LIBRARY.rglob("*.py"))


def test_no_library_file_reaches_into_objects_it_does_not_own():
    found = [f"{_relative(path)}:{line}" for path in SOURCES
             if not _is_allowed(_relative(path)) for line in reaches(path.read_text())]
    assert not found, (
        "Private attributes of objects the file does not own, or imports from a private "
        "package (use a public API, or a function of keras_xf/ops/keras_internals.py with "
        "its reason):\n" + "\n".join(found))


def test_the_internals_module_is_where_keras_internals_are_reached():
    assert reaches((ROOT / INTERNALS).read_text())


@pytest.mark.parametrize("source, expected", [
    ("layer._flatten_layers()", ["1: layer._flatten_layers"]),
    ("getattr(variable, '_value', None)", ["1: getattr(variable, '_value', None)"]),
    ("hasattr(model, '_initialized')", ["1: hasattr(model, '_initialized')"]),
    ("object.__setattr__(bias, '_terms', {})", ["1: object.__setattr__(bias, '_terms', {})"]),
    ("self.stack._templates()", ["1: self.stack._templates"]),
    ("from keras.src.losses import loss", ["1: import of keras.src.losses"]),
    ("import keras_hub.src.models", ["1: import of keras_hub.src.models"]),
    ("from keras import src", ["1: import of keras.src"]),
    ("self._x = 1\ncls._y\nsuper()._z()\ntype(self)._w\nx.__class__\ngetattr(self, '_v')", []),
    ("class Box:\n    def f(self):\n        return Box._helper()", []),
    ("from keras_hub.models import BertBackbone\nimport keras.ops", []),
])
def test_reaches_are_found(source, expected):
    assert reaches(source) == expected
