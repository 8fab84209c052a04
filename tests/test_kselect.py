"""Top-k choice for CU-HLM: reconstruction errors, bounds, online k(t), offline k*
(methods §3.4)."""

from __future__ import annotations

import ctypes
import itertools
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.cuhlm.bounds import (
    beta_hat,
    online_bound_denominator,
    online_k,
    provable_bound,
    reconstruction_errors_all_k,
    softplus,
)
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.distortion import output_distortion_grid
from edgespec.cuhlm.kcurves import BoundCurves, dense_bound_curves
from edgespec.cuhlm.kselect import (
    InfeasibleBudgetError,
    _stdout_fd_silenced,
    k_table,
    optimize_k_star,
)
from edgespec.decoding.compression import (
    reconstruct_topk,
    resampling_distortion,
    topk_mass_and_error,
)
from edgespec.decoding.sampling import rejection_probability
from edgespec.wireless.payload import upload_bits

FIT = LinearFit(a=0.8, b=-0.05, r2=float("nan"), pearson_r=float("nan"), n=0)
LATENCY = {
    "draft_s": 0.01,
    "uncertainty_s": 0.001,
    "target_s": 0.05,
    "rtt_s": 0.02,
    "mean_uplink_rate_bps": 1e6,
    "prob_bits": 8,
    "vocab_size": 64,
}


def random_distributions(batch, vocab, seed, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, vocab, generator=gen, dtype=torch.float64)
    return torch.softmax(logits, dim=-1)


def brute_force_errors(probs):
    vocab = probs.shape[-1]
    return torch.stack(
        [(probs - reconstruct_topk(probs, k)).abs().sum(-1) for k in range(1, vocab + 1)], dim=1
    )


def test_softplus_values():
    assert softplus(-1.0) == pytest.approx(0.313261687518)
    assert softplus(0.0) == pytest.approx(math.log(2))
    assert softplus(1.0, eta=2.0) == pytest.approx(math.log1p(math.exp(2)) / 2)
    assert softplus(800.0) == pytest.approx(800.0)  # no overflow
    z = torch.tensor([-3.0, 0.0, 2.0], dtype=torch.float64)
    assert softplus(z).numpy() == pytest.approx(softplus(z.numpy()))
    assert online_bound_denominator(0.0, 1.0) == pytest.approx(softplus(-1.0))
    assert online_bound_denominator(1.0, 0.0) == pytest.approx(math.log(2))
    assert beta_hat(np.array([0.0, 0.5, 2.0]), FIT) == pytest.approx([0.0, 0.35, 1.0])


def test_reconstruction_errors_match_brute_force():
    probs = random_distributions(6, 40, seed=0)
    ties = torch.tensor([[0.25, 0.25, 0.125, 0.125, 0.125, 0.125] + [0.0] * 4])
    more_ties = torch.tensor([[0.4] * 2 + [0.05] * 4 + [0.0] * 4])
    ties = torch.cat([ties, torch.full((1, 10), 0.1), more_ties])
    one_hot = torch.nn.functional.one_hot(torch.tensor([3]), 10).double()
    for case in (probs, ties.double(), one_hot, random_distributions(3, 10, seed=1, scale=0.0)):
        got = reconstruction_errors_all_k(case)
        assert got.shape == case.shape and got.dtype == torch.float64
        torch.testing.assert_close(got, brute_force_errors(case), atol=1e-12, rtol=0)
        assert (got[:, -1] == 0).all()
    assert (reconstruction_errors_all_k(one_hot) == 0).all()
    # agrees with the grid version in compression.py
    grid = [1, 2, 5, 17, 39, 40]
    _, grid_errors = topk_mass_and_error(probs, grid)
    all_k = reconstruction_errors_all_k(probs)
    torch.testing.assert_close(all_k[:, [k - 1 for k in grid]], grid_errors, atol=1e-12, rtol=0)


def test_reconstruction_errors_float32_input():
    probs = random_distributions(4, 30, seed=2).float()
    expected = brute_force_errors(probs.double())
    torch.testing.assert_close(reconstruction_errors_all_k(probs), expected, atol=1e-6, rtol=0)


def brute_force_online_k(probs, tokens, u, fit, theta, k_max=None):
    vocab = probs.shape[1]
    cap = vocab if k_max is None else k_max
    out = []
    for row in range(probs.shape[0]):
        x = probs[row : row + 1]
        x_d = float(x[0, tokens[row]])
        b = min(1.0, max(0.0, fit.a * float(u[row]) + fit.b))
        den = (1 - x_d) * math.log1p(math.exp(-1)) + x_d * math.log1p(math.exp(-b))
        chosen = cap
        for k in range(1, cap + 1):
            if float((x - reconstruct_topk(x, k)).abs().sum()) / den <= theta:
                chosen = k
                break
        out.append(chosen)
    return torch.tensor(out)


@pytest.mark.parametrize("theta, k_max", [(0.1, None), (0.02, None), (0.3, None), (0.02, 5)])
def test_online_k_matches_brute_force(theta, k_max):
    probs = random_distributions(12, 32, seed=4, scale=2.5)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    u = torch.randint(0, 21, (12,), generator=gen) / 20
    got = online_k(probs, tokens, u, FIT, theta, k_max=k_max)
    assert got.dtype == torch.long
    assert torch.equal(got, brute_force_online_k(probs, tokens, u, FIT, theta, k_max))


def test_online_k_more_uncertain_tokens_send_more():
    probs = random_distributions(1, 32, seed=6).expand(2, 32)
    tokens = probs[0].argmax().expand(2)
    k = online_k(probs, tokens, torch.tensor([0.0, 1.0]), FIT, 0.05)
    assert k[0] <= k[1]
    assert online_k(torch.full((1, 8), 1 / 8), torch.tensor([0]), 0.5, FIT, 0.0).item() == 1


def test_provable_bound_holds_on_random_pairs():
    grid = [1, 2, 4, 8, 16, 31, 32]
    x = random_distributions(200, 32, seed=7, scale=2.0)
    y = random_distributions(200, 32, seed=8, scale=2.0)
    y = torch.where(torch.arange(200).unsqueeze(1) % 3 == 0, 0.7 * x + 0.3 * y, y)  # close pairs
    tokens = torch.multinomial(x, 1, generator=torch.Generator().manual_seed(9)).squeeze(1)
    beta = rejection_probability(tokens, x, y)
    x_d = x.gather(1, tokens.unsqueeze(1)).squeeze(1)
    tvd = resampling_distortion(x, y, grid)
    _, nk = topk_mass_and_error(x, grid)
    bound = provable_bound(nk, x_d.unsqueeze(1), beta.unsqueeze(1))
    assert (tvd <= bound + 1e-9).all()
    as_numpy = provable_bound(nk.numpy(), x_d.numpy()[:, None], beta.numpy()[:, None])
    np.testing.assert_allclose(as_numpy, bound.numpy())
    assert provable_bound(0.0, 0.5, 0.0) == 0.0
    assert provable_bound(0.1, 0.5, 0.0) == math.inf
    assert provable_bound(0.1, 0.5, 0.4) == pytest.approx(0.5)


def synthetic_trace(n=240, vocab=64, seed=11, with_probs=False):
    """A standard-HLM calibration trace with every token transmitted (columns as the engine's);
    with ``with_probs`` also the draft distributions x [n, V] of its tokens."""
    grid = [1, 2, 4, 8, 16, 32, 64]
    gen = torch.Generator().manual_seed(seed)
    scale = 1.0 + 4.0 * torch.rand(n, 1, generator=gen, dtype=torch.float64)
    logits = scale * torch.randn(n, vocab, generator=gen, dtype=torch.float64)
    x = torch.softmax(logits, -1)
    y = torch.softmax(logits + torch.randn(n, vocab, generator=gen, dtype=torch.float64), -1)
    tokens = torch.multinomial(x, 1, generator=gen).squeeze(1)
    beta = rejection_probability(tokens, x, y)
    noisy = beta + 0.15 * torch.randn(n, generator=gen, dtype=torch.float64)
    u = (noisy.clamp(0, 1) * 20).round() / 20
    mass, nk = topk_mass_and_error(x, grid)
    tvd = resampling_distortion(x, y, grid)
    otvd = output_distortion_grid(x, y, grid)
    x_d = x.gather(1, tokens.unsqueeze(1)).squeeze(1)
    y_d = y.gather(1, tokens.unsqueeze(1)).squeeze(1)
    frame = {
        "u": u.numpy(),
        "beta": beta.numpy(),
        "x_d": x_d.numpy(),
        "y_d": y_d.numpy(),
        "draft_is_target_argmax": (tokens == y.argmax(-1)).numpy(),
    }
    for i, k in enumerate(grid):
        frame[f"nk_{k}"] = nk[:, i].numpy()
        frame[f"tvd_{k}"] = tvd[:, i].numpy()
        frame[f"otvd_{k}"] = otvd[:, i].numpy()
        frame[f"mass_{k}"] = mass[:, i].numpy()
    if with_probs:
        return pd.DataFrame(frame), grid, x
    return pd.DataFrame(frame), grid


def brute_force_k_star(trace, grid, fit, theta, latency, thresholds, risk_budget=None, nk=None):
    """Enumerate (k, u_th) pairs; ties go to the smallest u_th, then the smallest k. ``nk``
    [n, len(grid)] replaces the trace's ``nk_{k}`` columns (e.g. every k)."""
    index_bits = math.ceil(math.log2(latency["vocab_size"]))
    if nk is None:
        nk = trace[[f"nk_{k}" for k in grid]].to_numpy()
    b_all = np.clip(fit.a * trace["u"] + fit.b, 0, 1).to_numpy()
    den_all = (1 - trace["x_d"].to_numpy()) * np.log1p(np.exp(-1)) + trace[
        "x_d"
    ].to_numpy() * np.log1p(np.exp(-b_all))
    best = None
    for th, (i, k) in itertools.product(thresholds, enumerate(grid)):
        sent = np.ones(len(trace), bool) if th is None else (trace["u"] > th).to_numpy()
        skipped = ~sent
        if (
            risk_budget is not None
            and skipped.any()
            and trace["beta"][skipped].mean() > risk_budget
        ):
            continue
        if sent.any() and (nk[sent, i] / den_all[sent]).mean() > theta:
            continue
        p_tx = sent.mean()
        bits = k * (latency["prob_bits"] + index_bits)
        cost = (
            latency["draft_s"]
            + latency["uncertainty_s"]
            + p_tx
            * (bits / latency["mean_uplink_rate_bps"] + latency["target_s"] + latency["rtt_s"])
        )
        if best is None or cost < best[0] - 1e-15:
            best = (cost, k, th)
    return best


def mean_online_bounds(trace, grid, fit):
    b = np.clip(fit.a * trace["u"] + fit.b, 0, 1)
    den = (1 - trace["x_d"]) * np.log1p(np.exp(-1)) + trace["x_d"] * np.log1p(np.exp(-b))
    return np.array([(trace[f"nk_{k}"] / den).mean() for k in grid])


def curves_of(trace, grid, vocab_size=None):
    return BoundCurves.from_trace(trace, grid, FIT, vocab_size=vocab_size)


@pytest.fixture(scope="module")
def trace_and_grid():
    return synthetic_trace()


@pytest.fixture(scope="module")
def trace_with_probs():
    return synthetic_trace(with_probs=True)


@pytest.mark.parametrize("u_th", [None, 0.1, 0.35])
def test_k_star_fixed_threshold_matches_enumeration(trace_and_grid, u_th):
    trace, grid = trace_and_grid
    bounds = mean_online_bounds(trace, grid, FIT)
    thetas = [bounds[i] * 1.01 for i in (1, 3, 5)] + [0.5 * (bounds[2] + bounds[3]), 1e9]
    curves = curves_of(trace, grid)
    for theta in thetas:
        solution = optimize_k_star(curves, theta, LATENCY, u_th=u_th)
        cost, k, th = brute_force_k_star(trace, grid, FIT, theta, LATENCY, [u_th])
        assert (solution.k_star, solution.u_th) == (k, th)
        assert solution.objective_s == pytest.approx(cost, rel=1e-12)
        assert solution.status == "optimal" and solution.solver == "HIGHS"
        assert solution.slack["tvd"] >= -1e-9 and "risk" not in solution.slack
    table = k_table(trace, grid, FIT, u_th, theta, LATENCY, solution.k_star)
    assert table["k"].tolist() == grid
    assert table["chosen"].sum() == 1 and table.loc[table["chosen"], "k"].item() == k
    assert (table["provable_bound_holds_fraction"] == 1.0).all()
    assert table["payload_bits"].tolist() == [upload_bits(k, 64) for k in grid]
    assert table["expected_latency_s"].is_monotonic_increasing
    assert table.loc[table["k"] == 64, "mean_measured_tvd"].item() == pytest.approx(0, abs=1e-12)
    assert table.loc[table["k"] == 64, "mean_output_tvd"].item() == pytest.approx(0, abs=1e-12)
    sent = trace if u_th is None else trace[trace["u"] > u_th]
    np.testing.assert_allclose(
        table["mean_output_tvd"], [sent[f"otvd_{k}"].mean() for k in grid], rtol=1e-12
    )
    assert table["online_bound_holds_output_fraction"].between(0, 1).all()


@pytest.mark.parametrize("rate_bps", [1e3, 1e6])
@pytest.mark.parametrize("risk_budget", [0.02, 0.08, 0.2])
def test_k_star_joint_matches_enumeration(trace_and_grid, risk_budget, rate_bps):
    """At 1 kbit/s the payload dominates and tight TVD budgets pull u_th below the risk limit
    (transmitting low-u tokens lowers the average bound); at 1 Mbit/s the risk budget binds."""
    trace, grid = trace_and_grid
    latency = dict(LATENCY, mean_uplink_rate_bps=rate_bps)
    u_grid = [-1.0, 0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.42, 0.5, 0.7]
    bounds = mean_online_bounds(trace, grid, FIT)
    curves = curves_of(trace, grid)
    # A budget exactly at a pair's mean bound is a tie that summation order decides (the
    # enumeration's pandas mean and the curves' sums differ by an ulp on some CPUs), so each
    # budget sits a relative 1e-12 above it: the pair is feasible for both.
    at_bounds = [bounds[1], bounds[3], 0.5 * (bounds[2] + bounds[3]), bounds[4], bounds[5]]
    for theta in [b * (1 + 1e-12) for b in at_bounds]:
        solution = optimize_k_star(
            curves, theta, latency, u_th_grid=u_grid, risk_budget=risk_budget
        )
        cost, k, th = brute_force_k_star(trace, grid, FIT, theta, latency, u_grid, risk_budget)
        assert (solution.k_star, solution.u_th) == (k, th)
        assert solution.objective_s == pytest.approx(cost, rel=1e-12)
        assert solution.slack["risk"] >= -1e-9 and solution.slack["tvd"] >= -1e-9


def test_dense_curves_agree_with_the_grid_and_cover_every_k(trace_with_probs):
    """Curves from the distributions themselves (every k) equal the trace's at grid k, never
    increase with k, and the programme over every k equals enumeration over every k."""
    trace, grid, x = trace_with_probs
    chunks = [x[:100], x[100:101], x[101:]]  # rows arrive prompt by prompt
    dense = dense_bound_curves(chunks, trace["u"], trace["x_d"], trace["beta"], FIT)
    on_grid = curves_of(trace, grid)
    assert dense.k_values.tolist() == list(range(1, 65)) and dense.vocab_size == 64
    np.testing.assert_array_equal(dense.u_values, on_grid.u_values)
    np.testing.assert_array_equal(dense.counts, on_grid.counts)
    np.testing.assert_allclose(
        dense.bound_sums[:, np.asarray(grid) - 1], on_grid.bound_sums, rtol=1e-9
    )
    for th in (None, 0.1, 0.3):
        assert np.all(np.diff(dense.mean_bound(th)) <= 1e-12)
    nk_every = reconstruction_errors_all_k(x).numpy()
    every_k = list(range(1, 65))
    bounds = dense.mean_bound(0.1)
    # theta between two consecutive k that are not on the grid
    theta = 0.5 * (bounds[10] + bounds[11])
    solution = optimize_k_star(dense, theta, LATENCY, u_th=0.1)
    cost, k, _ = brute_force_k_star(trace, every_k, FIT, theta, LATENCY, [0.1], nk=nk_every)
    assert solution.k_star == k == 12 and 12 not in grid
    assert solution.objective_s == pytest.approx(cost, rel=1e-12)
    u_grid = [-1.0, 0.0, 0.1, 0.2, 0.3, 0.5]
    for rate in (1e3, 1e5, 1e7):
        latency = dict(LATENCY, mean_uplink_rate_bps=rate)
        joint = optimize_k_star(dense, theta, latency, u_th_grid=u_grid, risk_budget=0.1)
        cost, k, th = brute_force_k_star(
            trace, every_k, FIT, theta, latency, u_grid, 0.1, nk=nk_every
        )
        assert (joint.k_star, joint.u_th) == (k, th)
        assert joint.objective_s == pytest.approx(cost, rel=1e-12)
    with pytest.raises(ValueError, match="rows"):
        dense_bound_curves([x[:10]], trace["u"], trace["x_d"], trace["beta"], FIT)


def test_joint_k_star_moves_with_the_rate_but_the_fixed_threshold_one_does_not(trace_with_probs):
    """With a fixed threshold the objective only grows with k, so k* is the smallest k within
    theta_tv at every rate (the paper's offline rule). The joint programme trades skipping
    against payload: at a slow uplink it transmits the cheap low-u tokens too (they lower the
    mean bound, so fewer entries suffice), at a fast one it skips as much as the risk budget
    allows and pays more entries on the rest; k* moves with the rate."""
    trace, _, x = trace_with_probs
    dense = dense_bound_curves([x], trace["u"], trace["x_d"], trace["beta"], FIT)
    nk_every = reconstruction_errors_all_k(x).numpy()
    theta = float(dense.mean_bound(None)[3])
    u_grid = [-1.0, *dense.u_values.tolist()]
    rates = [1e2, 1e3, 1e4, 1e6, 1e9, 1e12]
    fixed, joint = [], []
    for rate in rates:
        latency = dict(LATENCY, mean_uplink_rate_bps=rate)
        fixed.append(optimize_k_star(dense, theta, latency, u_th=0.2).k_star)
        solution = optimize_k_star(dense, theta, latency, u_th_grid=u_grid, risk_budget=0.05)
        joint.append((solution.k_star, solution.u_th))
        _, k, th = brute_force_k_star(
            trace, list(range(1, 65)), FIT, theta, latency, u_grid, 0.05, nk=nk_every
        )
        assert joint[-1] == (k, th), rate
    assert len(set(fixed)) == 1
    (k_slow, u_slow), (k_fast, u_fast) = joint[0], joint[-1]
    assert k_slow < k_fast and u_slow < u_fast, joint


@pytest.mark.parametrize(("index", "rate"), [(5, 1e7), (7, 1e7), (10, 1e9)])
def test_microsecond_differences_still_decide_k_star(trace_with_probs, index, rate):
    """At fast uplinks neighbouring k differ in E[tau] by well under a microsecond, below the
    solver's tolerances; the programme must still return the cheapest pair (enumeration)."""
    trace, _, x = trace_with_probs
    dense = dense_bound_curves([x], trace["u"], trace["x_d"], trace["beta"], FIT)
    nk_every = reconstruction_errors_all_k(x).numpy()
    theta = float(dense.mean_bound(None)[index])
    u_grid = [-1.0, *dense.u_values.tolist()]
    latency = dict(LATENCY, mean_uplink_rate_bps=rate)
    solution = optimize_k_star(dense, theta, latency, u_th_grid=u_grid, risk_budget=0.1)
    cost, k, th = brute_force_k_star(
        trace, list(range(1, 65)), FIT, theta, latency, u_grid, 0.1, nk=nk_every
    )
    assert (solution.k_star, solution.u_th) == (k, th)
    assert solution.objective_s == pytest.approx(cost, rel=1e-12)


def small_trace():
    """Six tokens, k grid [1, 2]; the u = 0 tokens carry most of the reconstruction error."""
    return pd.DataFrame(
        {
            "u": [0.0, 0.0, 0.5, 0.5, 1.0, 1.0],
            "beta": [0.1, 0.0, 0.3, 0.2, 0.8, 0.6],
            "x_d": [0.5] * 6,
            "nk_1": [0.9, 0.9, 0.2, 0.2, 0.2, 0.2],
            "nk_2": [0.6, 0.6, 0.05, 0.05, 0.05, 0.05],
            "tvd_1": [0.1] * 6,
            "tvd_2": [0.05] * 6,
        }
    )


def test_infeasible_budgets_name_the_binding_constraint():
    trace, grid = small_trace(), [1, 2]
    latency = dict(LATENCY, vocab_size=8)
    curves = curves_of(trace, grid, vocab_size=8)
    with pytest.raises(InfeasibleBudgetError, match="theta_tv=0.01") as info:
        optimize_k_star(curves, 0.01, latency)
    assert info.value.constraint == "tvd" and "k=2" in str(info.value)
    joint = dict(u_th_grid=[0.0, 0.5])
    with pytest.raises(InfeasibleBudgetError, match="risk budget 0.01") as info:
        optimize_k_star(curves, 10.0, latency, risk_budget=0.01, **joint)
    assert info.value.constraint == "risk"
    with pytest.raises(InfeasibleBudgetError) as info:
        optimize_k_star(curves, 0.01, latency, risk_budget=0.01, **joint)
    assert info.value.constraint == "tvd+risk"
    with pytest.raises(InfeasibleBudgetError, match="risk budget") as info:
        optimize_k_star(curves, 10.0, latency, u_th=0.5, risk_budget=0.1)
    assert info.value.constraint == "risk"
    # Skipping nothing meets the risk budget but transmits the costly u = 0 tokens (mean bound
    # at k=2 about 0.48, 0.13 without them); skipping them meets the TVD budget but not the
    # risk budget.
    bounds = mean_online_bounds(trace, grid, FIT)
    assert bounds[1] > 0.3
    with pytest.raises(InfeasibleBudgetError, match="conflict") as info:
        optimize_k_star(curves, 0.3, latency, u_th_grid=[-1.0, 0.0], risk_budget=0.01)
    assert info.value.constraint == "joint"
    # ...and with a looser risk budget the same programme is feasible, skipping the u = 0 tokens
    solution = optimize_k_star(curves, 0.3, latency, u_th_grid=[-1.0, 0.0], risk_budget=0.06)
    assert (solution.k_star, solution.u_th) == (2, 0.0)


def test_invalid_arguments():
    trace, grid = small_trace(), [1, 2]
    latency = dict(LATENCY, vocab_size=8)
    curves = curves_of(trace, grid, vocab_size=8)
    with pytest.raises(ValueError, match="risk_budget"):
        optimize_k_star(curves, 0.5, latency, u_th_grid=[0.0])
    with pytest.raises(KeyError, match="nk_4"):
        curves_of(trace, [1, 4], vocab_size=8)
    with pytest.raises(ValueError, match="latency"):
        optimize_k_star(curves, 0.5, {"draft_s": 0.0})
    with pytest.raises(ValueError, match="vocab_size"):
        optimize_k_star(curves, 0.5, dict(LATENCY, vocab_size=16))


def test_skipping_everything_picks_the_smallest_k():
    trace, grid = small_trace(), [1, 2]
    curves = curves_of(trace, grid, vocab_size=8)
    solution = optimize_k_star(
        curves, 0.0, dict(LATENCY, vocab_size=8), u_th_grid=[1.0], risk_budget=1.0
    )
    assert (solution.k_star, solution.u_th) == (1, 1.0)
    assert solution.objective_s == pytest.approx(LATENCY["draft_s"] + LATENCY["uncertainty_s"])
    table = k_table(trace, grid, FIT, 1.0, 0.0, dict(LATENCY, vocab_size=8), 1)
    assert table["mean_online_bound"].isna().all()


def test_topk_extraction_is_charged_in_the_objective(trace_and_grid):
    """The device's top-k extraction enters E[tau] per transmitted token (none at k = |V|)."""
    trace, grid = trace_and_grid
    curves = curves_of(trace, grid)
    plain = optimize_k_star(curves, 1e9, LATENCY)
    costly = optimize_k_star(curves, 1e9, dict(LATENCY, topk_s={1: 0.25}))
    assert plain.k_star == costly.k_star == 1
    assert costly.objective_s - plain.objective_s == pytest.approx(0.25)


def test_highs_banner_does_not_reach_stdout(capfd):
    """The solve runs with fd 1 on /dev/null: raw and buffered C-level writes (HiGHS prints its
    banner from C++, once per process) are dropped, and stdout works again afterwards."""
    with _stdout_fd_silenced():
        os.write(1, b"raw fd banner\n")
        ctypes.CDLL(None).printf(b"buffered C banner\n")
    print("after")
    trace, grid = small_trace(), [1, 2]
    optimize_k_star(curves_of(trace, grid, vocab_size=8), 10.0, dict(LATENCY, vocab_size=8))
    print("k_star done")
    assert capfd.readouterr().out == "after\nk_star done\n"


def test_saved_curves_give_the_same_joint_solutions_per_channel(trace_with_probs, tmp_path):
    """optimize_k saves the dense curves; rule joint_kstar re-solves the joint programme per
    channel from them (no replay): the reference channel's row must equal kstar.json's joint."""
    from edgespec.cuhlm.joint import joint_row, latency_inputs, solve_joint
    from edgespec.cuhlm.kcurves import load_curves, save_curves
    from edgespec.wireless.channel import ChannelCondition, ergodic_rate_bps
    from edgespec.wireless.delay import LatencyProfile

    trace, _, x = trace_with_probs
    dense = dense_bound_curves([x], trace["u"], trace["x_d"], trace["beta"], FIT)
    save_curves(dense, tmp_path / "curves.npz")
    loaded = load_curves(tmp_path / "curves.npz")
    for name in ("k_values", "u_values", "counts", "beta_sums", "bound_sums"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(dense, name))
    assert loaded.vocab_size == dense.vocab_size == 64
    profile = LatencyProfile(
        draft_token_s=0.01, target_token_s=0.05, target_verify_s={1: 0.05}, uncertainty_s=0.001
    )
    theta = float(dense.mean_bound(None)[3])
    solutions = []
    for snr in (-10.0, 10.0, 40.0):
        condition = ChannelCondition(
            name=f"c{snr:g}", fading="rayleigh", bandwidth_hz=1e5, snr_db=snr, rtt_s=0.02
        )
        latency = latency_inputs(profile, condition, 8, dense.vocab_size)
        assert latency["mean_uplink_rate_bps"] == ergodic_rate_bps(condition)
        assert latency["rtt_s"] == 0.02 and latency["vocab_size"] == 64
        original = solve_joint(dense, theta, latency, 0.05)
        again = solve_joint(loaded, theta, latency, 0.05)
        assert (again.k_star, again.u_th, again.objective_s) == (
            original.k_star,
            original.u_th,
            original.objective_s,
        )
        _, k, th = brute_force_k_star(
            trace,
            list(range(1, 65)),
            FIT,
            theta,
            latency,
            [-1.0, *dense.u_values.tolist()],
            0.05,
            nk=reconstruction_errors_all_k(x).numpy(),
        )
        assert (again.k_star, again.u_th) == (k, th)
        row = joint_row(condition.name, condition, again, decoded=snr == 10.0)
        assert row["skip_fraction"] == pytest.approx(1.0 - again.p_tx)
        solutions.append(row)
    assert [r["decoded"] for r in solutions] == [False, True, False]
    with pytest.raises(ValueError, match="not a bound-curves file"):
        np.savez(tmp_path / "other.npz", k_values=np.arange(3))
        load_curves(tmp_path / "other.npz")


def test_the_k_table_says_how_often_each_bound_holds_for_the_output():
    """Two transmitted tokens whose residual TVD lies below both bounds and whose output TVD
    lies above them: every bound holds for the residual (fraction 1) and for the output never
    (fraction 0); computing the output fraction against TVD(r, r_hat) would read 1."""
    u, beta, x_d, nk = np.array([0.5, 0.6]), np.array([0.5, 0.5]), np.array([0.5, 0.5]), 0.01
    online = nk / online_bound_denominator(x_d, beta_hat(u, FIT))
    provable = nk / (x_d * beta)  # 0.04
    low = 0.5 * np.minimum(online, provable)
    high = 2.0 * np.maximum(online, provable)
    trace = pd.DataFrame(
        {"u": u, "beta": beta, "x_d": x_d, "nk_1": nk, "tvd_1": low, "otvd_1": high}
    )
    table = k_table(trace, [1], FIT, None, 0.1, dict(LATENCY, vocab_size=8)).iloc[0]
    assert table["online_bound_holds_fraction"] == table["provable_bound_holds_fraction"] == 1.0
    assert table["online_bound_holds_output_fraction"] == 0.0
    assert table["provable_bound_holds_output_fraction"] == 0.0
    assert table["mean_output_tvd"] == pytest.approx(high.mean())
    assert table["mean_measured_tvd"] == pytest.approx(low.mean())
