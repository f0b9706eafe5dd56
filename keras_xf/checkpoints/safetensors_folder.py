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


def _header(path):
    """The tensor table of a safetensors file and the offset where its data begins."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
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
    """

    def __init__(self, directory):
        directory = os.fspath(directory)
        config_path = os.path.join(directory, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(
                "directory must be a Hugging Face checkpoint folder with a config.json. "
                f"Received: directory={directory!r}"
            )
        with open(config_path) as file:
            self.config = json.load(file)
        if os.path.isfile(os.path.join(directory, INDEX)):
            with open(os.path.join(directory, INDEX)) as file:
                files = sorted(set(json.load(file)["weight_map"].values()))
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
