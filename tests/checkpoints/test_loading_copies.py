"""Loading in proportion to the bytes: each checkpoint tensor reaches its variable in one
C-ordered copy that the variable owns (a `torch.nn.Linear` weight, read as a transposed view,
is transposed by the backend, or copied in tiles), and a progress bar over the megabytes loaded shows for large checkpoints
or when asked, and hides when told."""

import re

import keras
import numpy as np
import pytest

from keras_xf.checkpoints import from_gguf
from keras_xf.checkpoints import from_huggingface
from keras_xf.checkpoints.deferred_variables import built_without_values
from keras_xf.checkpoints.deferred_variables import fill
from keras_xf.checkpoints.deferred_variables import initialize_unfilled
from keras_xf.checkpoints.variable_values import c_ordered_copy
from keras_xf.checkpoints.variable_values import c_ordered_permutation
from keras_xf.checkpoints.variable_values import variable_value


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.preprocessing.folders import write_llama_folder

    path, _ = write_llama_folder(tmp_path_factory.mktemp("llama"), tokenizer=False)
    return path


@pytest.mark.parametrize("shape, axes", [
    ((100, 70), (1, 0)),            # a Linear weight [out, in] read as a kernel [in, out]
    ((3, 50, 70), (2, 0, 1)),
    ((64, 4, 33), (0, 2, 1)),
    ((5, 1, 7), (2, 1, 0)),         # a size-1 axis among them
    ((7,), (0,)),
    ((3, 4, 5, 6), (3, 1, 0, 2)),
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_c_ordered_copy_equals_numpy(shape, axes, dtype):
    source = np.random.default_rng(0).normal(size=shape).astype("float32")
    view = source.transpose(axes)
    copied = c_ordered_copy(view, dtype)
    assert copied.flags.c_contiguous and copied.dtype == dtype
    np.testing.assert_array_equal(copied, view.astype(dtype))
    assert not np.may_share_memory(copied, source)


@pytest.mark.parametrize("shape, axes", [
    ((100, 70), (1, 0)),
    ((3, 50, 70), (2, 0, 1)),
    ((5, 1, 7), (2, 1, 0)),
    ((3, 4, 5, 6), (3, 1, 0, 2)),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_permuted_view_reaches_the_backend_in_c_order(shape, axes, dtype):
    # Views of a read-only block, as a file mapping gives: the backend's own transposition.
    source = np.random.default_rng(0).normal(size=shape).astype("float32")
    source.flags.writeable = False
    view = source.transpose(axes)
    assert c_ordered_permutation(view) is not None
    value = variable_value(view, dtype, [source])
    actual = keras.ops.convert_to_numpy(keras.ops.cast(value, "float32"))
    np.testing.assert_array_equal(actual, view.astype(dtype).astype("float32"))


def test_only_a_permuted_c_ordered_block_has_a_permutation():
    block = np.zeros((6, 8), "float32")
    assert c_ordered_permutation(block.T) == (1, 0)
    assert c_ordered_permutation(block[:, ::2]) is None  # a strided slice
    assert c_ordered_permutation(block[::-1]) is None  # a negative stride


def test_a_linear_weight_split_into_heads_is_copied_whole():
    # `[H·Dh, d]` read as a query kernel `[d, H, Dh]`: a transposed view with a middle axis.
    weight = np.arange(12 * 8, dtype="float32").reshape(12, 8)
    view = weight.T.reshape(8, 3, 4)
    np.testing.assert_array_equal(c_ordered_copy(view, "float32"), np.ascontiguousarray(view))


def _aligned(shape, dtype, alignment=4096):
    """A C-ordered array at an address that is a multiple of `alignment`, as a tensor in a
    file mapping can be (JAX keeps such a NumPy array as its buffer instead of copying it)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + alignment, "uint8")
    start = -raw.ctypes.data % alignment
    return raw[start:start + size].view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_filled_variable_owns_its_memory(transposed, dtype):
    source = _aligned((3, 4), "float32")
    source[...] = np.arange(12, dtype="float32").reshape(3, 4)
    value = source.T if transposed else source
    source.flags.writeable = False  # as a read-only file mapping is
    try:
        with built_without_values():
            variable = keras.Variable(initializer="zeros", shape=value.shape, dtype=dtype)
        fill(variable, variable_value(value, dtype, [source]))
    finally:
        initialize_unfilled()
    expected = np.array(value)
    source.flags.writeable = True
    source[...] = -1.0  # the checkpoint's memory changes (or goes): the variable does not
    actual = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
    np.testing.assert_array_equal(actual, expected)


def test_a_loaded_model_owns_its_weights(folder, tmp_path):
    import shutil

    copy = shutil.copytree(folder, tmp_path / "copy")
    model = from_huggingface(copy, progress=False)
    ids = np.arange(1, 7, dtype="int32")[None]
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    before = keras.ops.convert_to_numpy(model(inputs))
    for path in copy.glob("*.safetensors"):  # the files it read are overwritten with zeros
        with open(path, "r+b") as file:
            file.seek(8)
            file.write(b"\0" * (path.stat().st_size - 8))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(inputs)), before)


def test_progress_bar_when_asked(folder, capsys):
    from_huggingface(folder, progress=True)
    shown = capsys.readouterr().out
    assert re.search(r"\d+(\.\d+)?/\d+(\.\d+)?", shown) and "/MB" in shown, shown


def test_no_progress_bar_when_told_or_small(folder, capsys):
    from_huggingface(folder, progress=False)
    from_huggingface(folder)  # a checkpoint of a few kilobytes: under 100 MB
    assert "MB" not in capsys.readouterr().out


def test_progress_must_be_a_bool_or_none(folder):
    with pytest.raises(ValueError, match=re.escape(
            "progress must be True, False or None. Received: progress='yes'")):
        from_huggingface(folder, progress="yes")


def test_gguf_progress_bar(capsys, tmp_path):
    pytest.importorskip("gguf")
    from tests.checkpoints.gguf_files import tiny_model
    from tests.checkpoints.gguf_files import write_gguf

    path = write_gguf(tiny_model("llama"), tmp_path / "tiny.gguf", tokenizer=None)
    from_gguf(path, progress=True)
    assert "/MB" in capsys.readouterr().out
    from_gguf(path, progress=False)
    assert "MB" not in capsys.readouterr().out
