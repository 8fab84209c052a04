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


def _testbed(root, e2e_s, sent, frame_bytes=100, tokens=(1, 2)):
    tb = root / "results" / "testbed" / "good"
    tb.mkdir(parents=True)
    pd.DataFrame({"tokens": [list(tokens)], "e2e_s": [e2e_s]}).to_parquet(tb / "answers.parquet")
    frames = {"bytes": [frame_bytes], "tx_s": [e2e_s / 2], "sent": [sent], "arrival": [sent + 1]}
    pd.DataFrame(frames).to_parquet(tb / "frames.parquet")
    (root / "results" / "report").mkdir()
    (root / "results" / "report" / "testbed_summary.md").write_text(f"ratio {e2e_s}\n")
    pd.DataFrame({"x": [e2e_s]}).to_parquet(root / "results" / "report" / "other.parquet")
    return root


def test_the_testbeds_clock_readings_are_not_results_but_its_tokens_and_bytes_are(tmp_path):
    a = _testbed(tmp_path / "a", e2e_s=1.0, sent=100.0)
    b = _testbed(tmp_path / "b", e2e_s=1.3, sent=250.0)
    # only a table outside the testbed with a measured time differs
    assert compare_runs(a, b) == [
        'report/other.parquet: DataFrame.iloc[:, 0] (column name="x") are different'
    ]
    c = _testbed(tmp_path / "c", e2e_s=1.0, sent=100.0, frame_bytes=101, tokens=(1, 3))
    named = {d.split(":")[0] for d in compare_runs(a, c)}
    assert named == {"testbed/good/answers.parquet", "testbed/good/frames.parquet"}
