"""The committed token's law after a compressed upload (methods §3.4): the closed form against a
hand case and Monte Carlo, the engine's one-step law against it (so the edge verifies against
x_hat), and cuhlm_exact's output law against y."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from edgespec.cuhlm.distortion import committed_law, output_distortion, output_distortion_grid
from edgespec.cuhlm.policies import ExactTopKPolicy, FixedK, ThresholdPolicy
from edgespec.decoding.compression import (
    reconstruct_topk,
    resampling_distortion,
    sort_by_draft,
    total_variation,
    vocabulary_ranks,
)
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.sampling import probabilities, residual_distribution, verify_single_token
from edgespec.decoding.tokenwise import generate_tokenwise

VOCAB = 61


def _chisquare_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square goodness of fit of ``counts`` to ``law``; cells with expected count < 5 are
    pooled into one (the test's validity condition)."""
    n = counts.sum().item()
    expected = law.to(torch.float64) * n
    keep = expected >= 5
    exp, obs = expected[keep], counts[keep].to(torch.float64)
    if expected[~keep].sum() >= 5:
        exp = torch.cat([exp, expected[~keep].sum(0, keepdim=True)])
        obs = torch.cat([obs, counts[~keep].to(torch.float64).sum(0, keepdim=True)])
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


def test_committed_law_hand_case():
    """x = (0.5, 0.3, 0.2), y = (0.2, 0.5, 0.3), k = 1: x_hat = (0.5, 0.25, 0.25).

    Accept paths q_i min(1, y_i / p_i): 0.5*0.4 = 0.2, 0.3*1 = 0.3, 0.2*1 = 0.2; rho = 0.3.
    Residual (y - x_hat)^+ = (0, 0.25, 0.05) / 0.3. y_hat = (0.2, 0.55, 0.25); TVD = 0.05.
    """
    x = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    y = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    x_hat = reconstruct_topk(x, 1)
    torch.testing.assert_close(x_hat, torch.tensor([[0.5, 0.25, 0.25]], dtype=torch.float64))
    law = committed_law(x, x_hat, y)
    torch.testing.assert_close(law, torch.tensor([[0.2, 0.55, 0.25]], dtype=torch.float64))
    assert output_distortion(x, y, 1).item() == pytest.approx(0.05)
    # Verified against the law d was drawn from, the output is y (speculative sampling).
    torch.testing.assert_close(committed_law(x, x, y), y)
    torch.testing.assert_close(committed_law(x_hat, x_hat, y), y)
    assert output_distortion(x, y, 1, sample_from_reconstruction=True).item() < 1e-15
    assert output_distortion(x, y, 3).item() < 1e-15  # k = |V|: nothing compressed
    with pytest.raises(ValueError, match="shape"):
        committed_law(x, x_hat[:, :2], y)


def test_zero_received_entry_is_always_accepted():
    """p_i = 0 (a tail whose mass rounded away): a token d = i is kept, as the sampler does."""
    x = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64)
    p = torch.tensor([[0.7, 0.3, 0.0]], dtype=torch.float64)
    y = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    # accept: 0.6 * 5/7, 0.3 * 1, 0.1 * 1; rho = 0.6 * 2/7; residual (y - p)^+ = (0, 0, 0.2).
    expected = torch.tensor([[0.6 * 5 / 7, 0.3, 0.1 + 0.6 * 2 / 7]], dtype=torch.float64)
    torch.testing.assert_close(committed_law(x, p, y), expected)
    d = torch.full((40000,), 2)
    committed, accepted = verify_single_token(d, p.expand(40000, 3), y.expand(40000, 3), _gen(1))
    assert accepted.all() and (committed == 2).all()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_closed_form_matches_monte_carlo_of_one_step(k):
    """Draw d ~ x, verify against x_hat with the sampler the engine uses, many times: the
    committed tokens follow the closed form (chi-square), their TVD from y matches it within
    sampling error, and for these pairs the law is measurably not y."""
    vocab, n = 12, 200_000
    g = _gen(3 + k)
    x = torch.softmax(2.5 * torch.randn(1, vocab, generator=g, dtype=torch.float64), -1)
    y = torch.softmax(2.5 * torch.randn(1, vocab, generator=g, dtype=torch.float64), -1)
    x_hat = reconstruct_topk(x, k)
    law = committed_law(x, x_hat, y)[0]
    distortion = output_distortion(x, y, k).item()
    assert distortion == pytest.approx(total_variation(law, y[0]).item())
    assert distortion > 0.02  # a pair whose compression visibly distorts the output
    d = torch.multinomial(x.expand(n, vocab), 1, replacement=True, generator=g).squeeze(1)
    committed, _ = verify_single_token(d, x_hat.expand(n, vocab), y.expand(n, vocab), g)
    counts = torch.bincount(committed, minlength=vocab)
    assert _chisquare_pvalue(counts, law) > 1e-3
    assert _chisquare_pvalue(counts, y[0]) < 1e-9
    empirical = total_variation(counts.double() / n, y[0]).item()
    # The empirical TVD from y differs from the true one by at most TVD(empirical, law), whose
    # mean is below sqrt(V / n) / 2.
    assert abs(empirical - distortion) < 3 * np.sqrt(vocab / n)


def test_grid_and_rows():
    g = _gen(0)
    x = torch.softmax(3 * torch.randn(5, 20, generator=g, dtype=torch.float64), -1)
    y = torch.softmax(3 * torch.randn(5, 20, generator=g, dtype=torch.float64), -1)
    grid = output_distortion_grid(x, y, [1, 3, 20])
    assert grid.shape == (5, 3)
    for j, k in enumerate([1, 3, 20]):
        for row in range(5):
            one = output_distortion(x[row : row + 1], y[row : row + 1], k).item()
            assert grid[row, j].item() == pytest.approx(one, abs=1e-15)
    assert (grid[:, 2] < 1e-15).all()
    per_row_k = output_distortion(x, y, torch.tensor([1, 3, 20, 1, 3]))
    torch.testing.assert_close(per_row_k, grid[[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]])


def _awkward_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that test the sorted-prefix shortcuts: random, tied draft values, exact zeros in
    x, y == x (an empty residual), and a draft with all its mass on its top 3 (tail level 0)."""
    g = _gen(7)
    x = torch.softmax(2 * torch.randn(6, 40, generator=g, dtype=torch.float64), -1)
    y = torch.softmax(2 * torch.randn(6, 40, generator=g, dtype=torch.float64), -1)
    x[1, :12] = x[1, :12].mean()
    x[2, 5:25] = 0
    x[2] /= x[2].sum()
    y[3] = x[3]
    x[4] = 0
    x[4, [3, 17, 30]] = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grids_from_one_sort_equal_the_direct_formulas(dtype):
    """Both k grids, computed from prefix sums in the draft's order, equal TVD(y_hat_k, y) and
    TVD(r, r_hat_k) built directly from x_hat_k for every row and k, awkward rows included."""
    x, y = _awkward_rows(dtype)
    grid = [1, 2, 3, 7, 12, 13, 20, 39, 40]
    pair = sort_by_draft(x, y)
    otvd = output_distortion_grid(x, y, grid, pair)
    tvd = resampling_distortion(x, y, grid, pair)
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    ranks = vocabulary_ranks(x)
    for j, k in enumerate(grid):
        x_hat = reconstruct_topk(x64, k, ranks)
        direct_out = total_variation(committed_law(x64, x_hat, y64), y64)
        direct_res = total_variation(
            residual_distribution(y64, x64), residual_distribution(y64, x_hat)
        )
        torch.testing.assert_close(otvd[:, j], direct_out, rtol=0, atol=1e-14)
        torch.testing.assert_close(tvd[:, j], direct_res, rtol=0, atol=1e-14)
    # at k = |V| only the inputs' own rounding is left (x and y sum to 1 within it)
    assert (tvd[:, -1] == 0).all() and (otvd[:, -1] < 10 * torch.finfo(dtype).eps).all()
    assert otvd[0, 0] > 0.01 and tvd[0, 0] > 0.01  # a real distortion, not all zeros


def _one_step_law(draft, target, prompt):
    with torch.no_grad():
        z_x = draft(torch.tensor([prompt])).logits[:, -1]
        z_y = target(torch.tensor([prompt])).logits[:, -1]
    return probabilities(z_x, 1.0), probabilities(z_y, 1.0)


def _one_step(draft, target, prompt, policy, n, seed):
    cfg = DecodingConfig(max_new_tokens=1, temperature=1.0, batch_size=n)
    drafts: list[torch.Tensor] = []
    out = generate_tokenwise(
        [prompt] * n,
        cfg,
        _gen(seed),
        draft=draft,
        target=target,
        policy=policy,
        on_step=lambda step: drafts.append(step.draft_tokens),
    )
    committed = torch.tensor([o[0] for o in out])
    return torch.bincount(committed, minlength=VOCAB), torch.bincount(
        torch.cat(drafts), minlength=VOCAB
    )


PROMPT = [3, 17, 29]
N_STEPS = 20_000


@pytest.mark.parametrize("k", [1, 3])
def test_engine_verifies_against_the_reconstruction(tiny_target, tiny_draft_independent, k):
    """One engine step at small k, many times: the committed tokens follow the compressed law
    y_hat = x min(1, y / x_hat) + rho_hat r_hat (chi-square), not y. An edge that verified
    against the full x would commit y-distributed tokens, and this test would fail."""
    x, y = _one_step_law(tiny_draft_independent, tiny_target, PROMPT)
    x_hat = reconstruct_topk(x.to(torch.float64), k)
    law = committed_law(x, x_hat, y)[0]
    assert total_variation(law, y[0].double()).item() > 0.05  # the two laws are far apart
    policy = ThresholdPolicy(None, FixedK(k), uncertainty_samples=0)
    committed, drafted = _one_step(tiny_draft_independent, tiny_target, PROMPT, policy, N_STEPS, 5)
    assert _chisquare_pvalue(drafted, x[0]) > 1e-3  # the device draws from x
    assert _chisquare_pvalue(committed, law) > 1e-3
    assert _chisquare_pvalue(committed, y[0]) < 1e-9


def test_cuhlm_exact_output_law_is_the_target(tiny_target, tiny_draft_independent):
    """cuhlm_exact with skipping off: the device draws from x_hat and the edge verifies against
    it, so the committed tokens follow y (chi-square), although the drafts follow x_hat."""
    k = 2
    x, y = _one_step_law(tiny_draft_independent, tiny_target, PROMPT)
    x_hat = reconstruct_topk(x.to(torch.float64), k)[0]
    policy = ExactTopKPolicy(None, k, uncertainty_samples=0)
    committed, drafted = _one_step(tiny_draft_independent, tiny_target, PROMPT, policy, N_STEPS, 6)
    assert _chisquare_pvalue(drafted, x_hat) > 1e-3
    assert _chisquare_pvalue(drafted, x[0]) < 1e-9
    assert _chisquare_pvalue(committed, y[0]) > 1e-3
    # The same upload without the exact draw (cuhlm_offline) is measurably not y.
    offline = committed_law(x, x_hat.unsqueeze(0), y)[0]
    assert total_variation(offline, y[0].double()).item() > 0.05


def test_default_sampling_distribution_leaves_the_draws_unchanged(
    tiny_target, tiny_draft_independent
):
    """The engine's new hook defaults to x: an explicit policy returning x draws the very same
    tokens as one that does not override it (same generator consumption)."""

    class Explicit(ThresholdPolicy):
        def sampling_distribution(self, draft_logits, draft_probs):
            return draft_probs.clone()

    cfg = DecodingConfig(max_new_tokens=6, temperature=1.0, batch_size=4)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    base = ThresholdPolicy(0.3, FixedK(4), uncertainty_samples=5)
    explicit = Explicit(0.3, FixedK(4), uncertainty_samples=5)
    a = generate_tokenwise(prompts, cfg, _gen(9), tiny_draft_independent, tiny_target, base)
    b = generate_tokenwise(prompts, cfg, _gen(9), tiny_draft_independent, tiny_target, explicit)
    assert a == b


def _step(x: torch.Tensor, y: torch.Tensor, k: list[int]):
    from edgespec.decoding.tokenwise import TokenStep

    batch = x.shape[0]
    return TokenStep(
        prompt_indices=list(range(batch)),
        position=torch.zeros(batch, dtype=torch.long),
        draft_logits=x.log(),
        draft_probs=x,
        target_probs=y,
        draft_tokens=torch.zeros(batch, dtype=torch.long),
        uncertainty=None,
        skipped=torch.zeros(batch, dtype=torch.bool),
        upload_k=torch.tensor(k),
        accepted=torch.ones(batch, dtype=torch.bool),
        committed=torch.zeros(batch, dtype=torch.long),
    )


def test_the_decode_table_records_the_output_distortion_of_each_step():
    """The table's output_tvd is TVD(y_hat, y) of that step (output_distortion), its
    measured_tvd TVD(r, r_hat); the two differ here, so neither can stand in for the other."""
    from edgespec.cuhlm.decode import _record_step

    gen = torch.Generator().manual_seed(3)
    x = torch.softmax(2 * torch.randn(3, 12, generator=gen, dtype=torch.float64), -1)
    y = torch.softmax(2 * torch.randn(3, 12, generator=gen, dtype=torch.float64), -1)
    k = [1, 3, 12]
    row = _record_step(_step(x, y, k), ["a", "b", "c"], ThresholdPolicy(None, FixedK(3)))
    expected = output_distortion(x, y, torch.tensor(k)).numpy()
    np.testing.assert_allclose(row["output_tvd"], expected, rtol=1e-12, atol=1e-15)
    residual = total_variation(
        residual_distribution(y, x), residual_distribution(y, reconstruct_topk(x, torch.tensor(k)))
    ).numpy()
    np.testing.assert_allclose(row["measured_tvd"], residual, rtol=1e-12, atol=1e-15)
    assert row["output_tvd"][2] == row["measured_tvd"][2] == 0  # k = |V|: nothing compressed
    assert np.abs(row["output_tvd"][:2] - row["measured_tvd"][:2]).min() > 1e-3


def test_exact_verification_loses_only_the_laws_normalisation():
    """cuhlm_exact verifies d against the law it was drawn from: TVD(y_hat, y) with q = p is
    half the difference of the two laws' sums, |sum p - sum y| / 2 (a float32 softmax over a
    large vocabulary sums to 1 only to ~1e-5), and the decode table, which renormalises both
    in float64, records 0."""
    from edgespec.cuhlm.decode import _record_step

    gen = torch.Generator().manual_seed(5)
    x = torch.softmax(torch.randn(2, 50, generator=gen, dtype=torch.float64), -1)
    y = torch.softmax(torch.randn(2, 50, generator=gen, dtype=torch.float64), -1)
    x_hat = reconstruct_topk(x, 4)
    off = y * (1 + 3e-5)  # a target whose entries sum to 1 + 3e-5
    assert total_variation(committed_law(x_hat, x_hat, off), off).numpy() == pytest.approx(
        [1.5e-5, 1.5e-5], rel=1e-6
    )
    step = _step(x.to(torch.float32), off.to(torch.float32), [4, 4])
    row = _record_step(step, ["a", "b"], ExactTopKPolicy(None, 4))
    assert np.abs(row["output_tvd"]).max() < 1e-12 and np.abs(row["measured_tvd"]).max() < 1e-12
