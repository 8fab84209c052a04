"""The engine against the target alone: exact for greedy, distribution-exact for sampling."""

from __future__ import annotations

import pytest
import torch

from edgespec.decoding.engine import (
    DecodingConfig,
    TokenPolicy,
    generate_rounds,
    generate_tokenwise,
)

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
    "draft_name", ["tiny_target", "tiny_draft_close", "tiny_draft_independent"]
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


def test_slm_only_never_calls_target(tiny_draft_close):
    class Exploding(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise AssertionError("target called")

    prompts = _prompts(4)
    cfg = DecodingConfig(max_new_tokens=8, temperature=1.0, batch_size=5)
    out = generate_tokenwise(prompts, cfg, torch.Generator().manual_seed(0), draft=tiny_draft_close)
    assert all(len(o) == 8 for o in out)


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


def _first_token_counts(sampler, n_runs: int, vocab: int) -> torch.Tensor:
    counts = torch.zeros(vocab)
    for token in sampler(n_runs):
        counts[token] += 1
    return counts


@pytest.mark.parametrize("gamma", [1, 3])
def test_sampled_rounds_match_target_distribution(tiny_target, tiny_draft_independent, gamma):
    """The second generated token's law under sampled SD equals the target's (chi-square)."""
    from scipy.stats import chisquare

    prompt = [3, 17, 29]
    n = 3000
    cfg = DecodingConfig(max_new_tokens=2, temperature=1.0, batch_size=n)
    gen = torch.Generator().manual_seed(11)
    out, _ = generate_rounds([prompt] * n, cfg, gen, tiny_draft_independent, tiny_target, gamma)
    # Exact law of the first two tokens under the target: p(t1) p(t2 | t1).
    with torch.no_grad():
        p1 = torch.softmax(tiny_target(torch.tensor([prompt])).logits[0, -1], -1)
        seqs = torch.tensor([prompt + [t] for t in range(61)])
        p2 = torch.softmax(tiny_target(seqs).logits[:, -1], -1)
    joint_second = (p1.unsqueeze(1) * p2).sum(0)
    first = torch.bincount(torch.tensor([o[0] for o in out]), minlength=61).double()
    second = torch.bincount(torch.tensor([o[1] for o in out]), minlength=61).double()
    for observed, law in ((first, p1), (second, joint_second)):
        keep = law * n >= 5  # chi-square needs expected counts >= 5; pool the rest
        exp, obs = law[keep] * n, observed[keep]
        if (law[~keep] * n).sum() >= 5:
            exp = torch.cat([exp, (law[~keep] * n).sum(0, keepdim=True)])
            obs = torch.cat([obs, observed[~keep].sum(0, keepdim=True)])
        assert (
            chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
        )
        assert 0.5 * (observed / n - law).abs().sum() < 0.06
