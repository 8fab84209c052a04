"""Two runs' tables compared: what counts as the same result, and what does not."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from edgespec.runcompare import compare_runs, main


def _run(root, value=1.0, load_s=3.0, extra=None):
    results = root / "results"
    (results / "t").mkdir(parents=True)
    pd.DataFrame({"x": [value, 2.0]}).to_parquet(results / "t" / "table.parquet")
    meta = {"tokens": 10, "load_s": load_s, "nested": {"peak_rss_mb": load_s * 100}}
    (results / "t" / "meta.json").write_text(json.dumps(meta))
    np.savez(results / "t" / "hidden.npz", h=np.arange(4.0) * value)
    (results / "t" / "summary.md").write_text(f"| x |\n| {value} |\n")
    for name in extra or ():
        (results / name).write_text("x")
    return root


def test_two_runs_that_differ_only_in_timings_have_the_same_tables(tmp_path):
    a = _run(tmp_path / "a", load_s=3.0)
    b = _run(tmp_path / "b", load_s=4.5)
    assert compare_runs(a, b) == []
    assert main([str(a), str(b)]) == 0


def test_a_changed_value_a_missing_file_and_a_changed_count_are_named(tmp_path):
    a = _run(tmp_path / "a", value=1.0, extra=["only_a.csv"])
    b = _run(tmp_path / "b", value=1.5)
    meta = json.loads((b / "results/t/meta.json").read_text())
    (b / "results/t/meta.json").write_text(json.dumps({**meta, "tokens": 11}))
    diffs = compare_runs(a, b)
    assert any(d.startswith("only in") and "only_a.csv" in d for d in diffs)
    named = {d.split(":")[0] for d in diffs}
    assert {"t/table.parquet", "t/hidden.npz", "t/summary.md", "t/meta.json"} <= named
    assert "['tokens']" in next(d for d in diffs if d.startswith("t/meta.json"))
    assert main([str(a), str(b)]) == 1


def test_a_directory_without_results_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results/"):
        compare_runs(tmp_path, tmp_path)
