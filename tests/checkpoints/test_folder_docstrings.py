"""The docstring examples of the checkpoint converters and the folder tokenizer run as
written, their `path/to/...` folders being tiny ones that the test writes the way
`transformers` and `sentence-transformers` write real ones (the examples carry
`# doctest: +SKIP` for doctest runners, which have no such folders)."""

import doctest

import keras_hub
import pytest

from keras_xf.checkpoints import convert
from keras_xf.checkpoints import from_keras_hub
from keras_xf.checkpoints import sentence_transformers
from keras_xf.checkpoints import tokenizer_files
from keras_xf.preprocessing import HuggingFaceTokenizer

DOCUMENTED = [convert.from_huggingface, convert.to_huggingface,
              tokenizer_files.write_tokenizer_files, HuggingFaceTokenizer,
              sentence_transformers.SentenceTransformersFolder,
              sentence_transformers.sentence_transformers_settings]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    from tests.checkpoints.sentence_folders import write_sentence_folder
    from tests.checkpoints.sentence_folders import write_transformer_folder
    from tests.preprocessing.folders import write_llama_folder

    root = tmp_path_factory.mktemp("documented")
    llama, _ = write_llama_folder(root / "llama")
    sentences = write_sentence_folder(write_transformer_folder(root / "bert"),
                                      root / "sentences", "mean", normalize=True)
    return {"path/to/llama": llama, "path/to/all-MiniLM-L6-v2": sentences,
            "path/to/out": root / "out"}


@pytest.mark.parametrize("documented", DOCUMENTED, ids=lambda obj: obj.__name__)
def test_docstring_example_runs(documented, folders):
    namespace = {"from_huggingface": convert.from_huggingface,
                 "to_huggingface": convert.to_huggingface,
                 "write_tokenizer_files": tokenizer_files.write_tokenizer_files,
                 "HuggingFaceTokenizer": HuggingFaceTokenizer,
                 "SentenceTransformersFolder": sentence_transformers.SentenceTransformersFolder,
                 "sentence_transformers_settings":
                     sentence_transformers.sentence_transformers_settings}
    examples = doctest.DocTestParser().get_examples(documented.__doc__)
    assert examples and any("path/to/" in example.source for example in examples)
    for example in examples:
        source = example.source
        for name, path in folders.items():
            source = source.replace(f'"{name}"', repr(str(path)))
        assert "path/to/" not in source, source
        exec(source, namespace)


def test_from_keras_hub_example_runs():
    namespace = {"keras_hub": keras_hub, "from_keras_hub": from_keras_hub}
    for example in doctest.DocTestParser().get_examples(from_keras_hub.__doc__):
        assert doctest.SKIP not in example.options
        exec(example.source, namespace)
    assert namespace["encoder"].count_params() > 0
