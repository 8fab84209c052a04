"""Prefills stored once and read by decoding: the same caches, outputs and decoded tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_model

from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import prefill
from edgespec.decoding.prefill_store import PrefillStore, PrefillStoreError
from edgespec.decoding.rounds import generate_rounds
from edgespec.decoding.tokenwise import generate_tokenwise

SYSTEM_TURN = [9, 33, 4, 50, 12, 27, 8, 45, 19, 2]
PROMPTS = [
    SYSTEM_TURN + [3, 17],
    [40, 2, 11],
    SYSTEM_TURN + [40, 2, 11, 58, 7, 31, 5, 6, 1, 9],
    [7],
    SYSTEM_TURN + [8],
    [5, 1, 22, 60, 13, 4, 4],
]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory, tiny_target, tiny_draft_close):
    path = tmp_path_factory.mktemp("prefill") / "store.safetensors"
    # batch 4: the prompts are prefilled in two groups, as a shard larger than a batch is
    PrefillStore.compute({"draft": tiny_draft_close, "target": tiny_target}, PROMPTS, 0, 4, path)
    return path


def _next_logits(model, sequences):
    with torch.no_grad():
        return torch.stack([model(torch.tensor([s])).logits[0, -1] for s in sequences])


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4, 5], [5, 2, 0], [3]])
def test_store_gives_what_prefill_gives(store_path, tiny_target, order):
    store = PrefillStore.load([store_path])
    prompts = [PROMPTS[i] for i in order]
    cache, (logits, hidden) = store.cache("target", tiny_target, prompts, keep_hidden=True)
    _, (want_logits, want_hidden) = prefill(tiny_target, prompts, 0, keep_hidden=True)
    assert logits.shape == want_logits.shape and hidden.shape == want_hidden.shape
    assert torch.allclose(logits, want_logits, atol=1e-9)
    assert torch.allclose(hidden, want_hidden, atol=1e-9)
    assert cache.next_position.tolist() == [len(p) for p in prompts]
    # the rows continue as their unpadded prompts would
    step = torch.arange(1, len(prompts) + 1).unsqueeze(1)
    after, _ = cache.feed(step, torch.ones_like(step, dtype=torch.bool), 1)
    seqs = [p + [int(t)] for p, t in zip(prompts, step[:, 0], strict=True)]
    assert torch.allclose(after[:, -1], _next_logits(tiny_target, seqs), atol=1e-9)


def test_store_without_outputs_holds_all_but_the_last_token(store_path, tiny_draft_close):
    store = PrefillStore.load([store_path])
    prompts = [PROMPTS[1], PROMPTS[3], PROMPTS[2]]  # [7] leaves an empty head
    cache, outs = store.cache("draft", tiny_draft_close, prompts, with_outputs=False)
    assert outs is None
    assert cache.slot_valid.sum(1).tolist() == [len(p) - 1 for p in prompts]
    last = torch.tensor([[p[-1]] for p in prompts])
    after, _ = cache.feed(last, torch.ones_like(last, dtype=torch.bool), 1)
    assert torch.allclose(after[:, -1], _next_logits(tiny_draft_close, prompts), atol=1e-9)
    single, _ = store.cache("draft", tiny_draft_close, [PROMPTS[3]], with_outputs=False)
    assert single.cache is None and single.next_position.tolist() == [0]


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_rounds_from_the_store_decode_the_same_tokens(
    store_path, tiny_target, tiny_draft_close, gamma, request
):
    cfg = DecodingConfig(max_new_tokens=12, temperature=0.0, batch_size=4)
    want, want_stats = generate_rounds(
        PROMPTS, cfg, torch.Generator(), tiny_draft_close, tiny_target, gamma
    )
    fed = request.getfixturevalue("fed_tokens")  # counts from here on
    store = PrefillStore.load([store_path])
    got, stats = generate_rounds(
        PROMPTS, cfg, torch.Generator(), tiny_draft_close, tiny_target, gamma, prefilled=store
    )
    assert got == want and stats == want_stats
    # no forward fed a prompt: at most a round's tokens per row (pending + gamma drafts)
    assert max(fed) <= cfg.batch_size * (gamma + 2)


def test_sampled_tokenwise_from_the_store_draws_the_same_tokens(
    store_path, tiny_target, tiny_draft_close, request
):
    cfg = DecodingConfig(max_new_tokens=10, temperature=1.0, batch_size=4, keep_hidden=True)
    prompts = PROMPTS * 3  # refills: newcomers are read from the store mid-decoding
    steps = {"plain": [], "store": []}

    def recorder(name):
        return lambda step: steps[name].append(step.draft_hidden.clone())

    want = generate_tokenwise(
        prompts,
        cfg,
        torch.Generator().manual_seed(5),
        draft=tiny_draft_close,
        target=tiny_target,
        on_step=recorder("plain"),
    )
    fed = request.getfixturevalue("fed_tokens")  # counts from here on
    got = generate_tokenwise(
        prompts,
        cfg,
        torch.Generator().manual_seed(5),
        draft=tiny_draft_close,
        target=tiny_target,
        on_step=recorder("store"),
        prefilled=PrefillStore.load([store_path]),
    )
    assert got == want
    assert max(fed) <= cfg.batch_size  # one token per row and forward: nothing prefilled
    for a, b in zip(steps["plain"], steps["store"], strict=True):
        assert torch.allclose(a, b, atol=1e-9)


def test_stores_of_two_shards_serve_as_one(tmp_path, tiny_target):
    first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    PrefillStore.compute({"target": tiny_target}, PROMPTS[:3], 0, 8, first)
    PrefillStore.compute({"target": tiny_target}, PROMPTS[3:], 0, 8, second)
    store = PrefillStore.load([first, second])
    assert len(store) == len(PROMPTS) and store.roles == ["target"]
    assert store.covers("target", PROMPTS) and not store.covers("draft", PROMPTS)
    _, (logits, _) = store.cache("target", tiny_target, [PROMPTS[4], PROMPTS[0]])
    assert torch.allclose(logits[:, -1], _next_logits(tiny_target, [PROMPTS[4], PROMPTS[0]]))


def test_store_errors_name_the_problem(store_path, tmp_path, tiny_target):
    store = PrefillStore.load([store_path])
    with pytest.raises(PrefillStoreError, match="prompt 1 .* no target prefill"):
        store.cache("target", tiny_target, [PROMPTS[0], [1, 2, 3]])
    other_dtype = build_tiny_model(vocab_size=61, seed=0, dtype=torch.float32)
    with pytest.raises(PrefillStoreError, match="computed in float64 .* decodes in float32"):
        store.cache("target", other_dtype, PROMPTS[:1])
    deeper = build_tiny_model(vocab_size=61, seed=0, dtype=torch.float64, num_layers=3)
    with pytest.raises(PrefillStoreError, match="layers"):
        store.cache("target", deeper, PROMPTS[:1])
    only_target = tmp_path / "target.safetensors"
    PrefillStore.compute({"target": tiny_target}, PROMPTS[:1], 0, 8, only_target)
    with pytest.raises(PrefillStoreError, match="no draft prefills"):
        PrefillStore.load([only_target]).cache("draft", tiny_target, PROMPTS[:1])
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a store")
    with pytest.raises(PrefillStoreError, match="cannot read the prefill store .*junk"):
        PrefillStore.load([junk])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        PrefillStore.compute({"target": tiny_target}, [[1], []], 0, 8, tmp_path / "x")
