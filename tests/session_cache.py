"""Expensive results computed once per test session, across pytest-xdist workers."""

import os

import filelock


def shared_once(tmp_path_factory, name, fill):
    """A directory that `fill(directory)` populates once per test session, shared by the
    pytest-xdist workers: the first worker to arrive runs `fill` under a file lock, the others
    wait and reuse its files. For expensive subprocess fixtures (cross-backend parity, the
    8-device distribution run). If `fill` raises, the next worker to arrive tries again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' base directories share this parent
    directory = root / name
    with filelock.FileLock(str(directory) + ".lock"):
        if not (directory / ".done").exists():
            directory.mkdir(exist_ok=True)
            fill(directory)
            (directory / ".done").touch()
    return directory
