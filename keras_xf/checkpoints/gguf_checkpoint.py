"""A llama.cpp GGUF file read as a Hugging Face checkpoint: its config dict and its tensors
under Hugging Face names, dequantised one at a time."""

import os

from keras_xf.checkpoints import gguf_config

MAGIC = b"GGUF"
# The tensor types keras_xf dequantises (with the gguf package's NumPy code).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K",
                   "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _gguf_module():
    try:
        import gguf
    except ImportError:
        raise ImportError("Reading GGUF files needs the gguf package: "
                          "pip install 'keras-xf[gguf]'") from None
    return gguf


def _value(field, gguf):
    """The Python value of a metadata field (a number, a string, or a list of either)."""
    kinds = gguf.GGUFValueType
    if field.types[0] == kinds.ARRAY:
        if field.types[-1] == kinds.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [v for i in field.data for v in field.parts[i].tolist()]
    if field.types[0] == kinds.STRING:
        return bytes(field.parts[-1]).decode("utf-8")
    return field.parts[-1].tolist()[0]


class GGUFCheckpoint:
    """A GGUF file of the Llama family in the shape of a `SafetensorsFolder`: `config` is the
    Hugging Face config dict its metadata gives (`gguf_config.hf_config`), and each tensor is
    read by its Hugging Face name, dequantised to float32 by `gguf.quants.dequantize` when
    asked for (the file stays memory-mapped) and turned back from llama.cpp's layout.

    The file is checked when opened: the `GGUF` magic, a header and tensors that the `gguf`
    package reads whole (a file cut short fails there), and every tensor of a type in
    `SUPPORTED_TYPES`.

    Args:
        path: the `.gguf` file.

    Raises:
        ValueError: a file that is not GGUF (its magic), or truncated or damaged so that its
            header or tensors cannot be read (its size named); a tensor type keras_xf does not dequantise, or a
            model it does not express (`gguf_config.hf_config`), named.
    """

    def __init__(self, path):
        gguf = _gguf_module()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"path must be a GGUF file. Received: path={path!r}")
        with open(path, "rb") as file:
            magic = file.read(4)
        if magic != MAGIC:
            raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not the "
                             f"magic {MAGIC!r}.")
        size = os.path.getsize(path)
        try:
            reader = gguf.GGUFReader(path)
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as error:
            # The reader maps the file and cuts its header and tensors from the map: a file
            # cut short fails in the header or in a tensor's shape, in either case here.
            raise ValueError(f"The GGUF file {path} ({size} bytes) cannot be read: it is "
                             f"truncated or its header is damaged ({error}).") from None

        self.directory = path
        self.metadata = {name: _value(field, gguf) for name, field in reader.fields.items()}
        self.architecture = self.metadata.get("general.architecture")
        unsupported = {t.name: t.tensor_type.name for t in reader.tensors
                       if t.tensor_type.name not in SUPPORTED_TYPES}
        if unsupported:
            name, kind = next(iter(unsupported.items()))
            raise ValueError(f"The GGUF file {path} has tensors of types keras_xf does not "
                             f"dequantise: {name!r} is {kind} ({len(unsupported)} in all). "
                             f"Supported types: {list(SUPPORTED_TYPES)}")
        shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist()))
                  for t in reader.tensors}
        self.config = gguf_config.hf_config(self.metadata, shapes, path)
        self._dequantize = gguf.quants.dequantize
        self._tensors = {gguf_config.hf_name(t.name): t for t in reader.tensors}
        self._shapes = {gguf_config.hf_name(name): shape for name, shape in shapes.items()}

    def keys(self):
        """The Hugging Face names of the file's tensors, sorted."""
        return sorted(self._tensors)

    def __contains__(self, name):
        return name in self._tensors

    def shape(self, name):
        """The shape of tensor `name` as Hugging Face stores it (`[out, in]` for a linear
        weight: GGML's dimensions reversed), read without dequantising."""
        return self._shapes[name]

    def __getitem__(self, name):
        """Tensor `name` dequantised to a float32 NumPy array in Hugging Face's layout; a
        `ValueError` naming the file when it has no such tensor."""
        if name not in self._tensors:
            raise ValueError(f"The GGUF file {self.directory} has no tensor {name!r}.")
        tensor = self._tensors[name]
        array = self._dequantize(tensor.data, tensor.tensor_type).reshape(self._shapes[name])
        return gguf_config.to_hf_value(self.architecture, self.config, tensor.name, array)
