"""The modules that talk to the backends are few and named: `keras_xf.ops.backend_specific`,
the generation loop's compiled and traced bodies (`generation/compile.py`,
`generation/traced_loop.py`), the functional model's PyTorch module set-up
(`models/backbones/torch_module.py`) and the export package. No other module imports
TensorFlow, JAX or PyTorch or reads `keras.config.backend()`."""

import ast
import pathlib

import keras_xf

_PACKAGE = pathlib.Path(keras_xf.__file__).parent
_ALLOWED = {"ops/backend_specific.py", "generation/compile.py", "generation/traced_loop.py",
            "models/backbones/torch_module.py"}
_ALLOWED_FOLDERS = ("export/",)
_FRAMEWORKS = {"tensorflow", "jax", "jaxlib", "torch"}


def _backend_uses(tree):
    """`(line, what)` for each framework import and each call reading the backend's name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[0] in _FRAMEWORKS]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in _FRAMEWORKS:
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if func.attr == "backend" and isinstance(func.value, (ast.Attribute, ast.Name)):
                owner = func.value.attr if isinstance(func.value, ast.Attribute) else func.value.id
                if owner in ("config", "backend"):
                    found.append((node.lineno, f"{owner}.backend()"))
    return found


def test_the_checker_sees_each_form():
    source = (
        "import torch.nn\nfrom jax import numpy\nimport keras\n"
        "x = keras.config.backend()\ny = keras.backend.backend()\nimport numpy\n"
    )
    assert [line for line, _ in _backend_uses(ast.parse(source))] == [1, 2, 4, 5]


def test_only_backend_specific_talks_to_the_backends():
    offenders = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE).as_posix()
        if relative in _ALLOWED or relative.startswith(_ALLOWED_FOLDERS):
            continue
        for line, what in _backend_uses(ast.parse(path.read_text(), filename=str(path))):
            offenders.append(f"keras_xf/{relative}:{line}: {what}")
    assert not offenders, (
        "move these beside the concern they serve, into a module listed here:\n"
        + "\n".join(offenders))


def test_backend_specific_does_the_talking():
    uses = _backend_uses(ast.parse((_PACKAGE / "ops/backend_specific.py").read_text()))
    assert uses
