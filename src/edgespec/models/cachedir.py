"""Folders of a model cache that several processes and working directories share.

A cache folder is built beside its final path (``<name>.tmp-XXXX``) and renamed into place, so
a folder at the final path is complete. Builders of one folder take turns under an advisory
lock file ``.<name>.lock`` beside it; the one holding the lock first removes the half-built
folders that killed runs left. Used by ``pair`` (the stored pair) and ``cast`` (its copies in
another dtype) and ``layout`` (its transposed float32 linear weights).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from edgespec.artifacts import default_dir_mode, default_file_mode

Log = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


@contextlib.contextmanager
def cache_lock(out_dir: Path, log: Log = _quiet):
    """Hold an exclusive lock on ``.<name>.lock`` beside ``out_dir`` (one builder at a time,
    across working directories and processes); the kernel drops it if the process dies."""
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    # Read-only is enough for flock, and works when another member of the group made the file.
    fd = os.open(lock_path, os.O_RDONLY | os.O_CREAT, default_file_mode())
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another process is building {out_dir}; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove_stale_builds(out_dir: Path, log: Log = _quiet) -> list[str]:
    """Remove ``<name>.tmp-*`` and ``<name>.old-*`` folders beside ``out_dir``.

    Call it with the cache lock held: a live builder would hold the lock, so these are left by
    runs that were killed (several GB each for a real pair).
    """
    removed = []
    for pattern in (f"{out_dir.name}.tmp-*", f"{out_dir.name}.old-*"):
        for stale in sorted(out_dir.parent.glob(pattern)):
            log(f"removing {stale}, left half-built by a run that was killed")
            shutil.rmtree(stale, ignore_errors=True)
            removed.append(stale.name)
    return removed


def new_build_dir(out_dir: Path) -> Path:
    """An empty ``<name>.tmp-XXXX`` folder beside ``out_dir`` with the usual mode."""
    build = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(build, default_dir_mode())  # mkdtemp makes it 0700; the cache is an ordinary dir
    return build


def give_usual_modes(folder: Path) -> None:
    """Files and folders as ``open``/``mkdir`` would make them (umask applied): safetensors
    writes its files 0600 and ``mkdtemp`` makes 0700, which would keep a shared cache from the
    rest of the group."""
    file_mode, dir_mode = default_file_mode(), default_dir_mode()
    os.chmod(folder, dir_mode)
    for path in folder.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, dir_mode if path.is_dir() else file_mode)


def move_into_place(build: Path, out_dir: Path) -> None:
    """Rename the complete ``build`` to ``out_dir``; an ``out_dir`` already there is moved
    aside first and removed only after the new one is in place."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, old / out_dir.name)
    os.rename(build, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def copy_is_current(out_dir: Path, record_name: str, digest: str, files: Iterable[str]) -> bool:
    """Whether the derived copy in ``out_dir`` is complete and made from the current source:
    its JSON record ``record_name`` names the source's provenance sha256 ``digest`` and every one
    of ``files`` (relative to ``out_dir``) exists."""
    try:
        record = json.loads((out_dir / record_name).read_text())
    except (OSError, ValueError):
        return False
    return record.get("source_provenance_sha256") == digest and all(
        (out_dir / name).is_file() for name in files
    )


def build_once(
    out_dir: Path,
    is_current: Callable[[], bool],
    write: Callable[[Path], None],
    announce: str,
    log: Log = _quiet,
) -> None:
    """Build the cache folder ``out_dir`` with ``write(build_dir)`` unless ``is_current()``.

    Under the cache lock (``is_current`` asked again once it is held: the process waited for may
    have built it), half-built folders removed first; built beside ``out_dir``, logged with
    ``announce``, renamed into place (the build removed if ``write`` fails), then flushed to disk:
    the copies are several GB, whose writeback should not fall under a rule that runs next and
    times the models. An ``OSError`` (a read-only folder) reaches the caller."""
    if is_current():
        return
    with cache_lock(out_dir, log):
        if is_current():
            return
        remove_stale_builds(out_dir, log)
        log(announce)
        build = new_build_dir(out_dir)
        try:
            write(build)
            move_into_place(build, out_dir)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
        os.sync()
