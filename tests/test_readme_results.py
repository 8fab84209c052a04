"""The README's measured results are generated from a run's report files, never typed by hand."""

from __future__ import annotations

import csv
import json
import re

import pytest

from edgespec import readme_results
from edgespec.config import REPO_ROOT


def _write_snapshot(path):
    path.mkdir()
    (path / "run.json").write_text(
        json.dumps(
            {
                "wall_s": 1500.0,
                "command": "snakemake --cores 2",
                "start": "cold",
                "machine": "a 2-core test CPU",
            }
        )
    )
    (path / "precision.json").write_text(
        json.dumps({"dtype": "float32", "reason": "timed probe: float32 faster"})
    )
    (path / "profile.json").write_text(
        json.dumps(
            {
                "draft_token_s": 0.078,
                "target_token_s": 0.257,
                "target_verify_s": {"8": 0.274, "4": 0.27},
                "source": "measured",
            }
        )
    )
    with (path / "rule_times.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerows(
            [["rule", "jobs", "seconds", "peak_rss_mb"], ["decode_wisv", 8, 400.5, 5336]]
        )
    header = ["metric", "paper", "ours", "ours_lo", "ours_hi", "unit", "where"]
    for wing, row in (
        ("cuhlm", ["throughput vs HLM", "206.0", 3.85, 3.5, 7.0, "x", "cuhlm_online, 10 dB"]),
        ("wisv", ["accepted length", "+60.8%", 46.1, "", "", "%", "wisv, poor, g8"]),
    ):
        with (path / f"{wing}_headline.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerows([header, row])
            if wing == "cuhlm":  # large ratios are written out, not in exponent notation
                writer.writerow(
                    ["throughput vs HLM", "1014.0", 2535.4, 1385.1, 5833.05, "x", "offline, -20 dB"]
                )


def test_render_reads_every_figure_from_the_snapshot(tmp_path):
    snap = tmp_path / "snap"
    _write_snapshot(snap)
    text = readme_results.render(snap)
    assert "**float32** (timed probe: float32 faster)" in text
    assert "25.0 min" in text and "| decode_wisv | 8 | 400.5 | 5336 |" in text
    assert "scheduling) | | 1099.5 | |" in text  # the wall time the benchmark files miss
    assert "side by side" not in text
    assert "270 ms (gamma = 4), 274 ms (gamma = 8)" in text  # gammas in numeric order
    assert "| throughput vs HLM | 206x | 3.85x | 3.5x to 7x | cuhlm_online, 10 dB |" in text
    assert "| accepted length | +60.8% | 46.1% |  | wisv, poor, g8 |" in text
    assert "| throughput vs HLM | 1014x | 2535x | 1385x to 5833x | offline, -20 dB |" in text


def test_render_says_when_jobs_ran_side_by_side(tmp_path):
    snap = tmp_path / "snap"
    _write_snapshot(snap)
    run = json.loads((snap / "run.json").read_text())
    (snap / "run.json").write_text(json.dumps({**run, "wall_s": 300.0}))
    text = readme_results.render(snap)
    assert "scheduling)" not in text
    assert "ran side by side" in text and "(400 s of jobs in 300 s)" in text


def test_render_adds_the_optional_parts_the_snapshot_has(tmp_path):
    snap = tmp_path / "snap"
    _write_snapshot(snap)
    assert "Many devices" not in readme_results.render(snap)
    run = json.loads((snap / "run.json").read_text())
    (snap / "run.json").write_text(json.dumps({**run, "second_run_s": 4.25}))
    header = ["metric", "paper", "ours", "ours_lo", "ours_hi", "unit", "where"]
    with (snap / "multidevice_headline.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(
            [header, ["devices until saturation", "-", "inf", 8, "inf", "devices", "hlm"]]
        )
    (snap / "quantization.json").write_text(
        json.dumps(
            {"quantize": "int8_dynamic", "top1_agreement": 0.9, "mean_tv": 0.1, "positions": 64}
        )
    )
    text = readme_results.render(snap)
    assert "found nothing to do in 4.2 s" in text
    assert "| devices until saturation | - | not reached | 8 devices to not reached | hlm |" in text
    assert "top-1 agreement 90.0% and mean total variation 0.100" in text


def test_render_adds_the_timing_of_other_machines(tmp_path):
    """A timing-only snapshot of another machine's run is rendered as one line after the main
    run's times and latency profile: its wall time, its jobs' seconds and longest rules, its
    dtype and a link to its per-rule table, and none of its science figures; runs are listed
    oldest first."""
    snap = tmp_path / "snap"
    _write_snapshot(snap)
    work = tmp_path / "work"
    (work / "results" / "machine").mkdir(parents=True)
    (work / "results" / "machine" / "precision.json").write_text(
        json.dumps({"dtype": "float32", "reason": "no native bf16; probe 2.5x slower"})
    )
    for rule, seconds in (("mine_labels", 579.0), ("decode_wisv", 1200.4), ("fetch_models", 99.0)):
        (work / "benchmarks" / rule).mkdir(parents=True)
        (work / "benchmarks" / rule / "s.tsv").write_text(f"s\tmax_rss\n{seconds}\t5100\n")
    (work / "benchmarks" / "select_dtype.tsv").write_text("s\tmax_rss\n7.0\t500\n")
    other = snap / readme_results.OTHER_MACHINES / "b-avx2"
    run = {"wall_s": 1800.0, "command": "snakemake -c2", "start": "cold", "machine": "an AVX2 CPU"}
    readme_results.snapshot(work, other, {**run, "recorded": "2026-12-04T09:00Z"}, timing_only=True)
    assert sorted(p.name for p in other.iterdir()) == [
        "precision.json",
        "rule_times.csv",
        "run.json",
    ]
    text = readme_results.render(snap)
    main_table = text.index("| decode_wisv | 8 | 400.5 | 5336 |")
    other_part = text.index("**30.0 min** on an AVX2 CPU")
    # after the main run's latency profile, so that it cannot be read as the other machine's
    assert main_table < text.index("**Latency profile**") < other_part
    line = text[other_part:].splitlines()[0]
    assert "with `snakemake -c2` started cold; 1885 s of jobs (longest rules: decode_wisv " in line
    assert "(longest rules: decode_wisv 1200 s, mine_labels 579 s, fetch_models 99 s);" in line
    assert "decoding dtype **float32** (no native bf16; probe 2.5x slower)." in line
    assert line.endswith("(docs/results/other_machines/b-avx2/rule_times.csv)")
    assert "| mine_labels |" not in text and "select_dtype" not in text

    # Oldest first, by the time each snapshot was recorded, whatever the folders' names.
    for name, recorded, wall_s in (
        ("a-later", "2026-12-03T10:00Z", 60.0),
        ("c-early", "2026-12-01T08:00Z", 120.0),
    ):
        dest = snap / readme_results.OTHER_MACHINES / name
        timed = {**run, "wall_s": wall_s, "recorded": recorded}
        readme_results.snapshot(work, dest, timed, timing_only=True)
    text = readme_results.render(snap)
    assert text.index("**2.0 min**") < text.index("**1.0 min**") < text.index("**30.0 min**")
    # A snapshot taken without a time records when it was taken.
    readme_results.snapshot(work, tmp_path / "now", run, timing_only=True)
    stamp = json.loads((tmp_path / "now" / "run.json").read_text())["recorded"]
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\dZ", stamp)


def test_write_replaces_only_the_results_block(tmp_path):
    snap = tmp_path / "snap"
    _write_snapshot(snap)
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# title\n{readme_results.START}\nstale numbers\n{readme_results.END}\n## after\n"
    )
    readme_results.write_readme(readme, snap)
    text = readme.read_text()
    assert "stale numbers" not in text and text.startswith("# title\n")
    assert text.endswith(f"{readme_results.END}\n## after\n")
    assert readme_results.readme_block(text) == readme_results.render(snap)


def test_snapshot_command_line_records_the_run(tmp_path, monkeypatch):
    """``--command`` is a field of the run, not the sub-command."""
    copied = {}
    monkeypatch.setattr(
        readme_results,
        "snapshot",
        lambda workdir, dest, run, bench, timing_only: copied.update(run=run, only=timing_only),
    )
    # a regression must not rewrite this repository's README
    monkeypatch.setattr(readme_results, "write_readme", lambda: copied.update(wrote=True))
    argv = ["snapshot", "--wall-s", "60", "--command", "snakemake --cores 2", "--start", "cold"]
    readme_results.main([*argv, "--machine", "m", "--second-run-s", "1.5"])
    assert copied["run"] == {
        "wall_s": 60.0,
        "command": "snakemake --cores 2",
        "start": "cold",
        "machine": "m",
        "second_run_s": 1.5,
    }
    assert copied["only"] is False
    readme_results.main([*argv, "--machine", "m", "--timing-only"])
    assert copied["only"] is True


def test_snapshot_refuses_an_unfinished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="cuhlm_headline.csv"):
        readme_results.snapshot(tmp_path, tmp_path / "out", {})


def test_rule_times_sum_the_benchmark_files(tmp_path):
    bench = tmp_path / "benchmarks"
    (bench / "decode_cuhlm").mkdir(parents=True)
    line = "s\th:m:s\tmax_rss\n{s}\t0\t{rss}\n"
    (bench / "decode_cuhlm" / "a.tsv").write_text(line.format(s=10.0, rss=100.0))
    (bench / "decode_cuhlm" / "b.tsv").write_text(line.format(s=5.5, rss=300.0))
    (bench / "fetch_models.tsv").write_text(line.format(s=60.0, rss="NA"))
    rows = readme_results.rule_times(bench)
    assert rows == [
        {"rule": "fetch_models", "jobs": 1, "seconds": 60.0, "peak_rss_mb": 0},
        {"rule": "decode_cuhlm", "jobs": 2, "seconds": 15.5, "peak_rss_mb": 300},
    ]


def test_readme_results_block_is_generated_from_docs_results():
    """The README's block equals what the committed snapshot of the measured run renders."""
    snapshot = REPO_ROOT / "docs" / "results"
    assert (snapshot / "run.json").is_file(), "docs/results/ holds no measured run"
    readme = (REPO_ROOT / "README.md").read_text()
    assert readme_results.readme_block(readme) == readme_results.render(snapshot), (
        "README results are stale: run python -m edgespec.readme_results write"
    )
