"""Measured runs are kept as data, and the README's headline and the runs' index are generated
from them, never typed by hand."""

from __future__ import annotations

import csv
import json
import re

import pytest

from edgespec import readme_results

HEADER = ["metric", "paper", "ours", "ours_lo", "ours_hi", "unit", "where"]


def _write_run(path, recorded, wall_s=1500.0, full=True, jobs_s=400.5, commit="abc1234"):
    path.mkdir(parents=True)
    run = {
        "wall_s": wall_s,
        "command": "snakemake --cores 2",
        "start": "cold in a fresh clone (no model cache)",
        "machine": "a 2-core test CPU, 23 GiB",
        "cpu": "Test EPYC, AVX2 only",
        "commit": commit,
        "recorded": recorded,
    }
    (path / "run.json").write_text(json.dumps(run))
    (path / "precision.json").write_text(
        json.dumps({"dtype": "float32", "reason": "timed probe: float32 faster"})
    )
    with (path / "rule_times.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(
            [["rule", "jobs", "seconds", "peak_rss_mb"], ["decode_wisv", 8, jobs_s, 5336]]
        )
    if not full:
        return path
    for wing, row in (
        ("cuhlm", ["throughput vs HLM", "206.0", 3.85, 3.5, 7.0, "x", "cuhlm_online, 10 dB"]),
        ("wisv", ["accepted length", "+60.8%", 46.1, "", "", "%", "wisv, poor, g8"]),
    ):
        with (path / f"{wing}_headline.csv").open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerows([HEADER, row])
            if wing == "cuhlm":  # large ratios are written out, not in exponent notation
                writer.writerow(
                    ["throughput vs HLM", "1014.0", 2535.4, 1385.1, 5833.05, "x", "offline, -20 dB"]
                )
    return path


def test_render_reads_every_figure_from_the_latest_full_snapshot(tmp_path):
    _write_run(tmp_path / "avx2-old0000", "2026-12-01T10:00Z", commit="old0000")
    _write_run(tmp_path / "avx2-abc1234", "2026-12-03T10:00Z")
    # A newer timing-only snapshot does not become the headline run.
    _write_run(tmp_path / "avx2-new9999", "2026-12-04T10:00Z", full=False, commit="new9999")
    text = readme_results.render(tmp_path)
    assert "[`docs/results/avx2-abc1234/`](docs/results/avx2-abc1234/)" in text
    assert "on Test EPYC, AVX2 only (2026-12-03, commit abc1234, dtype float32), 25.0 min" in text
    assert "old0000" not in text and "new9999" not in text
    assert "| throughput vs HLM | 206x | 3.85x | 3.5x to 7x | cuhlm_online, 10 dB |" in text
    assert "| accepted length | +60.8% | 46.1% |  | wisv, poor, g8 |" in text
    assert "| throughput vs HLM | 1014x | 2535x | 1385x to 5833x | offline, -20 dB |" in text
    assert "(docs/results/avx2-abc1234/wisv_summary.md)" in text


def test_render_adds_the_optional_parts_the_snapshot_has(tmp_path):
    snap = _write_run(tmp_path / "avx2-abc1234", "2026-12-03T10:00Z")
    assert "Many devices" not in readme_results.render(tmp_path)
    with (snap / "multidevice_headline.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(
            [HEADER, ["devices until saturation", "-", "inf", 8, "inf", "devices", "hlm"]]
        )
    (snap / "quantization.json").write_text(
        json.dumps(
            {"quantize": "int8_dynamic", "top1_agreement": 0.9, "mean_tv": 0.1, "positions": 64}
        )
    )
    testbed = [
        ["method", "channel", "ratio", "bytes_equal", "tokens_equal"],
        ["hlm", "good", 0.91, True, True],
        ["wisv_fh", "poor", 1.32, False, True],
        ["cuhlm_online", "poor", "", True, False],
    ]
    with (snap / "testbed_summary.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(testbed)
    text = readme_results.render(tmp_path)
    assert "| devices until saturation | - | not reached | 8 devices to not reached | hlm |" in text
    assert "top-1 agreement 90.0% and mean total variation 0.100" in text
    assert "(docs/results/avx2-abc1234/testbed_summary.md)" in text
    assert "in 2 of 3 method-channel cells the bytes on the wire equal the model's" in text
    assert "in 2 the tokens equal the single-process decode's" in text
    assert "measured/modelled latency 0.91 to 1.32" in text


def test_render_needs_a_full_snapshot(tmp_path):
    _write_run(tmp_path / "avx2-new9999", "2026-12-04T10:00Z", full=False)
    with pytest.raises(FileNotFoundError, match="no full snapshot"):
        readme_results.render(tmp_path)


def test_the_index_has_one_row_per_run_newest_first(tmp_path):
    _write_run(tmp_path / "avx2-abc1234", "2026-12-03T10:00Z", wall_s=1200.0, jobs_s=2000.4)
    _write_run(
        tmp_path / "avx2-new9999", "2026-12-04T10:00Z", full=False, wall_s=600.0, commit="new9999"
    )
    text = readme_results.render_index(tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert rows == [
        "| 2026-12-04 | Test EPYC, AVX2 only | float32 | new9999 | cold | 10.0 min | 400 | "
        "[avx2-new9999](avx2-new9999/) (timings) |",
        "| 2026-12-03 | Test EPYC, AVX2 only | float32 | abc1234 | cold | 20.0 min | 2000 | "
        "[avx2-abc1234](avx2-abc1234/) (full) |",
    ]
    assert (
        "- **avx2-abc1234**: a 2-core test CPU, 23 GiB; `snakemake --cores 2` started cold in "
        in (text)
    )


def test_write_replaces_only_the_results_block_and_writes_the_index(tmp_path):
    results = tmp_path / "results"
    _write_run(results / "avx2-abc1234", "2026-12-03T10:00Z")
    readme = tmp_path / "README.md"
    readme.write_text(
        f"# title\n{readme_results.START}\nstale numbers\n{readme_results.END}\n## after\n"
    )
    readme_results.write_readme(readme, results)
    readme_results.write_index(results)
    text = readme.read_text()
    assert "stale numbers" not in text and text.startswith("# title\n")
    assert text.endswith(f"{readme_results.END}\n## after\n")
    assert readme_results.readme_block(text) == readme_results.render(results)
    assert (results / "README.md").read_text() == readme_results.render_index(results)


def _finished_workdir(tmp_path, simd=("avx2", "fma")):
    work = tmp_path / "work"
    (work / "results" / "machine").mkdir(parents=True)
    precision = {"dtype": "float32", "reason": "probe", "machine": {"simd": list(simd)}}
    (work / "results" / "machine" / "precision.json").write_text(json.dumps(precision))
    for rule, seconds in (("mine_labels", 579.0), ("decode_wisv", 1200.4)):
        (work / "benchmarks" / rule).mkdir(parents=True)
        (work / "benchmarks" / rule / "s.tsv").write_text(f"s\tmax_rss\n{seconds}\t5100\n")
    return work


def test_a_timing_only_snapshot_keeps_the_dtype_and_rule_times(tmp_path):
    work = _finished_workdir(tmp_path)
    dest = tmp_path / "avx2-b"
    readme_results.snapshot(work, dest, {"wall_s": 60.0}, timing_only=True)
    assert sorted(p.name for p in dest.iterdir()) == [
        "precision.json",
        "rule_times.csv",
        "run.json",
    ]
    rows = list(csv.DictReader((dest / "rule_times.csv").open()))
    assert [r["rule"] for r in rows] == ["decode_wisv", "mine_labels"]
    stamp = json.loads((dest / "run.json").read_text())["recorded"]
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\dZ", stamp)


def test_snapshot_refuses_an_unfinished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="cuhlm_headline.csv"):
        readme_results.snapshot(tmp_path, tmp_path / "out", {})


def test_snapshot_command_line_records_the_run_under_machine_and_commit(tmp_path, monkeypatch):
    """``--command`` is a field of the run, not the sub-command; the folder is named by the
    machine class the run's precision record gives and the commit."""
    work = _finished_workdir(tmp_path, simd=("avx2", "avx512f", "avx512_bf16"))
    copied = {}
    monkeypatch.setattr(
        readme_results,
        "snapshot",
        lambda workdir, dest, run, bench, timing_only: copied.update(
            dest=dest, run=run, only=timing_only
        ),
    )
    # a regression must not rewrite this repository's README
    monkeypatch.setattr(readme_results, "write_readme", lambda: copied.update(wrote=True))
    argv = ["snapshot", "--workdir", str(work), "--wall-s", "60", "--command", "snakemake -c2"]
    argv += ["--start", "cold", "--machine", "m", "--cpu", "c", "--commit", "1234567"]
    readme_results.main([*argv, "--second-run-s", "1.5"])
    assert copied["run"] == {
        "wall_s": 60.0,
        "command": "snakemake -c2",
        "start": "cold",
        "machine": "m",
        "cpu": "c",
        "commit": "1234567",
        "second_run_s": 1.5,
    }
    assert copied["dest"] == readme_results.RESULTS_DIR / "avx512bf16-1234567"
    assert copied["only"] is False
    readme_results.main([*argv, "--timing-only"])
    assert copied["only"] is True


@pytest.mark.parametrize(
    ("simd", "device", "tag"),
    [
        (["avx2", "fma"], "cpu", "avx2"),
        (["avx2", "avx512f"], "cpu", "avx512"),
        (["avx2", "avx512f", "avx512_bf16"], "cpu", "avx512bf16"),
        (["avx512f", "avx512_bf16", "amx_bf16"], "cpu", "amx"),
        (["avx2"], "cuda", "cuda"),
        ([], "cpu", "other"),
    ],
)
def test_isa_tag_names_the_machine_class(simd, device, tag):
    assert readme_results.isa_tag(simd, device) == tag


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


def test_headline_tables_show_a_claims_floor_mdd_and_verdict_where_the_csv_has_them():
    old = [dict(zip(HEADER, ["gain", "206.0", "3.85", "3.5", "7.0", "x", "online"], strict=True))]
    assert "verdict" not in readme_results.headline_table(old)  # snapshots before issue 41
    header = [*HEADER, "floor", "mdd", "n", "verdict"]
    rows = [
        dict(zip(header, [*old[0].values(), "", "", "", ""], strict=True)),
        dict(
            zip(
                header,
                ["accuracy vs LLM", "97.54", "96.1", "88.0", "104.2", "%", "uhlm"]
                + ["100.0", "11.96", "16", "undecided at n=16"],
                strict=True,
            )
        ),
    ]
    text = readme_results.headline_table(rows)
    assert text.splitlines()[0].endswith("| where | floor | MDD | verdict |")
    assert "| gain | 206x | 3.85x | 3.5x to 7x | online |  |  |  |" in text
    assert (
        "| accuracy vs LLM | 97.54% | 96.1% | 88.0% to 104.2% | uhlm | 100.0% | 12.0 points | "
        "undecided at n=16 |"
    ) in text
