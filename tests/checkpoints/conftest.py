"""Fixtures shared by the checkpoint tests."""

import pytest


@pytest.fixture(scope="session")
def reference_folder(tmp_path_factory):
    """`reference_folder(name)`: the folder of `hf_checks.causal_reference(name)` saved by
    `transformers`, written once per test session and shared by the tests that read it."""
    folders = {}

    def folder(name):
        if name not in folders:
            from tests.checkpoints.hf_checks import causal_reference

            path = tmp_path_factory.mktemp(name)
            causal_reference(name).save_pretrained(path)
            folders[name] = path
        return folders[name]

    return folder
