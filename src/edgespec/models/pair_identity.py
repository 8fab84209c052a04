"""Which pair a configuration names, and what makes two caches the same pair.

A preset name or a ``custom`` entry resolves to a :class:`PairPreset`; a config ``models``
section names the folders its pair is cached in; and the identity (preset, derived draft
layers, sources, tiny-model seed and corpus) is what ``edgespec.models.pair.fetch_pair``
compares with a cache's ``provenance.json`` before reusing it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from edgespec.models.presets import (
    DEFAULT_PRESET,
    PRESETS,
    ChunkedGGUF,
    HubModel,
    ModelPairError,
    PairPreset,
    WheelGGUF,
)


def resolve_pair_paths(config_models: dict, cache_root: Path) -> tuple[Path, Path]:
    """(draft_dir, target_dir) for a config ``models`` section.

    Keys: ``draft_path`` and ``target_path`` (explicit local dirs, used as given), else
    ``preset`` (default ``qwen25coder``) and optional ``cache_name`` (overrides the directory
    name); the pair lives in ``cache_root/<preset>/{draft,target}`` as written by
    :func:`~edgespec.models.pair.fetch_pair` (the workflow's ``<cache_dir>/<preset>``).
    ``draft_layers`` is not part of the name: a cache built with other ``draft_layers`` is
    refused by ``fetch_pair``.
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


def resolve_preset(preset: str | PairPreset, custom: dict | None) -> PairPreset:
    """The pair ``preset`` names in :data:`PRESETS`, or a pair of hub ids or local paths from
    ``custom`` (``preset`` then only names it)."""
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


def describe_sources(spec: PairPreset) -> dict:
    """Where the pair's draft and target come from, as stored in ``provenance.json``."""
    draft = None if spec.draft is None else _describe_source(spec.draft)
    # JSON round trip so that a fresh description compares equal to one read from disk
    return json.loads(json.dumps({"draft": draft, "target": _describe_source(spec.target)}))


def corpus_digest(texts: Sequence[str]) -> str:
    """sha256 (hex) of the tiny tokenizer's training texts."""
    return hashlib.sha256("\x1e".join(texts).encode()).hexdigest()


def pair_identity(spec: PairPreset, n_draft_layers, tiny: dict | None) -> dict:
    """What makes two caches the same pair (the stored dtype does not: loads cast)."""
    want = {
        "preset": spec.name,
        "draft_layers": n_draft_layers if spec.draft is None else None,
        "sources": describe_sources(spec),
    }
    if tiny is not None:
        want["tiny"] = tiny
    return want


def tiny_identity(prov: dict) -> dict | None:
    """The part of a stored ``provenance.json``'s ``tiny`` entry that :func:`pair_identity`
    compares (seed and corpus digest)."""
    tiny = prov.get("tiny")
    return None if tiny is None else {k: tiny.get(k) for k in ("seed", "corpus_sha256")}
