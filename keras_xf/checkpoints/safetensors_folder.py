"""A Hugging Face checkpoint folder: `config.json` and its safetensors files."""

import json
import os
import struct

import ml_dtypes
import numpy as np

# The safetensors dtype names and their NumPy types (bfloat16 and float8 from ml_dtypes, the
# package Keras itself uses for them).
DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def read_json_file(path, what):
    """The JSON value in `path`, or a `ValueError` naming the file (`what` it should hold)."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({what}): {error}") from None


def _header(path):
    """The tensor table of a safetensors file and the offset where its data begins; a
    `ValueError` naming the file when the header cannot be read or the file is shorter than
    its table says (a truncated copy)."""
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise ValueError(f"The safetensors header of {path} cannot be read: the file has "
                             f"{size} bytes, fewer than the 8 of its header length.")
        (length,) = struct.unpack("<Q", prefix)
        if 8 + length > size:
            raise ValueError(f"The safetensors header of {path} cannot be read: it claims "
                             f"{length} bytes, the file has {size}.")
        try:
            header = json.loads(file.read(length))
            if not isinstance(header, dict):
                raise ValueError(f"a JSON {type(header).__name__}, not an object")
            header.pop("__metadata__", None)
            end = max([int(e["data_offsets"][1]) for e in header.values()], default=0)
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError) as error:
            raise ValueError(f"The safetensors header of {path} cannot be read: "
                             f"{error}") from None
    if 8 + length + end > size:
        raise ValueError(f"{path} is truncated: its header needs {8 + length + end} bytes, "
                         f"the file has {size}.")
    return header, 8 + length


class SafetensorsFolder:
    """Reads tensors from a checkpoint folder, one at a time, as read-only NumPy arrays
    mapped from the files (nothing is copied until a tensor is used).

    The files are read by their published layout (an 8-byte header length, a JSON table of
    dtype, shape and byte offsets, then the data), not through the `safetensors` package's
    NumPy API, which has no bfloat16 and copies every tensor it returns.

    Args:
        directory: a folder with `config.json` and `model.safetensors`, or the sharded files
            and `model.safetensors.index.json`.

    Raises:
        ValueError: a folder without these files; a `config.json` or index that is not JSON,
            a safetensors file whose header cannot be read, or one shorter than its header
            says (a truncated copy: the bytes needed and found), each naming the file.
    """

    def __init__(self, directory):
        directory = os.fspath(directory)
        config_path = os.path.join(directory, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(
                "directory must be a Hugging Face checkpoint folder with a config.json. "
                f"Received: directory={directory!r}"
            )
        self.config = read_json_file(config_path, "the model's config")
        if not isinstance(self.config, dict):
            raise ValueError(f"{config_path} holds a JSON {type(self.config).__name__}, not "
                             "the object of a model's config.")
        if os.path.isfile(os.path.join(directory, INDEX)):
            index = read_json_file(os.path.join(directory, INDEX), "the shards' index")
            if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
                raise ValueError(f"{os.path.join(directory, INDEX)} has no weight_map object.")
            files = sorted(set(index["weight_map"].values()))
        elif os.path.isfile(os.path.join(directory, SINGLE)):
            files = [SINGLE]
        else:
            raise ValueError(
                f"directory holds no {SINGLE} and no {INDEX}: keras_xf reads safetensors "
                f"checkpoints only. Received: directory={directory!r}"
            )
        self.directory = directory
        self._tensors = {}
        for name in files:
            path = os.path.join(directory, name)
            header, start = _header(path)
            for key, entry in header.items():
                self._tensors[key] = (path, start, entry)

    def keys(self):
        return sorted(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def shape(self, name):
        return tuple(self._tensors[name][2]["shape"])

    def __getitem__(self, name):
        if name not in self._tensors:
            raise ValueError(f"The checkpoint in {self.directory} has no tensor {name!r}.")
        path, start, entry = self._tensors[name]
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"Tensor {name!r} has dtype {entry['dtype']}, which keras_xf "
                             f"does not read. Readable: {sorted(DTYPES)}")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end == begin:
            return np.zeros(shape, DTYPES[entry["dtype"]])
        return np.memmap(path, dtype=DTYPES[entry["dtype"]], mode="r", offset=start + begin,
                         shape=shape)
