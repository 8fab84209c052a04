"""The cast copy of a cached pair: written once per dtype, loaded directly after that, rebuilt
when the stored pair changes, skipped where it cannot be written."""

from __future__ import annotations

import json

import pytest
import torch

import edgespec.models.cachedir as cachedir_module
import edgespec.models.cast as cast_module
from edgespec.models.cast import CAST_FILE, cast_dir_of
from edgespec.models.cpu_linear import plain_parameters
from edgespec.models.load import load_pair_from_dir, pair_source
from edgespec.models.presets import ModelPairError


def _forbid_writes(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a current cast copy must not be written again")

    monkeypatch.setattr(cast_module, "_write_cast", boom)


def _loaded_from(model) -> str:
    return str(model.config._name_or_path)


def test_first_load_writes_the_copy_and_later_loads_read_it(float32_cache, monkeypatch):
    copy = cast_dir_of(float32_cache, "bfloat16")
    assert not copy.exists()
    draft, target, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert (copy / CAST_FILE).is_file()
    assert {p.name for p in copy.iterdir()} >= {"draft", "target", CAST_FILE}
    assert (copy / "target" / "tokenizer_config.json").is_file()
    # no half-built folder left beside it
    assert not list(float32_cache.parent.glob("*.tmp-*"))

    _forbid_writes(monkeypatch)
    again_draft, again_target, tok = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert _loaded_from(again_target).startswith(str(copy))
    assert again_draft.dtype == again_target.dtype == torch.bfloat16
    reference, _, _ = load_pair_from_dir(float32_cache, {"dtype": "float32"})
    stored = plain_parameters(reference)
    for name, param in plain_parameters(again_draft).items():  # a cast of the stored weights
        assert torch.equal(param, stored[name].to(torch.bfloat16)), name
    # the stored dtype itself needs no copy
    assert _loaded_from(reference).startswith(str(float32_cache / "draft"))
    assert not cast_dir_of(float32_cache, "float32").exists()
    ids = tok("def add", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        assert torch.equal(again_target(ids).logits, target(ids).logits)


def test_a_replaced_pair_makes_its_copy_stale(float32_cache):
    load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    copy = cast_dir_of(float32_cache, "bfloat16")
    before = json.loads((copy / CAST_FILE).read_text())["source_provenance_sha256"]
    provenance = float32_cache / "provenance.json"
    record = json.loads(provenance.read_text())
    record["created_unix"] = 0.0  # what a refetch changes
    provenance.write_text(json.dumps(record))
    load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    after = json.loads((copy / CAST_FILE).read_text())["source_provenance_sha256"]
    assert after != before
    assert not list(float32_cache.parent.glob("*.old-*"))


def test_an_unwritable_cache_folder_casts_as_it_loads(float32_cache, monkeypatch):
    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(cachedir_module, "new_build_dir", read_only)
    draft, target, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert draft.dtype == target.dtype == torch.bfloat16
    assert _loaded_from(target).startswith(str(float32_cache / "target"))
    assert not (cast_dir_of(float32_cache, "bfloat16") / CAST_FILE).exists()


def test_a_killed_copy_is_cleaned_up_and_written_again(float32_cache, monkeypatch):
    copy = cast_dir_of(float32_cache, "bfloat16")
    half = copy.parent / f"{copy.name}.tmp-k1ll3d"
    (half / "draft").mkdir(parents=True)
    real_write = cast_module._write_cast

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr(cast_module, "_write_cast", killed)
    with pytest.raises(KeyboardInterrupt):
        load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert not copy.exists()
    assert not half.exists()  # removed by the builder that took the lock
    monkeypatch.setattr(cast_module, "_write_cast", real_write)
    load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert (copy / CAST_FILE).is_file()


def test_pair_source_writes_the_copy_before_any_load(float32_cache, monkeypatch):
    """Rule select_dtype writes the copy with pair_source, so the loads after it only read."""
    assert pair_source(float32_cache, "float32") == float32_cache  # the stored dtype: no copy
    assert not cast_dir_of(float32_cache, "float32").exists()
    copy = pair_source(float32_cache, "bfloat16")
    assert copy == cast_dir_of(float32_cache, "bfloat16") and (copy / CAST_FILE).is_file()
    _forbid_writes(monkeypatch)
    draft, _, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert _loaded_from(draft).startswith(str(copy))


def test_a_cache_without_its_provenance_record_names_it(float32_cache):
    """select_dtype (pair_source) and every model job (load_pair_from_dir) get the same clear
    error where the cache was removed or moved after fetch_models."""
    (float32_cache / "provenance.json").unlink()
    for call in (
        lambda: pair_source(float32_cache, "bfloat16"),
        lambda: load_pair_from_dir(float32_cache, {"dtype": "float32"}),
    ):
        with pytest.raises(
            ModelPairError, match="provenance.json is missing.*forcerun fetch_models"
        ):
            call()
    assert not cast_dir_of(float32_cache, "bfloat16").exists()


def test_a_quantised_draft_loads_float32_beside_a_cast_target(float32_cache):
    """models.quantize int8_dynamic_draft: the draft's weights come float32 from the cache (to
    be quantised), the target's from the cast copy in the run's dtype."""
    draft, target, _ = load_pair_from_dir(
        float32_cache, {"dtype": "bfloat16", "quantize": "int8_dynamic_draft"}
    )
    assert draft.dtype == torch.float32 and target.dtype == torch.bfloat16
    assert _loaded_from(draft).startswith(str(float32_cache / "draft"))
    assert _loaded_from(target).startswith(str(cast_dir_of(float32_cache, "bfloat16")))
