"""NoamSchedule: `η = η₀ · min(n^-0.5, n · w^-1.5)`, `n = step + 1` (survey §2.7)."""

import keras
import numpy as np
import pytest

from keras_xf.training import NoamSchedule

WARMUP = 10
ETA0 = 16 ** -0.5


def noam(step, eta0=ETA0, warmup=WARMUP):
    n = np.asarray(step, "float64") + 1.0
    return eta0 * np.minimum(n ** -0.5, n * warmup ** -1.5)


def rates(schedule, steps):
    return np.array([float(keras.ops.convert_to_numpy(schedule(s))) for s in steps])


def test_matches_the_formula():
    schedule = NoamSchedule(ETA0, warmup_steps=WARMUP)
    steps = [0, 1, 2, WARMUP - 2, WARMUP - 1, WARMUP, WARMUP + 1, 3 * WARMUP, 1000]
    np.testing.assert_allclose(rates(schedule, steps), noam(steps), rtol=1e-6)


def test_accepts_integer_tensors():
    schedule = NoamSchedule(ETA0, warmup_steps=WARMUP)
    for dtype in ("int32", "int64"):
        step = keras.ops.convert_to_tensor(np.array(4, dtype))
        np.testing.assert_allclose(float(keras.ops.convert_to_numpy(schedule(step))), noam(4),
                                   rtol=1e-6)


def test_peaks_at_the_end_of_warmup():
    schedule = NoamSchedule(ETA0, warmup_steps=WARMUP)
    values = rates(schedule, range(4 * WARMUP))
    # n = step + 1 reaches the warmup length at step WARMUP - 1.
    assert int(np.argmax(values)) == WARMUP - 1
    np.testing.assert_allclose(values.max(), ETA0 * WARMUP ** -0.5, rtol=1e-6)
    # Linear growth before the peak, inverse square root after it.
    np.testing.assert_allclose(values[: WARMUP], values[0] * np.arange(1, WARMUP + 1), rtol=1e-5)
    np.testing.assert_allclose(values[WARMUP - 1:] * np.sqrt(np.arange(WARMUP, 4 * WARMUP + 1)),
                               ETA0, rtol=1e-5)


def test_drives_an_optimizer():
    schedule = NoamSchedule(ETA0, warmup_steps=WARMUP)
    optimizer = keras.optimizers.Adam(schedule)
    variable = keras.Variable(np.ones(3, "float32"))
    for expected_step in range(3):
        np.testing.assert_allclose(float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
                                   noam(expected_step), rtol=1e-6)
        optimizer.apply_gradients([(keras.ops.ones(3), variable)])


def test_config_round_trip():
    schedule = NoamSchedule(0.5, warmup_steps=4000)
    assert schedule.get_config() == {"initial_learning_rate": 0.5, "warmup_steps": 4000}
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(clone, NoamSchedule) and clone.get_config() == schedule.get_config()


@pytest.mark.parametrize("kwargs, name", [
    (dict(initial_learning_rate=1.0, warmup_steps=0), "warmup_steps"),
    (dict(initial_learning_rate=1.0, warmup_steps=2.5), "warmup_steps"),
    (dict(initial_learning_rate=0.0, warmup_steps=10), "initial_learning_rate"),
])
def test_invalid_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NoamSchedule(**kwargs)
