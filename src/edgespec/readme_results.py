"""Measured runs kept as data, and the README's headline generated from them, never by hand.

Each run of the workflow that is worth keeping is a snapshot folder
``docs/results/<machine>-<commit>/`` (a few kB): ``run.json`` (the command, how it started, the
machine, the commit, the wall time, when it was recorded), ``precision.json`` (the dtype the run
chose and why) and ``rule_times.csv`` (per-rule seconds and peak memory from the ``benchmark:``
files); a *full* snapshot also holds the report files a reader needs to check the README: the
CU-HLM, WISV and many-device headline tables and summaries and the latency profile.

    python -m edgespec.readme_results snapshot --wall-s 1234 --command "snakemake --cores 2" \\
        --start cold --machine "a 2-core ..."        # a full snapshot of ./results
    python -m edgespec.readme_results snapshot ... --timing-only   # timings only
    python -m edgespec.readme_results write          # README block and docs/results/README.md

``write`` renders every generated block of the docs: the README's headline block (between
``<!-- results:start -->`` and ``<!-- results:end -->``) from the most recently recorded full
snapshot; the index of every snapshot, ``docs/results/README.md`` (one row per run: date, CPU,
dtype, commit, start, wall time, link); and, from the config schema, the README's short table
of the keys people change and the full reference in ``config/README.md``.
``tests/test_docs.py`` checks that each equals what its source renders.

Torch-free.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import subprocess
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from edgespec.report import format_figure

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "docs" / "results"
INDEX = "README.md"
BENCH_LOG = "bench_engine.md"
README = REPO_ROOT / "README.md"
CONFIG_README = REPO_ROOT / "config" / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
CONFIG_BLOCK = ("<!-- config-reference:start -->", "<!-- config-reference:end -->")
KEYS_BLOCK = ("<!-- config-keys:start -->", "<!-- config-keys:end -->")
README_KEYS = (
    "models.preset",
    "models.custom",
    "models.dtype",
    "models.device",
    "models.cache_dir",
    "data.datasets",
    "decoding.max_new_tokens",
    "decoding.temperature",
    "channels.snr_db",
    "channels.fadings",
    "wisv.channels",
    "wisv.gammas",
    "cuhlm.variants",
    "cuhlm.theta_tv",
    "latency.mode",
    "evaluation.fading_seeds",
    "multidevice.enabled",
    "multidevice.device_counts",
)
"""The keys people change, in the README's short configuration table (descriptions from the
schema); the full reference is ``config/README.md``."""

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
    "results/report/multidevice_capacity.csv": "multidevice_capacity.csv",
    "results/report/multidevice_ranking.csv": "multidevice_ranking.csv",
    "results/report/multidevice_crossovers.csv": "multidevice_crossovers.csv",
    "results/report/wisv_latency_breakdown.csv": "wisv_latency_breakdown.csv",
    "results/report/testbed_summary.csv": "testbed_summary.csv",
    "results/report/testbed_summary.md": "testbed_summary.md",
}
WINGS = (
    ("cuhlm", "CU-HLM family", "cuhlm_summary.md"),
    ("wisv", "WISV", "wisv_summary.md"),
    ("multidevice", "Many devices, one edge (no paper has this experiment)", None),
)


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


def isa_tag(simd: list[str] | tuple[str, ...], device: str = "cpu") -> str:
    """The folder-name tag of a machine class, from the SIMD flags ``precision.json`` records:
    ``cuda``, ``amx``, ``avx512bf16``, ``avx512``, ``avx2`` or ``other``."""
    flags = set(simd)
    if device == "cuda":
        return "cuda"
    for tag, flag in (
        ("amx", "amx_bf16"),
        ("avx512bf16", "avx512_bf16"),
        ("avx512", "avx512f"),
        ("avx2", "avx2"),
    ):
        if flag in flags:
            return tag
    return "other"


def _git_commit(workdir: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(workdir), "rev-parse", "--short=7", "HEAD"],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise ValueError(f"{workdir} is not a git checkout: pass --commit")
    return out.stdout.strip()


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


def default_dest(workdir: Path, commit: str, results_dir: Path = RESULTS_DIR) -> Path:
    """``docs/results/<machine>-<commit>/`` for the run in ``workdir``."""
    precision = json.loads((Path(workdir) / "results/machine/precision.json").read_text())
    machine = precision.get("machine", {})
    return (
        results_dir / f"{isa_tag(machine.get('simd', []), machine.get('device', 'cpu'))}-{commit}"
    )


def _write_rule_times(workdir: Path, dest: Path) -> None:
    with (dest / "rule_times.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["rule", "jobs", "seconds", "peak_rss_mb"])
        writer.writeheader()
        writer.writerows(rule_times(workdir / "benchmarks"))


# ------------------------------------------------------------------------------- reading


def _read_csv(path: Path) -> list[dict]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _number(text: str | None) -> float:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def runs(results_dir: Path = RESULTS_DIR) -> list[tuple[Path, dict]]:
    """Every snapshot folder with its ``run.json``, oldest first (by when it was recorded)."""
    found = [
        (path.parent, json.loads(path.read_text())) for path in Path(results_dir).glob("*/run.json")
    ]
    return sorted(found, key=lambda r: (r[1].get("recorded", ""), r[0].name))


def is_full(run_dir: Path) -> bool:
    """A full snapshot holds the report files, not only timings."""
    return (run_dir / "cuhlm_headline.csv").is_file()


def latest_full(results_dir: Path = RESULTS_DIR) -> Path:
    """The most recently recorded full snapshot (the README's headline run)."""
    full = [run_dir for run_dir, _ in runs(results_dir) if is_full(run_dir)]
    if not full:
        raise FileNotFoundError(f"{results_dir} holds no full snapshot (cuhlm_headline.csv)")
    return full[-1]


# ------------------------------------------------------------------------------- rendering


def fmt_value(value: float, unit: str) -> str:
    """A headline CSV figure (percentages already in percent) by
    :func:`edgespec.report.format_figure`, and ``not reached`` for an infinite one, a limit the
    sweep did not reach (the many-devices counts)."""
    return "not reached" if math.isinf(value) else format_figure(value, unit)


def _paper(text: str, unit: str) -> str:
    """The paper's number as written (sign kept), with the unit of a ratio or a percentage."""
    value = _number(text)
    if not math.isfinite(value) or unit not in ("x", "%"):
        return text
    return f"{'+' if text.strip().startswith('+') else ''}{value:g}{unit}"


def headline_table(rows: list[dict]) -> str:
    """A paper-versus-ours table from a ``<wing>_headline.csv``; where its quality claims carry
    a verdict (``edgespec.report.HEADLINE_COLUMNS``), with their floor, minimum detectable
    difference and verdict."""
    claims = any(row.get("verdict") for row in rows)
    extra = " floor | MDD | verdict |" if claims else ""
    out = [
        "| paper number | paper | ours (median) | interval | where |" + extra,
        "|---|---|---|---|---|" + ("---|---|---|" if claims else ""),
    ]
    for row in rows:
        unit = row.get("unit", "")
        lo, hi = _number(row.get("ours_lo")), _number(row.get("ours_hi"))
        interval = "" if math.isnan(lo) else f"{fmt_value(lo, unit)} to {fmt_value(hi, unit)}"
        ours = fmt_value(_number(row["ours"]), unit)
        line = (
            f"| {row['metric']} | {_paper(row['paper'], unit)} | {ours} | {interval} | "
            f"{row['where']} |"
        )
        if claims:
            floor, mdd = _number(row.get("floor")), _number(row.get("mdd"))
            line += (
                f" {'' if math.isnan(floor) else fmt_value(floor, unit)} |"
                f" {'' if math.isnan(mdd) else f'{mdd:.1f} points'} | {row.get('verdict') or ''} |"
            )
        out.append(line)
    return "\n".join(out)


def testbed_line(rows: list[dict], run_name: str) -> str:
    """One line on the testbed against the simulator (``testbed_summary.csv``): how many method
    and channel cells carried exactly the model's bytes plus the header overhead and committed
    the single-process decode's tokens, and the range of the measured/modelled latency ratio."""
    cells = len(rows)
    same_bytes = sum(row.get("bytes_equal") == "True" for row in rows)
    same_tokens = sum(row.get("tokens_equal") == "True" for row in rows)
    ratios = sorted(_number(row.get("ratio")) for row in rows)
    ratios = [r for r in ratios if not math.isnan(r)]
    span = f"{ratios[0]:.2f} to {ratios[-1]:.2f}" if ratios else "n/a"
    return (
        f"**Testbed against simulator** ([table](docs/results/{run_name}/testbed_summary.md)): "
        f"device and edge as two processes over loopback TCP and an emulated link; in "
        f"{same_bytes} of {cells} method-channel cells the bytes on the wire equal the model's "
        f"plus the stated header overhead, in {same_tokens} the tokens equal the single-process "
        f"decode's; measured/modelled latency {span} (medians per cell; reasons per cell in "
        "the table)."
    )


def _jobs_seconds(run_dir: Path) -> float:
    return sum(float(row["seconds"]) for row in _read_csv(run_dir / "rule_times.csv"))


def _start_word(run: dict) -> str:
    return run.get("start", "").split(" ", 1)[0].rstrip(",;") or "-"


def render(results_dir: Path = RESULTS_DIR) -> str:
    """The README's headline block: the latest full run, its paper-versus-ours tables."""
    run_dir = latest_full(results_dir)
    run = json.loads((run_dir / "run.json").read_text())
    precision = json.loads((run_dir / "precision.json").read_text())
    rel = f"docs/results/{run_dir.name}/"
    parts = [
        f"From the latest full run, [`{rel}`]({rel}): `{run['command']}` started "
        f"{_start_word(run)} on {run.get('cpu', run['machine'])} ({run['recorded'][:10]}, commit "
        f"{run.get('commit', '?')}, dtype {precision['dtype']}), "
        f"{run['wall_s'] / 60:.1f} min. Medians with 90% intervals over fading seeds (delays) "
        "or 95% bootstrap intervals over prompts (accuracy); every run, with its per-rule "
        f"times: [`docs/results/`](docs/results/{INDEX}).",
    ]
    for wing, title, summary in WINGS:
        path = run_dir / f"{wing}_headline.csv"
        if not path.is_file():
            continue
        link = f" ([all figures](docs/results/{run_dir.name}/{summary}))" if summary else ""
        parts += ["", f"**{title}**{link}:", "", headline_table(_read_csv(path))]
    testbed = run_dir / "testbed_summary.csv"
    if testbed.is_file():
        parts += ["", testbed_line(_read_csv(testbed), run_dir.name)]
    quantization = run_dir / "quantization.json"
    if quantization.is_file():
        q = json.loads(quantization.read_text())
        role = q.get("model", "target")
        parts += [
            "",
            f"Quantised {role} ({q['quantize']}): top-1 agreement "
            f"{100 * q['top1_agreement']:.1f}% and mean total variation {q['mean_tv']:.3f} "
            f"against the unquantised {role} over {q['positions']} positions.",
        ]
    return "\n".join(parts).strip() + "\n"


def render_index(results_dir: Path = RESULTS_DIR) -> str:
    """``docs/results/README.md``: one row per snapshot, newest first, and each run's notes."""
    found = list(reversed(runs(results_dir)))
    lines = [
        "# Measured runs",
        "",
        "One folder per run of the workflow, `<machine>-<commit>/`: `run.json` (command, start, "
        "machine, wall time), `precision.json` (the dtype chosen and why), `rule_times.csv` "
        "(per-rule seconds and peak memory); a full snapshot also holds the run's report "
        "tables. Generated by `python -m edgespec.readme_results write`; the README's headline "
        "comes from the newest full snapshot. The engine benchmark's outputs, one section per "
        f"run, are in [`{BENCH_LOG}`]({BENCH_LOG}).",
        "",
        "| recorded | CPU | dtype | commit | start | wall time | jobs' seconds | snapshot |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run_dir, run in found:
        precision = json.loads((run_dir / "precision.json").read_text())
        kind = "full" if is_full(run_dir) else "timings"
        lines.append(
            f"| {run.get('recorded', '?')[:10]} | {run.get('cpu', run['machine'])} | "
            f"{precision['dtype']} | {run.get('commit', '?')} | {_start_word(run)} | "
            f"{run['wall_s'] / 60:.1f} min | {_jobs_seconds(run_dir):.0f} | "
            f"[{run_dir.name}]({run_dir.name}/) ({kind}) |"
        )
    lines += ["", "## Notes per run", ""]
    for run_dir, run in found:
        second = (
            f" A second run right after: {run['second_run_s']:.1f} s."
            if "second_run_s" in run
            else ""
        )
        lines.append(
            f"- **{run_dir.name}**: {run['machine']}; `{run['command']}` started "
            f"{run['start']}.{second}"
        )
    return "\n".join(lines) + "\n"


def block(text: str, start: str = START, end: str = END) -> str:
    """What stands between the ``start`` and ``end`` markers of a generated block."""
    if start not in text or end not in text:
        raise ValueError(f"no generated block {start} ... {end}")
    begin = text.index(start) + len(start)
    return text[begin : text.index(end)].strip() + "\n"


def replace_block(text: str, body: str, start: str = START, end: str = END) -> str:
    """``text`` with the block between ``start`` and ``end`` replaced by ``body``."""
    block(text, start, end)  # both markers present
    begin = text.index(start) + len(start)
    return text[:begin] + "\n" + body.strip() + "\n" + text[text.index(end) :]


def readme_block(readme_text: str) -> str:
    return block(readme_text)


def config_tables() -> tuple[str, str]:
    """The README's short table of the keys people change and the full reference."""
    from edgespec.config import schema_reference_markdown

    return schema_reference_markdown(keys=README_KEYS), schema_reference_markdown()


def write_readme(readme: Path = README, results_dir: Path = RESULTS_DIR) -> None:
    readme.write_text(replace_block(readme.read_text(), render(results_dir)))


def write_index(results_dir: Path = RESULTS_DIR) -> None:
    (Path(results_dir) / INDEX).write_text(render_index(results_dir))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="action", required=True)
    snap = sub.add_parser("snapshot", help="copy a finished run's report files to docs/results")
    snap.add_argument("--workdir", type=Path, default=Path("."))
    snap.add_argument("--dest", type=Path, help="default: docs/results/<machine>-<commit>/")
    snap.add_argument("--commit", help="the commit the run ran (default: the workdir's HEAD)")
    snap.add_argument("--wall-s", type=float, required=True, help="wall time of the run, s")
    snap.add_argument("--command", required=True, help="the command that ran the workflow")
    snap.add_argument("--start", required=True, help="how the run started (cold, warm, ...)")
    snap.add_argument("--machine", required=True, help="the machine, in words")
    snap.add_argument("--cpu", required=True, help="the CPU in a few words, for the index")
    snap.add_argument("--bench", type=Path, help="engine benchmark output (Markdown)")
    snap.add_argument("--second-run-s", type=float, help="wall time of a second, no-op run, s")
    snap.add_argument(
        "--timing-only", action="store_true", help="keep only the dtype and per-rule times"
    )
    sub.add_parser(
        "write",
        help="write the README's generated blocks, docs/results/README.md and the "
        "configuration reference in config/README.md",
    )
    args = ap.parse_args(argv)
    if args.action == "snapshot":
        commit = args.commit or _git_commit(args.workdir)
        run = {
            "wall_s": args.wall_s,
            "command": args.command,
            "start": args.start,
            "machine": args.machine,
            "cpu": args.cpu,
            "commit": commit,
        }
        if args.second_run_s is not None:
            run["second_run_s"] = args.second_run_s
        dest = args.dest or default_dest(args.workdir, commit)
        snapshot(args.workdir, dest, run, args.bench, args.timing_only)
    else:
        write_readme()
        write_index()
        keys, reference = config_tables()
        README.write_text(replace_block(README.read_text(), keys, *KEYS_BLOCK))
        CONFIG_README.write_text(replace_block(CONFIG_README.read_text(), reference, *CONFIG_BLOCK))


if __name__ == "__main__":
    main()
