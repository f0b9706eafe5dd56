"""Fixtures shared by the preprocessing tests."""

import pytest

from tests.preprocessing import folders


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """The `HuggingFaceTokenizer` of a tokenizer folder written as real ones are (padding and
    truncation saved, special tokens, a chat template)."""
    from keras_xf.preprocessing import HuggingFaceTokenizer

    return HuggingFaceTokenizer(folders.write_tokenizer_folder(tmp_path_factory.mktemp("t")))
