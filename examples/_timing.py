"""Timing shared by the examples: calls timed side by side, the fastest of each kept."""

import time

import keras


def fastest_seconds(calls, repeats):
    """The fastest of `repeats` timed calls of each zero-argument function in `calls`, after
    one warm-up call each. The functions are called in turn in each round, so a change of the
    machine's load reaches them all, and the fastest call is the least disturbed. A call's
    result is converted to numpy inside the timing, so asynchronous backends finish it."""
    for call in calls:
        call()
    times = [[] for _ in calls]
    for _ in range(repeats):
        for call, spent in zip(calls, times):
            start = time.perf_counter()
            keras.tree.map_structure(keras.ops.convert_to_numpy, call())
            spent.append(time.perf_counter() - start)
    return [min(spent) for spent in times]
