"""Two runs' tables compared, for a refactoring that must leave every result unchanged.

    python -m edgespec.runcompare RUN_A RUN_B [--ignore-key KEY ...]

Walks ``results/`` of both working directories and compares every table a run writes:
parquet as data frames (values and dtypes, exactly), CSV, Markdown and JSONL as text, JSON as
parsed objects, ``.npz`` and ``.safetensors`` archives array by array (with their metadata as a
mapping). Timing fields that a run measures afresh (wall seconds, load times, peak memory, the
layout probe) differ between two runs of the same code, so JSON keys that :func:`is_timing_key`
names, or that are passed in ``extra_keys``, are dropped before comparing, at any depth.
Figures (``.png``) and model checkpoints (``.pt``) are not compared byte for byte (their bytes
embed metadata), only their presence. Exit status 1 where anything differs, one line per
difference.

Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

# JSON keys whose values a run measures on the clock (two runs of the same code differ there).
TIMING_SUFFIXES = ("_s", "_seconds", "_unix", "_mb", "per_second")
TIMING_KEYS = frozenset({"linear_layout", "seconds", "recorded"})
PRESENCE_ONLY = (".png", ".pt", ".html")
# The testbed (methods §11) measures every latency on the clock: its tables are compared
# without their clock columns (``*_s`` and the frames' arrival, release and send times), so
# tokens, bytes, packets and losses must still agree; its report tables, every figure of which
# is a measured time or a ratio of one, only by their presence.
MEASURED_TABLES = ("testbed/",)
MEASURED_REPORTS = ("report/testbed_",)
CLOCK_COLUMNS = frozenset({"arrival", "release", "sent"})


def is_timing_key(key: str) -> bool:
    """True for a JSON key whose value is a clock or memory reading rather than a result:
    ``load_s``, ``decode_seconds``, ``created_unix``, ``peak_rss_mb``, ``tokens_per_second``,
    and the timed linear-layout probe of ``precision.json``."""
    return key in TIMING_KEYS or key.endswith(TIMING_SUFFIXES)


def _drop_keys(value, extra: frozenset[str]):
    if isinstance(value, dict):
        return {
            k: _drop_keys(v, extra)
            for k, v in value.items()
            if not (is_timing_key(k) or k in extra)
        }
    if isinstance(value, list):
        return [_drop_keys(v, extra) for v in value]
    return value


def _arrays(path: Path) -> tuple[dict, dict]:
    """The arrays of an ``.npz`` or ``.safetensors`` file, and its metadata."""
    import numpy as np

    if path.suffix == ".npz":
        with np.load(path) as archive:
            return {name: archive[name] for name in archive.files}, {}
    from safetensors import safe_open

    with safe_open(path, "np") as fh:
        return {name: fh.get_tensor(name) for name in fh.keys()}, dict(fh.metadata() or {})


def _same_file(a: Path, b: Path, extra_keys: frozenset[str], rel: str = "") -> str | None:
    """None when ``a`` and ``b`` hold the same table, else what differs (one line); ``rel``
    the path under ``results/`` (the testbed's measured tables are compared without their
    clock readings)."""
    suffix = a.suffix
    if suffix in PRESENCE_ONLY or rel.startswith(MEASURED_REPORTS):
        return None
    if suffix == ".parquet":
        import pandas as pd

        left, right = pd.read_parquet(a), pd.read_parquet(b)
        if rel.startswith(MEASURED_TABLES):
            left, right = (
                t.drop(columns=[c for c in t.columns if is_timing_key(c) or c in CLOCK_COLUMNS])
                for t in (left, right)
            )
        try:
            pd.testing.assert_frame_equal(left, right)
        except AssertionError as exc:
            return str(exc).splitlines()[0]
        return None
    if suffix == ".json":
        left = _drop_keys(json.loads(a.read_text()), extra_keys)
        right = _drop_keys(json.loads(b.read_text()), extra_keys)
        if left == right:
            return None
        keys = sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))
        return f"JSON differs at {keys}" if isinstance(left, dict) else "JSON differs"
    if suffix in (".npz", ".safetensors"):
        import numpy as np

        (x, meta_x), (y, meta_y) = _arrays(a), _arrays(b)
        if sorted(x) != sorted(y):
            return f"arrays {sorted(x)} against {sorted(y)}"
        if meta_x != meta_y:
            return "metadata differs"
        for name in sorted(x):
            if x[name].dtype != y[name].dtype or not np.array_equal(x[name], y[name]):
                return f"array {name} differs"
        return None
    return None if a.read_bytes() == b.read_bytes() else "bytes differ"


def compare_runs(run_a: Path, run_b: Path, extra_keys: Iterable[str] = ()) -> list[str]:
    """One line per difference between the ``results/`` trees of two working directories."""
    keys = frozenset(extra_keys)
    root_a, root_b = Path(run_a) / "results", Path(run_b) / "results"
    for root in (root_a, root_b):
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no results/ directory to compare")
    files_a = {p.relative_to(root_a) for p in root_a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(root_b) for p in root_b.rglob("*") if p.is_file()}
    out = [f"only in {run_a}: {p}" for p in sorted(files_a - files_b)]
    out += [f"only in {run_b}: {p}" for p in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        diff = _same_file(root_a / rel, root_b / rel, keys, rel.as_posix())
        if diff is not None:
            out.append(f"{rel}: {diff}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument(
        "--ignore-key",
        action="append",
        default=[],
        help="a further JSON key to ignore (the timing keys are always ignored)",
    )
    args = parser.parse_args(argv)
    diffs = compare_runs(args.run_a, args.run_b, args.ignore_key)
    for line in diffs:
        print(line)
    n = len(diffs)
    print(f"{n} difference{'s' if n != 1 else ''}" if n else "the same tables")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
