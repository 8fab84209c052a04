"""Copies of a cached pair in the dtype a run decodes in, made once and then loaded directly.

The pair is stored once, in the precision it was converted to (``pair``: float32 for the
default GGUF pair), so that a change of ``models.dtype`` never fetches again. Casting it on
every load costs each model job a pass over the float32 weights (8.2 GB for the default pair,
about 3 s) and a peak resident size of about 12 GB. Rule select_dtype, which picks the dtype,
writes the cast pair beside the cache (or, outside the workflow, the first load that asks for
another dtype does), ``<cache>.as-<dtype>/{draft,target}`` (4.6 GB in
bfloat16 for the default pair), and every later job memory-maps that copy.

A copy records which stored pair it came from (the sha256 of its ``provenance.json``); a
refetched or replaced pair makes the copy stale and the next load writes it again. Copies are
built like the pair itself (``edgespec.models.cachedir``): in a temporary folder, renamed into
place, under a lock, so concurrent jobs and working directories share one copy. Where the
cache's folder is not writable (a read-only shared cache) loads cast as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from edgespec.models.cachedir import build_once, copy_is_current, give_usual_modes
from edgespec.models.presets import PROVENANCE_FILE

CAST_FILE = "cast.json"
ROLES = ("draft", "target")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")

log = logging.getLogger("edgespec")


def cast_dir_of(model_dir: Path, dtype_name: str) -> Path:
    """Where the copy of ``model_dir`` in ``dtype_name`` lives: a sibling folder."""
    model_dir = Path(model_dir)
    return model_dir.parent / f"{model_dir.name}.as-{dtype_name}"


def _source_digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / PROVENANCE_FILE).read_bytes()).hexdigest()


def _write_cast(model_dir: Path, build: Path, dtype_name: str, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype_name)
    for role in ROLES:
        source, dest = model_dir / role, build / role
        # tokenizer, chat template and generation config as they are; the weights are rewritten
        shutil.copytree(
            source,
            dest,
            ignore=lambda _dir, names: [
                n for n in names if n.endswith(_WEIGHT_SUFFIXES) or n in _WEIGHT_INDEXES
            ],
        )
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
        model.save_pretrained(dest)
        del model
    record = {
        "source": str(model_dir.resolve()),
        "source_provenance_sha256": digest,
        "dtype": dtype_name,
    }
    (build / CAST_FILE).write_text(json.dumps(record, indent=2) + "\n")
    give_usual_modes(build)


def ensure_cast(model_dir: Path, dtype_name: str) -> Path:
    """The folder to load ``model_dir``'s pair from in ``dtype_name`` (a torch dtype's name, as
    ``load.canonical_dtype_name`` gives it): its current cast copy, written now if missing or
    stale; ``model_dir`` itself if no copy can be written there."""
    model_dir = Path(model_dir)
    cast_dir = cast_dir_of(model_dir, dtype_name)
    digest = _source_digest(model_dir)
    try:
        build_once(
            cast_dir,
            lambda: copy_is_current(
                cast_dir, CAST_FILE, digest, (f"{role}/config.json" for role in ROLES)
            ),
            lambda build: _write_cast(model_dir, build, dtype_name, digest),
            f"writing a {dtype_name} copy of {model_dir} to {cast_dir} (once: later loads skip "
            "the cast)",
            log.info,
        )
    except OSError as exc:
        log.warning(
            "could not write a %s copy of %s beside it (%s); casting as it loads",
            dtype_name,
            model_dir,
            exc,
        )
        return model_dir
    return cast_dir
