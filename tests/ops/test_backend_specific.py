"""Backend-specific code sits beside the concern it serves, in the modules listed here with
their reasons (docs/design.md, "Backend-specific code"): no other module imports TensorFlow,
JAX or PyTorch or reads `keras.config.backend()`."""

import ast
import pathlib

import keras_xf

_PACKAGE = pathlib.Path(keras_xf.__file__).parent
_ALLOWED = {
    # a loaded tensor handed to each backend's variable in one copy of its own
    "checkpoints/variable_values.py",
    "generation/compilation_cache.py",  # each backend's own compilation cache on disk
    "generation/compile.py",  # compiling the decoding loop: tf.function, jax.jit, torch eager
    "generation/traced_loop.py",  # the loop body traced once by TorchScript on PyTorch
    "models/backbones/torch_module.py",  # a functional model's torch.nn.Module set-up
    "ops/attention.py",  # the fused attention kernel: PyTorch's reads strided cache views
    "ops/cache.py",  # in-place cache writes recorded by a TorchScript trace
    "ops/gradients.py",  # vector-Jacobian products, which keras.ops lacks
    "ops/moe.py",  # the experts' matmuls: one MatMul per group on TensorFlow
    "ops/time_loop.py",  # the loop over time of the scans, linear in the steps
    # keras-hub's tokenizers run on TensorFlow (tf.text) whatever the backend, and return
    # its ragged tensors
    "preprocessing/keras_hub_tokenizer.py",
}
_ALLOWED_FOLDERS = ("export/",)  # SavedModel, ONNX and .pt2 programs are backend artefacts
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
        "backend-specific code belongs in a module of _ALLOWED, beside its concern and with "
        "its reason:\n" + "\n".join(offenders)
    )


def test_each_listed_module_does_the_talking():
    idle = [module for module in sorted(_ALLOWED)
            if not _backend_uses(ast.parse((_PACKAGE / module).read_text()))]
    assert not idle, f"these modules no longer talk to the backends: {idle}"
