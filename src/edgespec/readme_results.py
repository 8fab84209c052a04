"""The README's measured results, generated from a run's report files, never copied by hand.

A measured run is kept as a snapshot in ``docs/results/`` (the report files a reader needs to
check the README against, a few kB): the CU-HLM and WISV headline tables the report stages
write, the run's precision record and latency profile, the per-rule times from the
``benchmark:`` files, the engine benchmark's output and a ``run.json`` with the command, the
machine and the wall time. :func:`render` turns a snapshot into the README block between
``<!-- results:start -->`` and ``<!-- results:end -->``; ``tests/test_docs.py`` checks that the
README holds exactly that block.

    python -m edgespec.readme_results snapshot --workdir . --wall-s 1234 --command "..."
    python -m edgespec.readme_results write     # README block from docs/results/

The same workflow timed on another machine (say a CPU without native bf16) is kept beside it
as a timing-only snapshot, ``docs/results/other_machines/<name>/`` (``snapshot --timing-only
--dest ...``: the run, the dtype it chose and its per-rule times), and rendered as one line
after the main run's times and latency profile, oldest first (its wall time, its jobs' seconds
and longest rules, a link to its per-rule table); the science figures stay those of the main
run. ``run.json`` records when the snapshot was taken (``recorded``, UTC).

Torch-free.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from edgespec.report import format_figure

REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_DIR = REPO_ROOT / "docs" / "results"
OTHER_MACHINES = "other_machines"
README = REPO_ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"

REPORT_FILES = {
    "results/report/cuhlm_headline.csv": "cuhlm_headline.csv",
    "results/report/cuhlm_summary.md": "cuhlm_summary.md",
    "results/report/wisv_headline.csv": "wisv_headline.csv",
    "results/report/wisv_summary.md": "wisv_summary.md",
    "results/machine/precision.json": "precision.json",
    "results/latency/profile.json": "profile.json",
}
# Written only when the run has the stage (multidevice.enabled, models.quantize).
OPTIONAL_REPORT_FILES = {
    "results/report/multidevice_headline.csv": "multidevice_headline.csv",
    "results/report/multidevice_summary.md": "multidevice_summary.md",
    "results/machine/quantization.json": "quantization.json",
}


# ------------------------------------------------------------------------------- snapshot


def rule_times(benchmark_dir: Path) -> list[dict]:
    """Per rule: jobs, summed seconds and the largest peak RSS, from ``benchmark:`` files."""
    jobs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for path in sorted(Path(benchmark_dir).rglob("*.tsv")):
        rel = path.relative_to(benchmark_dir)
        rule = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        with path.open() as fh:
            for row in csv.DictReader(fh, delimiter="\t"):
                rss = row.get("max_rss", "NA")
                jobs[rule].append((float(row["s"]), float(rss) if rss not in ("NA", "") else 0.0))
    rows = [
        {
            "rule": rule,
            "jobs": len(values),
            "seconds": round(sum(s for s, _ in values), 1),
            "peak_rss_mb": round(max(r for _, r in values)),
        }
        for rule, values in jobs.items()
    ]
    return sorted(rows, key=lambda r: -r["seconds"])


def snapshot(
    workdir: Path, dest: Path, run: dict, bench: Path | None = None, timing_only: bool = False
) -> None:
    """Copy a finished run's report files from ``workdir`` into ``dest`` (the snapshot); with
    ``timing_only``, only its precision record and per-rule times."""
    dest.mkdir(parents=True, exist_ok=True)
    precision = "results/machine/precision.json"
    required = {precision: REPORT_FILES[precision]} if timing_only else REPORT_FILES
    for source, name in required.items():
        path = Path(workdir) / source
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the workflow to the end first")
        shutil.copyfile(path, dest / name)
    for source, name in ({} if timing_only else OPTIONAL_REPORT_FILES).items():
        path = Path(workdir) / source
        if path.is_file():
            shutil.copyfile(path, dest / name)
        else:
            (dest / name).unlink(missing_ok=True)
    _write_rule_times(Path(workdir), dest)
    if bench is not None and not timing_only:
        shutil.copyfile(bench, dest / "bench_engine.md")
    run = {"recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"), **run}
    (dest / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")


def _write_rule_times(workdir: Path, dest: Path) -> None:
    with (dest / "rule_times.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["rule", "jobs", "seconds", "peak_rss_mb"])
        writer.writeheader()
        writer.writerows(rule_times(workdir / "benchmarks"))


# ------------------------------------------------------------------------------- rendering


def _read_csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _fmt(value: float, unit: str) -> str:
    """A headline CSV figure (percentages already in percent); an infinite one is a limit the
    sweep did not reach (the many-devices saturation counts)."""
    return "not reached" if math.isinf(value) else format_figure(value, unit)


def _paper(text: str, unit: str) -> str:
    """The paper's number as written (sign kept), with the unit of a ratio or a percentage."""
    value = _number(text)
    if not math.isfinite(value) or unit not in ("x", "%"):
        return text
    return f"{'+' if text.strip().startswith('+') else ''}{value:g}{unit}"


def headline_table(rows: list[dict]) -> str:
    """A paper-versus-ours table from a ``<wing>_headline.csv``."""
    out = [
        "| paper number | paper | ours (median) | interval | where |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        unit = row.get("unit", "")
        lo, hi = _number(row.get("ours_lo")), _number(row.get("ours_hi"))
        interval = f"{_fmt(lo, unit)} to {_fmt(hi, unit)}" if not math.isnan(lo) else ""
        ours = _fmt(_number(row["ours"]), unit)
        out.append(
            f"| {row['metric']} | {_paper(row['paper'], unit)} | {ours} | {interval} | "
            f"{row['where']} |"
        )
    return "\n".join(out)


def _rule_time_lines(snapshot_dir: Path, wall_s: float) -> list[str]:
    """The per-rule table of a snapshot, and how its seconds relate to the wall time."""
    lines = [
        "Per rule, from the `benchmark:` files (seconds, all jobs of the rule):",
        "",
        "| rule | jobs | seconds | peak RSS (MB) |",
        "|---|---|---|---|",
    ]
    timed = 0.0
    for row in _read_csv(snapshot_dir / "rule_times.csv"):
        lines.append(f"| {row['rule']} | {row['jobs']} | {row['seconds']} | {row['peak_rss_mb']} |")
        timed += float(row["seconds"])
    if wall_s > timed:
        # The small torch-free jobs have no benchmark: file; where the model jobs ran one at a
        # time, the rest of the wall time is theirs (and Snakemake's own).
        lines.append(
            f"| everything else (small jobs without a `benchmark:` file, scheduling) | | "
            f"{wall_s - timed:.1f} | |"
        )
    else:
        lines += [
            "",
            f"The jobs ran side by side, so their seconds add up to more than the wall time "
            f"({timed:.0f} s of jobs in {wall_s:.0f} s).",
        ]
    return lines


def _other_run_line(run_dir: Path, run: dict, longest: int = 3) -> str:
    """One bullet for a timing-only snapshot (``run``: its run.json): machine, how it started,
    wall time, the jobs' seconds and its longest rules, the dtype it chose and why, and where
    its table is."""
    precision = json.loads((run_dir / "precision.json").read_text())
    rows = _read_csv(run_dir / "rule_times.csv")
    jobs_s = sum(float(row["seconds"]) for row in rows)
    top = ", ".join(f"{row['rule']} {float(row['seconds']):.0f} s" for row in rows[:longest])
    table = f"docs/results/{OTHER_MACHINES}/{run_dir.name}/rule_times.csv"
    return (
        f"- **{run['wall_s'] / 60:.1f} min** on {run['machine']}, with `{run['command']}` "
        f"started {run['start']}; {jobs_s:.0f} s of jobs (longest rules: {top}); decoding "
        f"dtype **{precision['dtype']}** ({precision['reason']}). "
        f"[`rule_times.csv`]({table})"
    )


def render(snapshot_dir: Path = SNAPSHOT_DIR) -> str:
    """The README's results block from a snapshot directory."""
    snapshot_dir = Path(snapshot_dir)
    run = json.loads((snapshot_dir / "run.json").read_text())
    precision = json.loads((snapshot_dir / "precision.json").read_text())
    profile = json.loads((snapshot_dir / "profile.json").read_text())
    parts = [
        f"Measured on {run['machine']}, with `{run['command']}` started {run['start']}; "
        f"decoding dtype **{precision['dtype']}** ({precision['reason']}). Generated from "
        "`docs/results/` by `python -m edgespec.readme_results write`; the tables under "
        "`results/report/` of that run hold every figure.",
        "",
        f"**Wall time**: {run['wall_s'] / 60:.1f} min from nothing to both reports."
        + (
            f" A second `{run['command']}` right after found nothing to do in "
            f"{run['second_run_s']:.1f} s."
            if "second_run_s" in run
            else ""
        ),
        "",
        *_rule_time_lines(snapshot_dir, run["wall_s"]),
    ]
    verify = ", ".join(
        f"{float(v) * 1e3:.0f} ms (gamma = {g})"
        for g, v in sorted(profile["target_verify_s"].items(), key=lambda kv: int(kv[0]))
    )
    parts += [
        "",
        f"**Latency profile** ({profile.get('source', 'measured')}, batch 1): draft "
        f"{profile['draft_token_s'] * 1e3:.0f} ms/token, target "
        f"{profile['target_token_s'] * 1e3:.0f} ms/token, target verification of gamma + 1 "
        f"tokens {verify}.",
    ]
    others = sorted(
        (
            (path.parent, json.loads(path.read_text()))
            for path in (snapshot_dir / OTHER_MACHINES).glob("*/run.json")
        ),
        key=lambda other: (other[1].get("recorded", ""), other[0].name),
    )
    if others:
        parts += [
            "",
            "**Other runs of the same workflow** (timing only; each run's per-rule times are in "
            "its `rule_times.csv`):",
            "",
            *(_other_run_line(run_dir, run) for run_dir, run in others),
        ]
    bench = snapshot_dir / "bench_engine.md"
    if bench.is_file():
        parts += ["", "**Engine benchmark**:", "", bench.read_text().strip()]
    quantization = snapshot_dir / "quantization.json"
    if quantization.is_file():
        q = json.loads(quantization.read_text())
        role = q.get("model", "target")
        parts += [
            "",
            f"**Quantised {role}** ({q['quantize']}): top-1 agreement "
            f"{100 * q['top1_agreement']:.1f}% and mean total variation {q['mean_tv']:.3f} "
            f"against the unquantised {role} over {q['positions']} positions.",
        ]
    reports = [
        f"[`{name}`](docs/results/{name})"
        for name in ("cuhlm_summary.md", "wisv_summary.md", "multidevice_summary.md")
        if (snapshot_dir / name).is_file()
    ]
    parts += [
        "",
        "The run's full report tables, with every interval and the calibration: "
        f"{', '.join(reports)}.",
    ]
    for wing, title in (
        ("cuhlm", "CU-HLM family** (the paper's number beside ours)"),
        ("wisv", "WISV** (the paper's number beside ours)"),
        ("multidevice", "Many devices, one edge** (no paper number: neither paper has it)"),
    ):
        path = snapshot_dir / f"{wing}_headline.csv"
        if wing == "multidevice" and not path.is_file():
            continue
        parts += ["", f"**{title}:", "", headline_table(_read_csv(path))]
    return "\n".join(parts).strip() + "\n"


def readme_block(readme_text: str) -> str:
    start = readme_text.index(START) + len(START)
    return readme_text[start : readme_text.index(END)].strip() + "\n"


def write_readme(readme: Path = README, snapshot_dir: Path = SNAPSHOT_DIR) -> None:
    text = readme.read_text()
    start = text.index(START) + len(START)
    end = text.index(END)
    readme.write_text(text[:start] + "\n" + render(snapshot_dir) + text[end:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    snap = sub.add_parser("snapshot", help="copy a finished run's report files to docs/results")
    snap.add_argument("--workdir", type=Path, default=Path("."))
    snap.add_argument("--dest", type=Path, default=SNAPSHOT_DIR)
    snap.add_argument("--wall-s", type=float, required=True, help="wall time of the run, s")
    snap.add_argument("--command", required=True, help="the command that ran the workflow")
    snap.add_argument("--start", required=True, help="how the run started (cold, warm, ...)")
    snap.add_argument("--machine", required=True, help="the machine, in words")
    snap.add_argument("--bench", type=Path, help="engine benchmark output (Markdown)")
    snap.add_argument("--second-run-s", type=float, help="wall time of a second, no-op run, s")
    snap.add_argument(
        "--timing-only",
        action="store_true",
        help=f"keep only the dtype and per-rule times (a run on another machine, under "
        f"docs/results/{OTHER_MACHINES}/<name>)",
    )
    sub.add_parser("write", help="write the README block from docs/results")
    args = ap.parse_args(argv)
    if args.action == "snapshot":
        run = {
            "wall_s": args.wall_s,
            "command": args.command,
            "start": args.start,
            "machine": args.machine,
        }
        if args.second_run_s is not None:
            run["second_run_s"] = args.second_run_s
        snapshot(args.workdir, args.dest, run, args.bench, args.timing_only)
    else:
        write_readme()


if __name__ == "__main__":
    main()
