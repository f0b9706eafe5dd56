"""A damaged checkpoint fails with a `ValueError` that names the damaged file and what is wrong
with it: a truncated `model.safetensors` (bytes needed and found), an unreadable safetensors
header, a `config.json` or shard index that is not JSON; and for GGUF files a truncated file,
a wrong magic and an unreadable header."""

import json
import os
import re

import pytest

from keras_xf.checkpoints import from_gguf
from keras_xf.checkpoints import from_huggingface


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.preprocessing.folders import write_llama_folder

    path, _ = write_llama_folder(tmp_path_factory.mktemp("llama"), tokenizer=False)
    return path


def _copy(folder, tmp_path):
    target = tmp_path / "copy"
    target.mkdir()
    for name in os.listdir(folder):
        (target / name).write_bytes((folder / name).read_bytes())
    return target


def test_the_intact_folder_loads(folder):
    assert from_huggingface(folder).backbone.hidden_dim == 16


def test_truncated_safetensors(folder, tmp_path):
    damaged = _copy(folder, tmp_path)
    path = damaged / "model.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:size - 100])
    message = f"{path} is truncated: its header needs {size} bytes, the file has {size - 100}"
    with pytest.raises(ValueError, match=re.escape(message)):
        from_huggingface(damaged)


def test_truncated_inside_the_header(folder, tmp_path):
    damaged = _copy(folder, tmp_path)
    path = damaged / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match=rf"header of {re.escape(str(path))} cannot be read: "
                                         r"it claims \d+ bytes, the file has 40"):
        from_huggingface(damaged)
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match=r"has 2 bytes, fewer than the 8"):
        from_huggingface(damaged)


def test_damaged_safetensors_header(folder, tmp_path):
    damaged = _copy(folder, tmp_path)
    path = damaged / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:12] = b"#!#!"  # the header's JSON no longer parses
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"safetensors header of {re.escape(str(path))} "
                                         "cannot be read: Expecting value"):
        from_huggingface(damaged)


def test_config_is_not_json(folder, tmp_path):
    damaged = _copy(folder, tmp_path)
    path = damaged / "config.json"
    path.write_text(path.read_text()[:-20])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not valid JSON "
                                         r"\(the model's config\)"):
        from_huggingface(damaged)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"holds a JSON list, not the object"):
        from_huggingface(damaged)


def test_shard_index_is_not_json(folder, tmp_path):
    damaged = _copy(folder, tmp_path)
    path = damaged / "model.safetensors.index.json"
    path.write_text('{"weight_map": ')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not valid JSON "
                                         r"\(the shards' index\)"):
        from_huggingface(damaged)
    path.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(ValueError, match=r"has no weight_map object"):
        from_huggingface(damaged)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    pytest.importorskip("gguf")
    from tests.checkpoints.gguf_files import tiny_model
    from tests.checkpoints.gguf_files import write_gguf

    return write_gguf(tiny_model("llama"), tmp_path_factory.mktemp("gguf") / "tiny.gguf",
                      tokenizer=None)


def test_truncated_gguf(gguf_file, tmp_path):
    data = gguf_file.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:-64])
    message = (f"The GGUF file {path} ({len(data) - 64} bytes) cannot be read: it is "
               "truncated or its header is damaged")
    with pytest.raises(ValueError, match=re.escape(message)):
        from_gguf(path)


def test_gguf_cut_inside_its_header(gguf_file, tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_file.read_bytes()[:200])
    with pytest.raises(ValueError, match=rf"The GGUF file {re.escape(str(path))} \(200 bytes\) "
                                         r"cannot be read: it is truncated or its header is "
                                         r"damaged"):
        from_gguf(path)


def test_gguf_with_a_wrong_magic(gguf_file, tmp_path):
    path = tmp_path / "renamed.gguf"
    path.write_bytes(b"PK\x03\x04" + gguf_file.read_bytes()[4:])
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))} is not a GGUF file: it "
                                         r"starts with b'PK\\x03\\x04', not the magic b'GGUF'"):
        from_gguf(path)
    with pytest.raises(ValueError, match=r"path must be a GGUF file"):
        from_gguf(tmp_path / "absent.gguf")
