"""Reordered weights stored once per machine and mapped by each load (edgespec.models.reordered):
the same logits bit for bit without reordering, a store that disagrees with the weights or was
made on another machine is not used, a stale one is written again.

float32 is reordered on every oneDNN CPU, bf16 only where it is native, so most tests treat
float32 as a dtype the loads reorder (``float32_reordered``), as bf16 is on such a CPU."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import edgespec.models.cpu_linear as cpu_linear
import edgespec.models.load as load_module
import edgespec.models.reordered as reordered
from edgespec.models.cpu_linear import (
    OneDNNLinear,
    onednn_available,
    plain_parameters,
    reorder_all_weights,
    use_onednn_linear,
)
from edgespec.models.load import load_model, load_pair_from_dir, pair_source
from edgespec.models.presets import PROVENANCE_FILE
from edgespec.models.reordered import (
    STORE_RECORD,
    StoredWeights,
    StoredWeightsError,
    ensure_reordered,
    mapping_supported,
    reordered_dir_of,
    stored_weights_for,
    write_reordered,
)
from edgespec.models.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(
    not onednn_available() or mapping_supported() is not None,
    reason="PyTorch cannot reorder weights for oneDNN or map reordered ones here",
)

IDS = torch.tensor([[3, 17, 29, 5, 8], [40, 2, 11, 58, 1]])
CHECKED = "model.layers.0.self_attn.qkv_proj"  # the first weight a load takes


@pytest.fixture()
def float32_reordered(monkeypatch):
    """Loads reorder float32 weights as they do bf16 ones where bf16 is native."""
    real = cpu_linear.packing_supported

    def packs(dtype):
        return dtype is torch.float32 or real(dtype)

    monkeypatch.setattr(cpu_linear, "packing_supported", packs)
    monkeypatch.setattr(load_module, "packing_supported", packs)


@pytest.fixture()
def reorders(monkeypatch):
    """How many weights were reordered in this process since the fixture was set up."""
    calls = []
    real = cpu_linear.reorder_weight

    def counted(weight):
        calls.append(tuple(weight.shape))
        return real(weight)

    monkeypatch.setattr(cpu_linear, "reorder_weight", counted)
    return calls


def _logits(model):
    with torch.inference_mode():
        return model(IDS).logits


def _reordered_weights(model) -> list[bool]:
    return [m.weight.is_mkldnn for m in model.modules() if isinstance(m, OneDNNLinear)]


def test_a_load_maps_the_stored_weights_and_gives_the_same_logits_bit_for_bit(
    float32_cache, float32_reordered, reorders, caplog
):
    reference = load_model(float32_cache / "target", "float32", "target")
    assert all(_reordered_weights(reference)) and len(reorders) == 9  # 2 layers x 4 + head
    folder = ensure_reordered(float32_cache, "float32")
    assert folder == reordered_dir_of(float32_cache) and (folder / STORE_RECORD).is_file()
    assert {p.name for p in folder.iterdir()} == {
        STORE_RECORD,
        "draft.bin",
        "draft.json",
        "target.bin",
        "target.json",
    }
    index = json.loads((folder / "target.json").read_text())
    assert all(entry["offset"] % reordered.ALIGNMENT == 0 for entry in index["weights"].values())

    reorders.clear()
    load_model(float32_cache / "target", "float32", "target", stored=False)
    assert len(reorders) == 9  # asked not to map them

    reorders.clear()
    with caplog.at_level(logging.INFO, logger="edgespec"):
        model = load_model(float32_cache / "target", "float32", "target")
    assert reorders == [(64, 32)]  # the check of the first weight taken, alone
    assert "9 reordered linear weights mapped from" in caplog.text
    assert all(_reordered_weights(model))
    assert torch.equal(_logits(model), _logits(reference))
    stored, expected = plain_parameters(model), plain_parameters(reference)
    assert stored.keys() == expected.keys()
    for name, value in stored.items():
        assert torch.equal(value, expected[name]), name


def _reordered_tiny(hidden_size: int, stored=None):
    model = build_tiny_model(vocab_size=61, seed=4, hidden_size=hidden_size)
    use_onednn_linear(model)
    reorder_all_weights(model, stored)
    return model


def test_every_reordered_weight_comes_back_from_the_file(tmp_path, reorders):
    reference = _reordered_tiny(24)
    assert write_reordered(reference, tmp_path, "tiny") == 9
    index = json.loads((tmp_path / "tiny.json").read_text())
    assert all(e["offset"] % reordered.ALIGNMENT == 0 for e in index["weights"].values())
    reorders.clear()
    stored = StoredWeights(tmp_path / "tiny.bin", index)
    model = _reordered_tiny(24, stored)
    assert stored.untaken() == [] and len(stored.taken) == 9
    assert len(reorders) == 1  # the check of the first weight taken
    assert all(_reordered_weights(model))
    assert torch.equal(_logits(model), _logits(reference))


def test_the_mapped_weights_outlive_the_model_that_mapped_them(float32_cache, float32_reordered):
    ensure_reordered(float32_cache, "float32")
    first = load_model(float32_cache / "draft", "float32", "draft")
    logits = _logits(first)
    del first
    import gc

    gc.collect()
    again = load_model(float32_cache / "draft", "float32", "draft")
    assert torch.equal(_logits(again), logits)


def test_a_store_whose_bytes_differ_from_the_weights_is_not_used(
    float32_cache, float32_reordered, reorders, caplog
):
    reference = _logits(load_model(float32_cache / "target", "float32", "target"))
    folder = ensure_reordered(float32_cache, "float32")
    entry = json.loads((folder / "target.json").read_text())["weights"][CHECKED]
    with open(folder / "target.bin", "r+b") as fh:
        fh.seek(entry["offset"] + 8)
        fh.write(b"\x7f\x7f\x7f\x7f")
    reorders.clear()
    with caplog.at_level(logging.WARNING, logger="edgespec"):
        model = load_model(float32_cache / "target", "float32", "target")
    assert "not using its stored reordered weights" in caplog.text
    assert f"{CHECKED} differs from the layer's weight reordered here (values)" in caplog.text
    assert len(reorders) == 10  # the check, then every weight reordered again
    assert torch.equal(_logits(model), reference)


def test_another_machines_store_is_not_used(
    float32_cache, float32_reordered, reorders, monkeypatch
):
    folder = ensure_reordered(float32_cache, "float32")
    real = reordered.machine_fingerprint
    monkeypatch.setattr(
        reordered, "machine_fingerprint", lambda: {**real(), "cpu_capability": "ANOTHER"}
    )
    assert reordered_dir_of(float32_cache) != folder
    assert stored_weights_for(float32_cache / "target") is None
    reorders.clear()
    load_model(float32_cache / "target", "float32", "target")
    assert len(reorders) == 9


def test_a_store_whose_index_names_another_machine_is_not_used(float32_cache, float32_reordered):
    folder = ensure_reordered(float32_cache, "float32")
    index_path = folder / "target.json"
    index = json.loads(index_path.read_text())
    index["machine"]["cpu_capability"] = "ANOTHER"
    index_path.write_text(json.dumps(index))
    assert stored_weights_for(float32_cache / "target") is None
    assert stored_weights_for(float32_cache / "draft") is not None


def test_a_stale_store_is_written_again(float32_cache, float32_reordered, monkeypatch):
    folder = ensure_reordered(float32_cache, "float32")
    assert stored_weights_for(float32_cache / "target") is not None
    provenance = float32_cache / PROVENANCE_FILE
    provenance.write_text(provenance.read_text().rstrip() + " \n")  # a refetched pair
    assert stored_weights_for(float32_cache / "target") is None
    written = []
    real_write = reordered._write_pair
    monkeypatch.setattr(
        reordered, "_write_pair", lambda *args: (written.append(args[0]), real_write(*args))
    )
    assert ensure_reordered(float32_cache, "float32") == folder
    assert written == [float32_cache]
    assert stored_weights_for(float32_cache / "target") is not None
    assert ensure_reordered(float32_cache, "float32") == folder and len(written) == 1


def test_a_layer_of_another_shape_or_a_short_file_is_refused(float32_cache, float32_reordered):
    folder = ensure_reordered(float32_cache, "float32")
    index = json.loads((folder / "target.json").read_text())
    stored = StoredWeights(folder / "target.bin", index)
    with pytest.raises(StoredWeightsError, match=f"{CHECKED} is stored as float32 \\[64, 32\\]"):
        stored.take(CHECKED, (96, 32), torch.float32)
    assert stored.take("model.layers.9.mlp.down_proj", (32, 64), torch.float32) is None
    (folder / "short.bin").write_bytes((folder / "target.bin").read_bytes()[:4096])
    with pytest.raises(StoredWeightsError, match="shorter than its index says"):
        StoredWeights(folder / "short.bin", index)


def test_nothing_is_stored_where_loads_keep_plain_weights(float32_cache):
    """Without the fixture, float32 weights are not reordered at load, so there is nothing to
    store."""
    assert ensure_reordered(float32_cache, "float32") is None
    assert not list(float32_cache.parent.glob("*.onednn-*"))


@pytest.mark.skipif(
    not cpu_linear.packing_supported(torch.bfloat16), reason="bf16 is not native on this CPU"
)
def test_bf16_pair_maps_its_stored_weights_where_bf16_is_native(float32_cache, reorders):
    reference_draft, reference_target, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    source = pair_source(float32_cache, "bfloat16")
    assert ensure_reordered(source, "bfloat16") == reordered_dir_of(source)
    reorders.clear()
    draft, target, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert len(reorders) == 2  # one check per model
    assert all(_reordered_weights(target)) and all(_reordered_weights(draft))
    assert torch.equal(_logits(target), _logits(reference_target))
    assert torch.equal(_logits(draft), _logits(reference_draft))
