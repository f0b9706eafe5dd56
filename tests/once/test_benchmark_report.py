"""The arithmetic and tables of `make bench` (`benchmarks/report.py`) on canned numbers: no
timing, nothing run."""

import pytest

from benchmarks import report

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Other CPU
flags\t\t: fpu sse2
"""


def test_parse_cpuinfo_reads_the_first_processor():
    model, extensions = report.parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert extensions == ["AVX2", "AVX-512", "AVX512-VNNI", "AVX512-BF16", "AMX", "AMX-BF16",
                          "AMX-INT8"]


def test_parse_cpuinfo_without_vector_extensions_or_text():
    assert report.parse_cpuinfo("model name : Old\nflags : fpu sse2 avx\n") == ("Old", [])
    assert report.parse_cpuinfo("") == ("unknown CPU", [])
    assert report.describe_cpu("Old", [], 2) == "Old, 2 cores, no AVX2 or AVX-512"
    assert report.describe_cpu("New", ["AVX2", "AVX-512"], 4) == "New, 4 cores, AVX2/AVX-512"


def test_pair_summary_is_the_median_of_round_ratios():
    # keras_xf's times and keras-hub's, 3 rounds; 100 tokens per timed call
    summary = report.pair_summary([1.0, 2.0, 1.0], [2.0, 2.0, 1.5], work=100)
    assert summary["round_ratios"] == [2.0, 1.0, 1.5]
    assert summary["ratio"] == 1.5
    assert (summary["min"], summary["max"]) == (1.0, 2.0)
    assert summary["xf_per_s"] == 100.0  # over the median time, 1.0
    assert summary["hub_per_s"] == 50.0  # over 2.0


def test_pair_summary_rejects_unmatched_rounds():
    with pytest.raises(ValueError, match="same length"):
        report.pair_summary([1.0, 2.0], [1.0], work=1)
    with pytest.raises(ValueError, match="non-empty"):
        report.pair_summary([], [], work=1)


def test_model_flop_utilisation():
    assert report.model_flop_utilisation(1000, 2e6, 4e9) == 0.5


def _results():
    return {
        "train_interleaved": {
            "pairs": {"training": report.pair_summary([1.0, 1.0, 1.0], [1.3, 1.1, 1.2], 2048)},
            "peak_matmul_flops_per_s": 1e11,
            "mfu": {"xf": 0.4, "hub": 0.32},
        },
        "generate_interleaved": {"pairs": {
            "batch_1": report.pair_summary([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 128),
            "batch_8": report.pair_summary([1.0, 1.0, 1.0], [4.0, 3.0, 3.5], 1024),
        }},
    }


def test_rows_and_text_table():
    table = report.rows(_results(), "jax")
    measures = [row[0] for row in table]
    assert measures == ["training tokens/s", "model FLOP utilisation (training)",
                        "greedy generation tokens/s, batch 1",
                        "greedy generation tokens/s, batch 8"]
    training = table[0]
    assert training[3] == pytest.approx(1.2) and training[4:6] == pytest.approx((1.1, 1.3))
    assert training[6] == 1.2
    text = report.format_table(table, "jax", "Some CPU, 2 cores, AVX2", 1e11)
    assert "machine: Some CPU, 2 cores, AVX2" in text
    assert "[1.10, 1.30]" in text
    batch_1 = next(line for line in text.splitlines() if "batch 1" in line)
    assert batch_1.endswith("1.5 ok")  # 2.0 against JAX's 1.5
    assert "100.0 GFLOP/s float32" in text
    assert "GFLOP/s bfloat16" in report.format_table(table, "jax", None, 1e11, "bfloat16")


def test_rows_include_memory_when_the_single_model_cases_ran():
    results = {"train_xf": {"peak_rss_mb": 1000.0, "tokens_per_s": 10.0},
               "train_hub": {"peak_rss_mb": 1200.0, "tokens_per_s": 9.0}}
    (row,) = report.rows(results, "torch")
    assert row[0].startswith("peak training memory") and row[3] == pytest.approx(1.2)


def test_markdown_table_has_one_column_per_backend_and_names_the_machine():
    run = {"machine": "Some CPU, 2 cores, AVX2", "date": "2026-11-27", "rounds": 3,
           "dropout": 0.0, "load_average": [0.1, 0.1, 0.1], "results": _results()}
    quick = dict(run, quick=True)
    text = report.markdown_table({"torch": quick, "jax": run})
    lines = text.splitlines()
    assert lines[0] == "Machine: Some CPU, 2 cores, AVX2."
    assert "QUICK" in lines[1] and lines[1].index("JAX") < lines[1].index("PyTorch")
    assert "| keras_xf / keras-hub | JAX | PyTorch |" in lines
    training = next(line for line in lines if line.startswith("| training tokens/s"))
    assert training == "| training tokens/s | 1.20 [1.10–1.30] (≥ 1.2 ok) | 1.20 [1.10–1.30] (≥ 1.2 ok) |"
    batch_1 = next(line for line in lines if "batch 1" in line)
    assert "(≥ 1.5 ok)" in batch_1 and "(≥ 10 short)" in batch_1  # JAX, PyTorch targets
    mfu = next(line for line in lines if "MFU" in line)
    assert "0.40 / 0.32 (100)" in mfu


def test_settings_on_the_command_line_are_json_values():
    from benchmarks.run import _parse_settings

    assert _parse_settings(["BATCH=32", "POLICY=mixed_bfloat16", "FLASH_ATTENTION=true"]) == {
        "BATCH": 32, "POLICY": "mixed_bfloat16", "FLASH_ATTENTION": True}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        _parse_settings(["BATCH"])


def test_median_profile_and_op_table():
    """Op profiles (`benchmarks.profile_torch`, `profile_jax`): the median of each op over
    calls (missing counts 0), and the side-by-side table ordered by the largest time."""
    calls = [{"mm": (10.0, 4), "add": (2.0, 8)}, {"mm": (30.0, 4)},
             {"mm": (20.0, 4), "add": (4.0, 8)}]
    median = report.median_profile(calls)
    assert median == {"mm": (20.0, 4), "add": (2.0, 8)}
    table = report.op_table("step", {"a": median, "b": {"bmm": (30.0, 2), "mm": (10.0, 2)}})
    lines = table.splitlines()
    assert lines[0] == "step"
    assert [line.split()[0] for line in lines[2:5]] == ["bmm", "mm", "add"]
    assert "20.00 ms  90.9 %" in lines[3] and "10.00 ms  25.0 %" in lines[3]
    assert lines[-2].split()[1:] == ["22.00", "ms", "100.0", "%", "40.00", "ms", "100.0", "%"]
    assert lines[-1].split()[-4:] == ["12", "ops", "4", "ops"]
    walled = report.op_table("step", {"a": median, "b": median}, wall={"a": 25.0, "b": 30.5})
    assert walled.splitlines()[-1].split() == ["wall", "time", "per", "call", "25.00", "ms",
                                               "30.50", "ms"]
    assert report.median_wall({"a": [3.0, 1.0, 2.0]}) == {"a": 2.0}


def test_interleaved_alternates_the_models_after_their_warm_up():
    """`report.interleaved` (the profilers' loop): every model warmed up first, then the models
    called in turn each round; the median profile and wall time per model."""
    order = []
    calls = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = {"a": iter([1.0, 5.0, 3.0]), "b": iter([2.0, 2.0, 8.0])}

    def profile(name, call):
        call()
        ms = next(times[name])
        return {"mm": (ms, 1)}, 10 * ms

    profiles, walls = report.interleaved(calls, 3, profile, warmup=2)
    assert order == ["a", "a", "b", "b"] + ["a", "b"] * 3
    assert profiles == {"a": {"mm": (3.0, 1)}, "b": {"mm": (2.0, 1)}}
    assert walls == {"a": 30.0, "b": 20.0}
