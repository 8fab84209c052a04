"""Atomic artifact writes and the logging set-up shared by the workflow scripts.

An artifact appears under its final name only once it is complete (write to a temporary file
in the same directory, then ``os.replace``), so a stage killed midway never leaves a truncated
file that a rerun would mistake for a result. The temporary file gets the mode an ordinary
``open()`` would give (0666 less the umask) before it is renamed: ``mkstemp`` creates it 0600,
which would make results on a shared project folder unreadable to the rest of the group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it and restore it
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """Mode of a file created by ``open()``: 0666 less the umask (``mkstemp`` gives 0600)."""
    return 0o666 & ~current_umask()


def default_dir_mode() -> int:
    """Mode of a folder created by ``mkdir``: 0777 less the umask (``mkdtemp`` gives 0700)."""
    return 0o777 & ~current_umask()


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None):
    """Yield a temporary path beside ``path``; move it onto ``path`` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=suffix or path.suffix, dir=path.parent
    )
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, default_file_mode())  # after writing: some writers replace the file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(obj, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def read_json(path: str | Path):
    return json.loads(Path(path).read_text())


def write_parquet(frame: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def write_csv(frame: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def write_npz(path: str | Path, **arrays) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)


def setup_logging(log_path: str | Path | None) -> None:
    """Send stderr (warnings, tracebacks, progress bars) and ``logging`` to the rule's log.

    An uncaught error is written to the log in full and, as its last line, also to the job's
    own stderr: Snakemake shows that next to "Error in rule ...", so a bad file or a tokenizer
    mismatch reads on the terminal even without a profile's ``show-failed-logs``.
    """
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        sys.stderr = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the job
        sys.excepthook = _log_and_echo_error
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def _log_and_echo_error(kind, error, trace) -> None:
    import traceback

    traceback.print_exception(kind, error, trace, file=sys.stderr)  # the full trace: the log
    sys.stderr.flush()
    # "module.ErrorType: message", the last line of the trace, Python's own format
    print(traceback.format_exception_only(kind, error)[-1].strip(), file=sys.__stderr__, flush=True)
