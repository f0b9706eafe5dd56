"""Timing, memory and peak-FLOP/s helpers shared by the benchmark cases."""

import os
import resource
import statistics
import time

import keras
import numpy as np


def peak_rss_mb():
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb():
    """The process's resident memory now (MB), from /proc/self/statm (Linux)."""
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def weight_bytes(model):
    """Bytes of a Keras model's variables in memory (kernels, tables, quantisation scales,
    norms, biases), each at its own dtype."""
    return sum(int(np.prod(w.shape)) * np.dtype(keras.backend.standardize_dtype(w.dtype)).itemsize
               for w in model.weights)


def reset_peak_rss():
    """Lowers the process's resident high-water mark (`VmHWM`) to its resident memory now
    (Linux: `echo 5 > /proc/self/clear_refs`), so that `phase_peak_rss_mb` gives the peak of
    what runs next alone. Returns whether the kernel allowed it; where it did not, the mark
    keeps the peak of everything before."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def phase_peak_rss_mb():
    """The resident high-water mark (`VmHWM`, MB) since the last `reset_peak_rss`, or since
    the process started."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return peak_rss_mb()


def device_memory_mb():
    """`(in use, peak)` MB of the accelerator's memory, or None on a CPU (where the resident
    memory of `peak_rss_mb` is the measure). JAX: the first device's allocator statistics;
    PyTorch: `torch.cuda`'s; TensorFlow: `tf.config.experimental.get_memory_info`."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
        if not stats:
            return None
        return stats["bytes_in_use"] / 2**20, stats.get("peak_bytes_in_use", 0) / 2**20
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None
        return torch.cuda.memory_allocated() / 2**20, torch.cuda.max_memory_allocated() / 2**20
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    info = tf.config.experimental.get_memory_info("GPU:0")
    return info["current"] / 2**20, info["peak"] / 2**20


def device_name():
    """The device a pass runs on: the accelerator's name, or "cpu"."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        return jax.devices()[0].device_kind
    if backend == "torch":
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return gpus[0].name if gpus else "cpu"


def sync(value):
    """Waits for asynchronous backends (JAX dispatch) by reading the result on the host."""
    keras.tree.map_structure(lambda t: keras.ops.convert_to_numpy(t), value)
    return value


def median_seconds(function, warmup, repeats):
    """Runs `function` `warmup` times untimed, then returns the median of `repeats` timings."""
    for _ in range(warmup):
        sync(function())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(function())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(functions, repeats):
    """Times each of `functions` (a dict of already warmed-up callables) `repeats` times, in
    turn (a, b, a, b, ...). Returns each one's median under its name and the list of its
    timings under `name_all`."""
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            sync(function())
            times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(t) for name, t in times.items()}
    result.update({f"{name}_all": t for name, t in times.items()})
    return result


def peak_matmul_flops(size=2048, dtype="float32", repeats=5):
    """FLOP/s of a `size`² matmul in `dtype` on the current backend (the machine's practical
    peak, against which model FLOP utilisation is measured)."""
    rng = np.random.default_rng(0)
    a, b = (keras.ops.convert_to_tensor(rng.standard_normal((size, size)), dtype=dtype)
            for _ in range(2))
    # One element is read back: reading the whole product would time its copy to the host,
    # which on an accelerator takes far longer than the product.
    seconds = median_seconds(lambda: keras.ops.matmul(a, b)[:1, :1], warmup=2, repeats=repeats)
    return 2 * size**3 / seconds


def memory_bandwidth_gb_s(megabytes=1024, repeats=5):
    """The memory's read bandwidth in GB/s (10⁹ bytes): the best of `repeats` numpy sums of a
    float32 array of `megabytes` MiB (one thread, far larger than the caches), the rate at
    which a decoding step can stream weights that do not fit in the caches."""
    array = np.ones(megabytes * 2**20 // 4, "float32")
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        array.sum()
        best = min(best, time.perf_counter() - start)
    return array.nbytes / best / 1e9


def cpu_name():
    """The CPU's model name, core count and vector extensions (AVX2, AVX-512, BF16, AMX), from
    /proc/cpuinfo."""
    from benchmarks import report

    try:
        with open("/proc/cpuinfo") as file:
            text = file.read()
    except OSError:
        text = ""
    return report.describe_cpu(*report.parse_cpuinfo(text), os.cpu_count())
