"""A compilation cache on disk, so that a new process reuses the XLA programs of earlier ones.

The first `generate` call of each shape compiles its decoding loop (seconds for a model of
real size); with the cache on, a later process that compiles the same program (the same
model architecture, dtype, shapes and settings; the weights are inputs, not constants) reads
it back instead. The cache belongs to the backend: JAX's `jax_compilation_cache_dir`, and
TensorFlow's XLA persistent cache (`TF_XLA_FLAGS=--tf_xla_persistent_cache_directory`). It
serves every XLA compilation of the process, `fit` and `predict` included.

Why not `keras.ops`: Keras has no setting for it; each backend keeps its own.
"""

import os
import pathlib

import keras


def enable_compilation_cache(directory, min_compile_seconds=1.0):
    """Turns on the backend's compilation cache in `directory` (created when missing).

    Args:
        directory: a path; a folder of compiled programs, one file per program.
        min_compile_seconds: on JAX, programs that compiled faster than this are not
            written (JAX's `jax_persistent_cache_min_compile_time_secs`; its default, 1).
            TensorFlow writes every XLA program.

    Returns:
        True where the backend now caches its programs (JAX, TensorFlow); False on PyTorch,
        whose decoding steps are TorchScript traces kept in memory, with nothing on disk to
        reuse.

    On TensorFlow, call it before the process's first XLA compilation: TensorFlow reads its
    XLA flags once, at that compilation, and a cache named later is refused with a
    `ValueError`. Setting `TF_XLA_FLAGS` before Python starts does the same.

        import keras_xf
        keras_xf.generation.enable_compilation_cache("~/.cache/keras_xf/xla")
    """
    if isinstance(min_compile_seconds, bool) or not isinstance(min_compile_seconds,
                                                               (int, float)) or (
            min_compile_seconds < 0):
        raise ValueError("min_compile_seconds must be a number >= 0. Received: "
                         f"min_compile_seconds={min_compile_seconds!r}")
    if not isinstance(directory, (str, os.PathLike)):
        raise ValueError(f"directory must be a path. Received: directory={directory!r}")
    folder = pathlib.Path(directory).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_compilation_cache_dir", str(folder))
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(min_compile_seconds))
        return True
    if backend == "tensorflow":
        _set_tensorflow_cache(folder)
        return True
    return False


_TF_FLAG = "--tf_xla_persistent_cache_directory"


def _set_tensorflow_cache(folder):
    """Adds the cache flag to `TF_XLA_FLAGS`, which TensorFlow parses at its first XLA
    compilation; checked by compiling a one-op program, whose file must appear."""
    import tensorflow as tf

    flags = [flag for flag in os.environ.get("TF_XLA_FLAGS", "").split()
             if not flag.startswith(_TF_FLAG + "=")]
    os.environ["TF_XLA_FLAGS"] = " ".join(flags + [f"{_TF_FLAG}={folder}"])
    before = set(folder.iterdir())
    # A random constant, so that the probe's program is new to the folder.
    offset = int.from_bytes(os.urandom(4), "little") / 2**32
    probe = tf.function(lambda x: x * 2.0 + offset, jit_compile=True)
    probe(tf.constant(1.0))
    if not set(folder.iterdir()) - before:
        raise ValueError(
            "TensorFlow read its XLA flags before enable_compilation_cache was called, so it "
            f"cannot cache in directory={str(folder)!r}: call it before the first compiled "
            "function of the process, or set TF_XLA_FLAGS="
            f"{_TF_FLAG}={folder} before starting Python."
        )
