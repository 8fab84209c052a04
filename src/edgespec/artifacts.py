"""Atomic artifact writes and the logging set-up shared by the workflow scripts.

An artifact appears under its final name only once it is complete (write to a temporary file
in the same directory, then ``os.replace``), so a stage killed midway never leaves a truncated
file that a rerun would mistake for a result.
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
    """Send stderr (warnings, tracebacks, progress bars) and ``logging`` to the rule's log."""
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        sys.stderr = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the job
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
