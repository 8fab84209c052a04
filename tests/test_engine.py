"""The engine against the target alone: exact for greedy, distribution-exact for sampling."""

from __future__ import annotations

import pytest
import torch
from distribution_checks import tv_noise_floor

from edgespec.decoding.cache import RaggedCachedModel, left_pad
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import _shared_prefix_groups, prefill
from edgespec.decoding.rounds import generate_rounds
from edgespec.decoding.tokenwise import TokenPolicy, generate_tokenwise

MAX_NEW = 16


def _prompts(seed: int, lengths=(5, 9, 3, 12, 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (n,), generator=g).tolist() for n in lengths]


def _target_greedy(target, prompts, max_new=MAX_NEW):
    """Reference: Hugging Face generate, one prompt at a time, no speculation."""
    out = []
    for p in prompts:
        ids = target.generate(
            torch.tensor([p]), max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False
        )
        out.append(ids[0, len(p) :].tolist())
    return out


@pytest.fixture(scope="module")
def reference(tiny_target):
    prompts = _prompts(0)
    return prompts, _target_greedy(tiny_target, prompts)


@pytest.mark.parametrize(
    "draft_name", ["tiny_target", "tiny_draft_close", "tiny_draft_independent", "tiny_draft_int8"]
)
@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_rounds_equal_target_greedy(
    request, reference, tiny_target, draft_name, gamma, batch_size
):
    draft = request.getfixturevalue(draft_name)
    prompts, expected = reference
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=batch_size)
    got, stats = generate_rounds(
        prompts, cfg, torch.Generator().manual_seed(1), draft, tiny_target, gamma
    )
    assert got == expected
    assert sum(s.num_committed for s in stats) == sum(len(e) for e in expected)
    if draft_name == "tiny_target":
        assert all(s.num_accepted == gamma for s in stats if s.num_committed == gamma + 1)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_greedy_tokenwise_hybrid_equals_target_greedy(
    reference, tiny_target, tiny_draft_close, batch_size
):
    prompts, expected = reference
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=batch_size)
    got = generate_tokenwise(
        prompts, cfg, torch.Generator(), draft=tiny_draft_close, target=tiny_target
    )
    assert got == expected


def test_acceptance_varies_with_draft_quality(
    reference, tiny_target, tiny_draft_close, tiny_draft_independent
):
    prompts, _ = reference
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=5)

    def rate(draft):
        _, stats = generate_rounds(prompts, cfg, torch.Generator(), draft, tiny_target, 4)
        return sum(s.num_accepted for s in stats) / sum(s.num_drafted for s in stats)

    assert rate(tiny_target) == 1.0
    assert rate(tiny_draft_independent) < rate(tiny_draft_close) < 1.0


def test_eos_stops_row_and_budget_respected(tiny_target, tiny_draft_close):
    prompts = _prompts(3)
    free = _target_greedy(tiny_target, prompts)
    eos = free[0][5]  # a token the first row emits at step 5
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=5, eos_token_ids=[eos])
    got, _ = generate_rounds(prompts, cfg, torch.Generator(), tiny_draft_close, tiny_target, 4)
    for row, ref in zip(got, free, strict=True):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert row == ref[:cut]
    assert got[0][-1] == eos and len(got[0]) <= 6


class _SkipAll(TokenPolicy):
    def decide(self, draft_logits, draft_probs, draft_tokens, uncertainty, generator):
        batch, vocab = draft_probs.shape
        return torch.ones(batch, dtype=torch.bool), torch.zeros(batch, dtype=torch.long)


def test_skip_all_policy_reproduces_draft_sampling(tiny_target, tiny_draft_close):
    """A row that keeps every draft token emits what the draft alone would sample."""
    prompts = _prompts(5)
    cfg = DecodingConfig(max_new_tokens=10, temperature=0.0, batch_size=5)
    alone = generate_tokenwise(prompts, cfg, torch.Generator(), draft=tiny_draft_close)
    hybrid = generate_tokenwise(
        prompts,
        cfg,
        torch.Generator(),
        draft=tiny_draft_close,
        target=tiny_target,
        policy=_SkipAll(),
    )
    assert hybrid == alone


def _exact_token_laws(target, prompt: list[int], steps: int) -> list[torch.Tensor]:
    """Marginal laws of new tokens 0..steps-1 under the target alone, by enumerating prefixes."""
    laws, prefixes, weights = [], [list(prompt)], torch.ones(1, dtype=torch.float64)
    vocab = target.config.vocab_size
    for _ in range(steps):
        with torch.no_grad():
            nxt = torch.softmax(target(torch.tensor(prefixes)).logits[:, -1].double(), -1)
        joint = weights.unsqueeze(1) * nxt  # [prefixes, V]
        laws.append(joint.sum(0))
        prefixes = [p + [t] for p in prefixes for t in range(vocab)]
        weights = joint.reshape(-1)
    return laws


def _assert_follows(tokens: list[int], law: torch.Tensor, label: str) -> None:
    from scipy.stats import chisquare

    n = len(tokens)
    observed = torch.bincount(torch.tensor(tokens), minlength=law.numel()).double()
    keep = law * n >= 5  # chi-square needs expected counts >= 5; pool the rest
    exp, obs = law[keep] * n, observed[keep]
    if (law[~keep] * n).sum() >= 5:
        exp = torch.cat([exp, (law[~keep] * n).sum(0, keepdim=True)])
        obs = torch.cat([obs, observed[~keep].sum(0, keepdim=True)])
    p = chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue
    assert p > 1e-3, f"{label}: chi-square p = {p:.2e}"
    tv = 0.5 * float((observed / n - law).abs().sum())
    assert tv < 2.0 * tv_noise_floor(law, n), f"{label}: TV {tv:.3f}"


RAGGED = ([3, 17, 29], [40, 2, 11, 58, 7, 31])
SYSTEM_TURN = [9, 33, 4, 50, 12, 27, 8, 45, 19, 2]  # a prefix every prompt of a dataset shares
SHARED = (SYSTEM_TURN + [3, 17], SYSTEM_TURN + [40, 2, 11, 58])


@pytest.mark.parametrize("gamma", [1, 3])
def test_sampled_rounds_match_target_distribution_in_a_ragged_batch(
    tiny_target, tiny_draft_independent, gamma
):
    """Tokens 0-2 of two prompts of different lengths decoded in one batch follow the target's
    own law (exact marginals by enumeration; chi-square and a TV limit scaled with n)."""
    n = 2500
    cfg = DecodingConfig(max_new_tokens=3, temperature=1.0, batch_size=2 * n)
    gen = torch.Generator().manual_seed(11)
    prompts = [RAGGED[0], RAGGED[1]] * n  # interleaved: every batch is ragged
    out, _ = generate_rounds(prompts, cfg, gen, tiny_draft_independent, tiny_target, gamma)
    for which, prompt in enumerate(RAGGED):
        laws = _exact_token_laws(tiny_target, prompt, 3)
        rows = out[which::2]
        for step, law in enumerate(laws):
            _assert_follows([r[step] for r in rows], law, f"prompt {which} token {step}")


@pytest.mark.parametrize("pair", [RAGGED, SHARED], ids=["ragged", "shared_prefix"])
def test_sampled_tokenwise_hybrid_matches_target_distribution(tiny_target, tiny_draft_close, pair):
    """Per-token rounds with full uploads (standard HLM) are lossless too, in a ragged batch,
    and when the prompts' common beginning is prefilled once for all rows."""
    n = 2500
    cfg = DecodingConfig(max_new_tokens=2, temperature=1.0, batch_size=2 * n)
    gen = torch.Generator().manual_seed(12)
    out = generate_tokenwise(
        [pair[0], pair[1]] * n, cfg, gen, draft=tiny_draft_close, target=tiny_target
    )
    for which, prompt in enumerate(pair):
        laws = _exact_token_laws(tiny_target, prompt, 2)
        for step, law in enumerate(laws):
            _assert_follows([r[step] for r in out[which::2]], law, f"prompt {which} token {step}")


# --- the ragged cache: compaction, joining rows, continuous batching ---------------------------


def _next_logits(model, sequences):
    """Reference: one unpadded forward per sequence, the logits after its last token."""
    with torch.no_grad():
        return torch.stack([model(torch.tensor([s])).logits[0, -1] for s in sequences])


def test_compaction_keeps_what_attention_sees(tiny_target):
    seqs = [[5, 9, 2, 7], [11, 3]]
    m = RaggedCachedModel(tiny_target)
    ids, valid = left_pad(seqs, 0, "cpu")
    m.feed(ids, valid, 1)
    # Feed 20 rejected drafts per row, then hide them: the cache holds mostly hidden slots.
    junk = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(0))
    m.feed(junk, torch.ones_like(junk, dtype=torch.bool), 1)
    m.invalidate_last(torch.tensor([20, 20]), 20)
    assert m.compact() and m.num_slots == 4 and m.compactions == 1
    assert m.slot_valid.tolist() == [[True] * 4, [False, False, True, True]]
    logits, _ = m.feed(torch.tensor([[1], [4]]), torch.ones((2, 1), dtype=torch.bool), 1)
    expected = _next_logits(tiny_target, [s + [t] for s, t in zip(seqs, (1, 4), strict=True)])
    assert torch.allclose(logits[:, -1], expected, atol=1e-9)
    assert not m.compact()  # nothing hidden any more


def test_joining_rows_of_different_widths(tiny_target):
    first, second = [[5, 9, 2, 7, 8, 1]], [[11, 3], [40]]
    a, b = RaggedCachedModel(tiny_target), RaggedCachedModel(tiny_target)
    a.feed(*left_pad(first, 0, "cpu"), 1)
    b.feed(*left_pad(second, 0, "cpu"), 1)
    a.join(b)
    assert a.num_rows == 3 and a.num_slots == 6
    logits, _ = a.feed(torch.tensor([[1], [4], [6]]), torch.ones((3, 1), dtype=torch.bool), 1)
    seqs = [s + [t] for s, t in zip(first + second, (1, 4, 6), strict=True)]
    assert torch.allclose(logits[:, -1], _next_logits(tiny_target, seqs), atol=1e-9)


def test_rows_are_refilled_and_caches_compacted_without_changing_greedy_output(
    tiny_target, tiny_draft_independent, monkeypatch
):
    """Batch 2 over 7 prompts: finished rows are refilled from the queue, the caches (full of
    rejected drafts) are compacted, and the output still equals the target's greedy output."""
    prompts = _prompts(8, lengths=(5, 9, 3, 12, 7, 4, 10))
    expected = _target_greedy(tiny_target, prompts, max_new=24)
    joins, compactions = [], []
    real_join, real_compact = RaggedCachedModel.join, RaggedCachedModel.compact

    def counting_join(self, other):
        joins.append(other.num_rows)
        return real_join(self, other)

    def counting_compact(self, min_waste=16):
        done = real_compact(self, min_waste)
        compactions.append(done)
        return done

    monkeypatch.setattr(RaggedCachedModel, "join", counting_join)
    monkeypatch.setattr(RaggedCachedModel, "compact", counting_compact)
    cfg = DecodingConfig(max_new_tokens=24, temperature=0.0, batch_size=2)
    got, _ = generate_rounds(
        prompts, cfg, torch.Generator(), tiny_draft_independent, tiny_target, 4
    )
    assert got == expected
    assert len(joins) >= 2 * 4  # both models joined newcomers at least 4 times
    assert any(compactions)
    cfg_tok = DecodingConfig(max_new_tokens=24, temperature=0.0, batch_size=3)
    assert generate_tokenwise(prompts, cfg_tok, torch.Generator(), target=tiny_target) == expected


def test_progress_counts_every_committed_token(tiny_target, tiny_draft_close, caplog):
    import io
    import logging

    from edgespec.decoding.progress import DecodeProgress

    prompts = _prompts(9)
    cfg = DecodingConfig(max_new_tokens=7, temperature=0.0, batch_size=2)
    progress = DecodeProgress("test", 7 * len(prompts), len(prompts), stream=io.StringIO())
    with caplog.at_level(logging.INFO, logger="edgespec"):
        out, _ = generate_rounds(
            prompts, cfg, torch.Generator(), tiny_draft_close, tiny_target, 3, progress=progress
        )
    assert progress.tokens == sum(len(o) for o in out) and progress.prompts_done == len(prompts)
    assert "tokens/s" in caplog.text


# --- prefill: shared prefixes computed once, chunks of similar length ---------------------------


def test_shared_prefix_groups_by_hand():
    p = SYSTEM_TURN
    prompts = [p + [1, 2], [7, 7, 7], p + [1], p[:4] + [60] * 6, p + [1, 2]]
    # sorted by tokens: [7,7,7] | p+[1], p+[1,2], p+[1,2] | p[:4]+[60..] (60 > p[4])
    groups = _shared_prefix_groups(prompts, keep_last=1)
    assert groups == [(0, [1, 3]), (len(p), [2, 0, 4])]
    # keep_last=1 leaves each member a token of its own: p+[1] caps the prefix at len(p)
    assert _shared_prefix_groups([p + [1], p + [1]], keep_last=1) == [(len(p), [0, 1])]
    assert _shared_prefix_groups([p + [1], p + [1]], keep_last=0) == [(len(p) + 1, [0, 1])]
    # shorter than MIN_SHARED_PREFIX: nothing shared
    assert _shared_prefix_groups([p[:5] + [1], p[:5] + [2]], keep_last=1) == [(0, [0, 1])]


def test_prefill_equals_unpadded_forwards_and_feeds_the_prefix_once(tiny_target, fed_tokens):
    prompts = [
        SYSTEM_TURN + [3, 17],
        [40, 2, 11],
        SYSTEM_TURN + [40, 2, 11, 58, 7, 31, 5, 6, 1, 9],
        SYSTEM_TURN + [3, 17],
        SYSTEM_TURN + [8],
    ]
    cache, (logits, _) = prefill(tiny_target, prompts, pad_token_id=0)
    # the system turn once, then each prompt's own tokens: 10 + (2 + 10 + 2 + 1) + 3
    assert sum(fed_tokens) == 28 < sum(len(p) for p in prompts)
    assert cache.num_rows == len(prompts)
    assert torch.allclose(logits[:, -1], _next_logits(tiny_target, prompts), atol=1e-5)
    # the rows continue as their unpadded prompts would
    step = torch.tensor([[1], [4], [6], [2], [5]])
    after, _ = cache.feed(step, torch.ones((5, 1), dtype=torch.bool), 1)
    seqs = [p + [int(t)] for p, t in zip(prompts, step[:, 0], strict=True)]
    assert torch.allclose(after[:, -1], _next_logits(tiny_target, seqs), atol=1e-5)


def test_prefill_without_outputs_takes_empty_prompts(tiny_target):
    heads = [SYSTEM_TURN, [], SYSTEM_TURN + [4]]
    cache, outs = prefill(tiny_target, heads, pad_token_id=0, with_outputs=False)
    assert outs is None and cache.num_rows == 3
    assert cache.slot_valid.sum(1).tolist() == [len(h) for h in heads]
    step = torch.tensor([[1], [4], [6]])
    after, _ = cache.feed(step, torch.ones((3, 1), dtype=torch.bool), 1)
    seqs = [h + [int(t)] for h, t in zip(heads, step[:, 0], strict=True)]
    assert torch.allclose(after[:, -1], _next_logits(tiny_target, seqs), atol=1e-5)
    with pytest.raises(ValueError, match="needs a token"):
        prefill(tiny_target, heads, pad_token_id=0)


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_output_is_unchanged_when_prompts_share_a_prefix(
    tiny_target, tiny_draft_close, gamma
):
    prompts = [SYSTEM_TURN + p for p in _prompts(13, lengths=(1, 6, 3, 11))] + [
        SYSTEM_TURN[:1],
        SYSTEM_TURN + [5],
        SYSTEM_TURN + [5],
    ]
    expected = _target_greedy(tiny_target, prompts)
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=4)
    got, _ = generate_rounds(prompts, cfg, torch.Generator(), tiny_draft_close, tiny_target, gamma)
    assert got == expected
    got = generate_tokenwise(
        prompts, cfg, torch.Generator(), draft=tiny_draft_close, target=tiny_target
    )
    assert got == expected
