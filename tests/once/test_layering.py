"""The house's rules, checked: the import-linter contracts of `pyproject.toml` (imports point
downward, no circles), small files, and no side channels in the library (thread-local state,
attributes forced onto objects, class names compared as strings, private names imported
from another module)."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "keras_xf"
SOURCES = sorted(LIBRARY.rglob("*.py"))
MAX_LINES = 500
FORBIDDEN = {
    "thread-local state": re.compile(r"threading\.local|import threading"),
    "attributes forced past an object's own __setattr__": re.compile(r"object\.__setattr__"),
    "class names compared as strings": re.compile(
        r"(\.__name__|\[[\"']class_name[\"']\]|\.get\([\"']class_name[\"']\))\s*(==|!=|\bin\b|\bnot in\b)"
        r"|\bclass_name\s*(==|!=|\bin\b|\bnot in\b)"
    ),
}


def _relative(path):
    return path.relative_to(ROOT).as_posix()


def test_import_contracts_hold():
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_library_files_are_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_relative(path)} has {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("rule", sorted(FORBIDDEN))
def test_no_side_channels(rule):
    pattern = FORBIDDEN[rule]
    found = [f"{_relative(path)}:{number}: {line.strip()}"
             for path in SOURCES
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if pattern.search(line) and not line.lstrip().startswith("#")]
    assert not found, f"{rule}:\n" + "\n".join(found)


def test_no_private_names_imported_from_another_module():
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_xf"):
                found += [f"{_relative(path)}:{node.lineno}: {node.module}.{alias.name}"
                          for alias in node.names if alias.name.startswith("_")]
    assert not found, "\n".join(found)
