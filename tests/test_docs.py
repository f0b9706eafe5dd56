"""`docs/attention.md` is written by `docs/draw_attention_fields.py` from usage lines that it
runs; these tests run the same lines on the current backend and check the page holds them."""

import importlib.util
import pathlib

import numpy as np
import pytest

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"
spec = importlib.util.spec_from_file_location("draw_attention_fields",
                                              DOCS / "draw_attention_fields.py")
draw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(draw)


@pytest.mark.parametrize("entry", draw.ENTRIES, ids=[e[0] for e in draw.ENTRIES])
def test_each_documented_field_runs_and_is_a_distribution(entry):
    title, _, _, code, call = entry
    weights, _ = draw.field(code, call)
    assert weights.shape[0] == draw.LENGTH
    assert np.all(np.isfinite(weights)) and np.all(weights >= 0)
    sums = weights.sum(-1)  # 1, or 0 for a query whose field is empty (hashing)
    assert np.all(np.isclose(sums, 1.0, atol=1e-4) | np.isclose(sums, 0.0)), sums
    assert np.isclose(sums, 1.0, atol=1e-4).sum() >= draw.LENGTH // 2


def test_page_holds_every_usage():
    page = (DOCS / "attention.md").read_text()
    for title, _, _, code, _ in draw.ENTRIES:
        assert f"## {title}" in page and code in page
        assert (DOCS / "images" / "attention" / f"{draw._slug(title)}.png").exists()
    for title, _, _, code in draw.WITHOUT_FIELD:
        assert code in page
        namespace = draw._namespace()
        exec(code, namespace)
