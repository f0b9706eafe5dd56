"""`benchmarks/lora_memory.py`'s table on canned results, and the resident high-water mark it
resets around each training step (`benchmarks/measure.py`)."""

import numpy as np

from benchmarks import lora_memory
from benchmarks import measure


def result(mode, weight_mb, peak_above_start_mb, seconds):
    start = 800.0
    return {"backend": "torch", "mode": mode, "parameters": 124_700_000,
            "trainable_parameters": 245_760, "weight_mb": weight_mb,
            "rss_before_build_mb": start, "setup_peak_mb": 1500.0, "rss_before_fit_mb": 1200.0,
            "first_step_peak_mb": start + peak_above_start_mb - 10,
            "later_steps_peak_mb": start + peak_above_start_mb,
            "fit_peak_above_start_mb": peak_above_start_mb,
            "later_steps_peak_above_start_mb": peak_above_start_mb,
            "seconds_per_step": seconds, "losses": [10.7, 10.6]}


def test_table_has_a_row_a_run_and_ratios_to_float32():
    text = lora_memory.table([result("float32", 400.0, 1000.0, 2.0),
                              result("int8", 100.0, 700.0, 4.0)])
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("backend base")
    assert lines[2].split()[:5] == ["torch", "float32", "124.7", "245.8", "400"]
    assert "10.7000 → 10.6000" in lines[3]
    assert lines[4] == ("torch int8 / float32: weights 0.25, Δ fit peak 0.70, "
                        "Δ later peak 0.70, time a step 2.00")


def test_the_phase_peak_resets_to_the_resident_memory():
    # Linux lets a process reset its own high-water mark (`/proc/self/clear_refs`), as the
    # benchmark needs.
    assert measure.reset_peak_rss()
    block = np.ones(2**24)  # 128 MB, touched
    del block
    high = measure.phase_peak_rss_mb()
    assert high >= measure.current_rss_mb() + 100
    assert measure.reset_peak_rss()
    assert measure.phase_peak_rss_mb() < high - 100
