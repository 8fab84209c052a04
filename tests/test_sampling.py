"""The pure sampler, top-k reconstruction and uncertainty, on hand-built distributions."""

from __future__ import annotations

import pytest
import torch
from distribution_checks import tv_noise_floor
from scipy.stats import chisquare

from edgespec.decoding.compression import (
    reconstruct_topk,
    resampling_distortion,
    topk_mass_and_error,
    total_variation,
    vocabulary_ranks,
)
from edgespec.decoding.sampling import (
    PLACEHOLDER_TOKEN_ID,
    greedy_tokens,
    greedy_verify,
    probabilities,
    rejection_probability,
    rejection_sample,
    residual_distribution,
    sample,
    verify_single_token,
)
from edgespec.decoding.uncertainty import entropy, perturbation_uncertainty
from edgespec.wireless.payload import upload_bits

V = 6
N = 40_000


def _dist(*values):
    t = torch.tensor(values, dtype=torch.float64)
    return t / t.sum()


ADVERSARIAL_PAIRS = {
    "equal": (_dist(1, 2, 3, 4, 5, 6), _dist(1, 2, 3, 4, 5, 6)),
    "disjoint": (_dist(1, 1, 1, 0, 0, 0), _dist(0, 0, 0, 2, 1, 1)),
    "one_hot_draft": (_dist(0, 0, 1, 0, 0, 0), _dist(3, 1, 1, 1, 2, 2)),
    "draft_zero_where_target_not": (_dist(5, 5, 0, 0, 1, 1), _dist(1, 1, 2, 2, 1, 1)),
    "target_one_hot": (_dist(1, 2, 3, 1, 2, 3), _dist(0, 0, 0, 0, 1, 0)),
}


def _assert_distributed_as(tokens: torch.Tensor, law: torch.Tensor):
    counts = torch.bincount(tokens.flatten(), minlength=law.numel()).double()
    support = law > 0
    assert counts[~support].sum() == 0, "sampled a token outside the target's support"
    if support.sum() > 1:
        stat = chisquare(counts[support].numpy(), (law[support] * counts.sum()).numpy())
        assert stat.pvalue > 1e-3, f"chi-square p={stat.pvalue:.2e}"
    # With a handful of categories the TV's spread is wide next to its mean (about 0.75 of it
    # for two): 4x the mean is a 3-sigma limit that a correct sampler meets at any sample count.
    n = int(counts.sum())
    assert total_variation(counts / counts.sum(), law) <= 4.0 * tv_noise_floor(law, n)


def test_sample_follows_each_rows_law_and_never_draws_a_zero():
    laws = torch.stack([_dist(0, 3, 0, 1, 0, 2), _dist(1, 0, 0, 0, 0, 0), _dist(1, 1, 1, 1, 1, 0)])
    gen = torch.Generator().manual_seed(4)
    tokens = sample(laws.expand(N, 3, V), gen)
    assert tokens.shape == (N, 3) and tokens.dtype == torch.long
    for row in range(3):
        _assert_distributed_as(tokens[:, row], laws[row])
    # unnormalised rows are drawn in proportion, as torch.multinomial would
    assert torch.all(sample(torch.tensor([[0.0, 0.0, 5.0]]).expand(100, 3), gen) == 2)


@pytest.mark.parametrize("name", sorted(ADVERSARIAL_PAIRS))
def test_single_token_verification_is_target_distributed(name):
    x, y = ADVERSARIAL_PAIRS[name]
    gen = torch.Generator().manual_seed(0)
    d = sample(x.expand(N, V), gen)
    out, _ = verify_single_token(d, x.expand(N, V), y.expand(N, V), gen)
    _assert_distributed_as(out, y)


@pytest.mark.parametrize("name", sorted(ADVERSARIAL_PAIRS))
def test_rejection_sample_first_position_and_bonus(name):
    x, y = ADVERSARIAL_PAIRS[name]
    gen = torch.Generator().manual_seed(1)
    gamma = 2
    d = sample(x.expand(N, gamma, V), gen)
    target = torch.stack([y, y.flip(0), _dist(1, 1, 1, 1, 1, 1)]).expand(N, gamma + 1, V)
    res = rejection_sample(d, x.expand(N, gamma, V), target, gen)
    _assert_distributed_as(res.output_tokens[:, 0], y)
    # Rows that accepted every draft token end with a bonus token from the last target row.
    full = res.num_accepted == gamma
    if full.sum() > 1000:
        _assert_distributed_as(res.output_tokens[full, gamma], target[0, gamma])


# Per-position pairs (draft x_i, target y_i) of one round: the ratio y/x varies across tokens and
# positions, so a sampler that shared one uniform across a row's positions, or built position i's
# residual from another position's target, would commit tokens with the wrong law.
ROUND_PAIRS = [
    (_dist(5, 1, 1, 1, 1, 1), _dist(1, 3, 1, 2, 1, 1)),
    (_dist(1, 1, 4, 1, 2, 1), _dist(2, 2, 1, 1, 1, 3)),
    (_dist(1, 2, 1, 1, 1, 4), _dist(3, 1, 2, 1, 2, 1)),
]
BONUS = _dist(1, 1, 2, 2, 3, 3)


@pytest.mark.parametrize("gamma", [2, 3])
def test_rejection_sample_every_position_follows_its_target(gamma):
    """Token j of a round is distributed as y_j among the rows that reach position j (every
    earlier draft accepted); position gamma is the bonus, distributed as y_gamma+1."""
    n = 60_000
    gen = torch.Generator().manual_seed(21)
    x = torch.stack([p[0] for p in ROUND_PAIRS[:gamma]])
    y = torch.stack([p[1] for p in ROUND_PAIRS[:gamma]] + [BONUS])
    d = sample(x.expand(n, gamma, V), gen)
    res = rejection_sample(d, x.expand(n, gamma, V), y.expand(n, gamma + 1, V), gen)
    for j in range(gamma + 1):
        reached = res.num_accepted >= j
        assert reached.sum() > 2000, f"too few rows reach position {j}"
        _assert_distributed_as(res.output_tokens[reached, j], y[j])


def test_rejection_sample_draws_one_uniform_per_position():
    """Acceptances of two positions are independent given the drafts: with x_d = 2 y_d at
    both positions each is accepted with probability 1/2, and both with probability 1/4."""
    n = 40_000
    gen = torch.Generator().manual_seed(22)
    x = _dist(2, 1, 1).expand(n, 2, 3)
    y = torch.stack([_dist(1, 1.5, 1.5), _dist(1, 1.5, 1.5), _dist(1, 1, 1)]).expand(n, 3, 3)
    d = torch.zeros((n, 2), dtype=torch.long)  # token 0 at both positions: x_d = 1/2, y_d = 1/4
    res = rejection_sample(d, x, y, gen)
    both = (res.accepted_mask[:, 0] & res.accepted_mask[:, 1]).double().mean().item()
    assert abs(res.accepted_mask.double().mean().item() - 0.5) < 0.01
    assert abs(both - 0.25) < 0.01


def test_rejection_sample_output_layout():
    gen = torch.Generator().manual_seed(2)
    y = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3], [1, 5, 3]]), V).double()
    x = torch.nn.functional.one_hot(torch.tensor([[1, 2], [1, 2]]), V).double()
    res = rejection_sample(torch.tensor([[1, 2], [1, 2]]), x, y, gen)
    assert res.num_accepted.tolist() == [2, 1]
    assert res.output_tokens.tolist() == [[1, 2, 3], [1, 5, PLACEHOLDER_TOKEN_ID]]


def test_greedy_verify_matches_hand_case():
    logits = torch.full((1, 4, V), -5.0)
    for pos, tok in enumerate([4, 0, 2, 1]):
        logits[0, pos, tok] = 5.0
    res = greedy_verify(torch.tensor([[4, 0, 3]]), logits)
    assert res.num_accepted.item() == 2
    assert res.output_tokens.tolist() == [[4, 0, 2, PLACEHOLDER_TOKEN_ID]]
    res = greedy_verify(torch.tensor([[4, 0, 2]]), logits)
    assert res.output_tokens.tolist() == [[4, 0, 2, 1]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_greedy_tokens_take_the_first_of_tied_maxima(dtype):
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 0.0, 5.0, 5.0], [0.0, 0.0, 0.0, 1.0]])
    assert greedy_tokens(logits.to(dtype)).tolist() == [1, 0, 3]
    # bf16 logits of a real vocabulary tie often; every row and position as argmax has it
    gen = torch.Generator().manual_seed(0)
    heavy_ties = torch.randint(0, 3, (4, 3, 5000), generator=gen).to(dtype)
    assert torch.equal(greedy_tokens(heavy_ties), heavy_ties.argmax(-1))


def test_residual_and_beta_hand_computed():
    x, y = _dist(4, 4, 2), _dist(2, 4, 4)
    r = residual_distribution(y, x)
    assert torch.allclose(r, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    beta = rejection_probability(torch.tensor([0, 2]), x.expand(2, 3), y.expand(2, 3))
    assert torch.allclose(beta, torch.tensor([0.5, 0.0], dtype=torch.float64))


def test_probabilities_temperature_zero_is_one_hot():
    logits = torch.tensor([[0.1, 3.0, -1.0]])
    assert probabilities(logits, 0).tolist() == [[0.0, 1.0, 0.0]]
    with pytest.raises(ValueError):
        probabilities(logits, -1)


# --- top-k reconstruction ------------------------------------------------------------------


def test_topk_reconstruction_sums_to_one_and_is_exact_at_full_k():
    gen = torch.Generator().manual_seed(3)
    x = torch.softmax(torch.randn(8, 50, generator=gen, dtype=torch.float64) * 3, -1)
    for k in (1, 2, 7, 49, 50):
        x_hat = reconstruct_topk(x, k)
        assert torch.allclose(x_hat.sum(-1), torch.ones(8, dtype=torch.float64))
    assert torch.equal(reconstruct_topk(x, 50), x)
    per_row = reconstruct_topk(x, torch.tensor([1, 50, 3, 3, 3, 3, 3, 50]))
    assert torch.equal(per_row[1], x[1]) and torch.allclose(
        per_row[0], reconstruct_topk(x[:1], 1)[0]
    )


def test_topk_reconstruction_without_a_sort_equals_the_ranked_one():
    gen = torch.Generator().manual_seed(31)
    x = torch.softmax(torch.randn(6, 500, generator=gen, dtype=torch.float64) * 2, -1)
    k = torch.tensor([1, 500, 17, 499, 500, 64])
    fast = reconstruct_topk(x, k)
    assert torch.equal(fast, reconstruct_topk(x, k, vocabulary_ranks(x)))
    assert torch.equal(fast[1], x[1]) and torch.equal(fast[4], x[4])
    assert reconstruct_topk(x, 500) is x  # a full upload is passed through, no sort


def test_topk_reconstruction_hand_case():
    x = torch.tensor([[0.5, 0.1, 0.3, 0.1]], dtype=torch.float64)
    x_hat = reconstruct_topk(x, 2)
    assert torch.allclose(x_hat, torch.tensor([[0.5, 0.1, 0.3, 0.1]], dtype=torch.float64))
    x = torch.tensor([[0.5, 0.2, 0.25, 0.05]], dtype=torch.float64)
    assert torch.allclose(
        reconstruct_topk(x, 2), torch.tensor([[0.5, 0.125, 0.25, 0.125]], dtype=torch.float64)
    )


def test_topk_mass_and_error_match_direct_computation():
    gen = torch.Generator().manual_seed(4)
    x = torch.softmax(torch.randn(5, 40, generator=gen, dtype=torch.float64) * 2, -1)
    x[0] = torch.nn.functional.one_hot(torch.tensor(7), 40).double()
    grid = [1, 2, 3, 10, 39, 40]
    mass, err = topk_mass_and_error(x, grid)
    for j, k in enumerate(grid):
        x_hat = reconstruct_topk(x, k)
        assert torch.allclose(err[:, j], (x - x_hat).abs().sum(-1), atol=1e-12)
        assert torch.allclose(mass[:, j], x.sort(-1, descending=True).values[:, :k].sum(-1))
    assert torch.all(err[:, -1] == 0)


def test_distortion_vanishes_at_full_vocabulary():
    gen = torch.Generator().manual_seed(5)
    x = torch.softmax(torch.randn(4, 30, generator=gen, dtype=torch.float64), -1)
    y = torch.softmax(torch.randn(4, 30, generator=gen, dtype=torch.float64), -1)
    tvd = resampling_distortion(x, y, [1, 5, 30])
    assert torch.all(tvd[:, -1] == 0) and torch.all(tvd[:, 0] >= 0)


def test_payload_bits_follow_spec():
    assert upload_bits(32_000, 32_000, prob_bits=8) == 736_000  # 92 kB, methods §3.1
    assert upload_bits(30, 32_000) == 690
    assert upload_bits(1, 151_936) == 8 + 18


def test_topk_rejects_bad_k():
    with pytest.raises(ValueError):
        reconstruct_topk(torch.ones(1, 4) / 4, 0)
    with pytest.raises(ValueError):
        reconstruct_topk(torch.ones(1, 4) / 4, 5)


# --- uncertainty ---------------------------------------------------------------------------


def test_uncertainty_zero_for_one_hot_and_rises_with_entropy():
    gen = torch.Generator().manual_seed(6)
    vocab = 100
    peaked = torch.full((1, vocab), -1e4)
    peaked[0, 3] = 0.0
    assert perturbation_uncertainty(peaked, torch.tensor([3]), 200, 2.0, gen).item() == 0.0
    u_values, h_values = [], []
    for scale in (8.0, 2.0, 0.5, 0.0):
        logits = torch.linspace(0, -1, vocab).unsqueeze(0) * scale * 10
        u_values.append(perturbation_uncertainty(logits, torch.tensor([0]), 2000, 2.0, gen).item())
        h_values.append(entropy(torch.softmax(logits, -1)).item())
    assert h_values == sorted(h_values)
    assert u_values == sorted(u_values) and u_values[-1] > 0.9 and u_values[0] < u_values[1]


def test_uncertainty_uses_the_generator_passed_in():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(7))
    d = logits.argmax(-1)
    a = perturbation_uncertainty(logits, d, 20, 2.0, torch.Generator().manual_seed(9))
    b = perturbation_uncertainty(logits, d, 20, 2.0, torch.Generator().manual_seed(9))
    c = perturbation_uncertainty(logits, d, 20, 2.0, torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.all((a * 20).round() == a * 20)  # multiples of 1/M


def test_uncertainty_matches_its_expectation():
    """E[u] = 1 - E_theta[softmax(z / theta)_d], computed by quadrature over theta."""
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    d = torch.tensor([1])
    u = (
        perturbation_uncertainty(
            logits.expand(4000, 4), d.expand(4000), 20, 2.0, torch.Generator().manual_seed(12)
        )
        .mean()
        .item()
    )
    thetas = torch.linspace(1e-4, 2.0, 20_001, dtype=torch.float64)
    p_d = torch.softmax(logits.double() / thetas.unsqueeze(1), -1)[:, 1]
    assert abs(u - (1 - p_d.mean().item())) < 0.01
