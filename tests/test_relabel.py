"""Channel-aware relabeling (methods §4.2): exactness, monotonicity in the channel, budget."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from edgespec.wisv.relabel import (
    RelabelError,
    csi_feature_columns,
    relabel_mismatches,
    relabel_over_csi,
    repair_cost_s,
    safe_fraction_by_channel,
)


def objective(z, risk, cost, lam):
    return z.sum() * cost + lam * ((1 - z) * risk).sum()


def brute_force(risk, cost, lam, budget):
    """Exhaustive optimum over {0,1}^J: (best objective, all optimal z)."""
    best, argbest = np.inf, []
    for bits in itertools.product((0, 1), repeat=len(risk)):
        z = np.array(bits, dtype=float)
        if budget is not None and ((1 - z) * risk).sum() > budget * len(risk) + 1e-12:
            continue
        value = objective(z, risk, cost, lam)
        if value < best - 1e-12:
            best, argbest = value, [z.astype(bool)]
        elif abs(value - best) <= 1e-12:
            argbest.append(z.astype(bool))
    return best, argbest


@pytest.mark.parametrize("solver", ["HIGHS", "SCIPY"])
def test_matches_brute_force(solver):
    rng = np.random.default_rng(3)
    for trial in range(12):
        num = int(rng.integers(1, 8))
        risk = rng.random(num)
        cost = float(rng.uniform(0.01, 0.5))
        lam = float(rng.uniform(0.0, 1.0))
        budget = None if trial % 3 == 0 else float(rng.uniform(0.0, 0.4))
        z = relabel_mismatches(risk, cost, lam, budget, solver=solver)
        best, argbest = brute_force(risk, cost, lam, budget)
        assert z.dtype == bool and z.shape == (num,)
        assert objective(z.astype(float), risk, cost, lam) == pytest.approx(best, abs=1e-9)
        assert any(np.array_equal(z, cand) for cand in argbest)


def test_no_budget_is_the_per_item_rule():
    risk = np.array([0.05, 0.2, 0.4, 0.9])
    # lam = 1 s per unit risk, C_rep = 0.3 s: repair iff r > 0.3.
    z = relabel_mismatches(risk, 0.3, 1.0, None)
    np.testing.assert_array_equal(z, [False, False, True, True])


def test_budget_forces_repairs_of_the_riskiest():
    risk = np.array([0.1, 0.5, 0.3, 0.2])
    # Skipping is nearly free (lam small against C_rep), so only the budget forces repairs.
    # Mean skipped risk <= 0.1 means total skipped <= 0.4: two repairs are needed, and the
    # two riskiest leave the least risk skipped (0.3).
    z = relabel_mismatches(risk, 1.0, 0.01, 0.1)
    np.testing.assert_array_equal(z, [False, True, True, False])
    assert risk[~z].sum() <= 0.1 * len(risk)


@pytest.mark.parametrize("budget", [None, 0.15])
def test_worse_channel_never_makes_fewer_safe(budget):
    rng = np.random.default_rng(11)
    risk = rng.random(12)
    costs = np.linspace(0.0, 1.2, 25)
    safe_sets = [~relabel_mismatches(risk, c, 1.0, budget) for c in costs]
    counts = [s.sum() for s in safe_sets]
    assert all(a <= b for a, b in zip(counts, counts[1:], strict=False))
    # Stronger: what is safe under a better channel stays safe under a worse one.
    for better, worse in zip(safe_sets, safe_sets[1:], strict=False):
        assert not np.any(better & ~worse)
    assert counts[0] < counts[-1]  # the sweep actually moves the labels
    if budget is not None:
        assert all(risk[s].sum() <= budget * len(risk) + 1e-9 for s in safe_sets)


def test_infeasible_budget_raises_naming_it():
    with pytest.raises(RelabelError, match="risk_budget"):
        relabel_mismatches(np.array([0.2, 0.4]), 0.1, 1.0, -0.1)


def test_invalid_inputs():
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2, 1.5]), 0.1, 1.0, None)
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2]), -0.1, 1.0, None)
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2]), 0.1, -1.0, None)
    assert relabel_mismatches(np.array([]), 0.1, 1.0, 0.1).shape == (0,)


def test_repair_cost_formula():
    cost = repair_cost_s(
        rate_bps=1e6,
        rtt_s=0.02,
        gamma=4,
        draft_token_s=0.01,
        target_verify_s=0.05,
        uplink_bits=2e5,
    )
    assert cost == pytest.approx(4 * 0.01 + 0.2 + 0.05 + 0.02)
    with pytest.raises(RelabelError):
        repair_cost_s(0.0, 0.02, 4, 0.01, 0.05, 2e5)
    with pytest.raises(RelabelError):
        repair_cost_s(1e6, 0.02, 0, 0.01, 0.05, 2e5)


def _mismatches():
    rng = np.random.default_rng(5)
    risk = np.round(rng.random(10), 3)
    return pd.DataFrame(
        {
            "prompt_id": ["a"] * 4 + ["b"] * 6,
            "risk": risk,
            "label": (risk > 0.5).astype(int),
        },
        index=np.arange(100, 110),
    )


def _csi(costs):
    return [
        {"features": {"snr_db": 30.0 - 10 * i, "rate_mbps": 100.0 / (i + 1)}, "repair_cost_s": c}
        for i, c in enumerate(costs)
    ]


def test_relabel_over_csi_rows_and_groups():
    mism = _mismatches()
    costs = [0.1, 0.4, 0.8]
    out = relabel_over_csi(mism, _csi(costs), lam=1.0, risk_budget=0.3)
    assert len(out) == len(mism) * len(costs)
    assert csi_feature_columns(out) == ["phi_snr_db", "phi_rate_mbps"]
    assert set(out["label_csi"]) <= {0, 1}
    for sample_id, cost in enumerate(costs):
        rows = out[out["csi_sample"] == sample_id]
        assert list(rows["mismatch"]) == list(mism.index)
        assert (rows["repair_cost_s"] == cost).all()
        assert (rows["phi_snr_db"] == 30.0 - 10 * sample_id).all()
        # Each prompt group is one optimisation with its own budget.
        for _, pos in mism.groupby("prompt_id").indices.items():
            expected = relabel_mismatches(mism["risk"].to_numpy()[pos], cost, 1.0, 0.3)
            np.testing.assert_array_equal(rows["label_csi"].to_numpy()[pos], expected)
    np.testing.assert_array_equal(out["label"].to_numpy()[: len(mism)], mism["label"])


def test_safe_fraction_rises_with_repair_cost():
    mism = _mismatches()
    costs = [0.8, 0.05, 0.4, 0.2]  # deliberately unsorted
    table = safe_fraction_by_channel(relabel_over_csi(mism, _csi(costs), 1.0, None))
    assert list(table["repair_cost_s"]) == sorted(costs)
    assert (table["n_mismatches"] == len(mism)).all()
    assert table["safe_fraction"].is_monotonic_increasing
    assert table["safe_fraction"].iloc[0] < table["safe_fraction"].iloc[-1]
    assert {"phi_snr_db", "phi_rate_mbps", "skipped_risk_mean"} <= set(table.columns)


def test_relabel_over_csi_errors():
    mism = _mismatches()
    with pytest.raises(RelabelError, match="risk_budget"):
        relabel_over_csi(mism, _csi([0.1]), 1.0, -0.5)
    with pytest.raises(RelabelError):
        relabel_over_csi(mism, [{"features": {"snr_db": 1.0}}], 1.0, None)
    bad = _csi([0.1, 0.2])
    bad[1]["features"] = {"snr_db": 1.0}
    with pytest.raises(RelabelError):
        relabel_over_csi(mism, bad, 1.0, None)
