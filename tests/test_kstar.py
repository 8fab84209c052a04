"""The offline k* stage (rule optimize_k): trace order, the replay check and the choice of k* on
a case small enough to work out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.kcurves import dense_bound_curves
from edgespec.cuhlm.kstar import (
    REPLAY_MAX_MEAN_ABS_DIFF,
    choose_k,
    ordered_trace,
    replay_completions,
    replayed_curves,
    trace_k_grid,
)
from edgespec.data.records import PromptRecord
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

# Two one-token prompts over |V| = 4, the draft token the most likely one (x_d = x[0]).
# Top-k reconstruction keeps the k largest entries and spreads the rest evenly, so
# N_k(A) = ||x_A - x_hat_k||_1 = 0.2, 0.1, 0, 0 for k = 1..4 and N_k(B) = 0 for every k.
X_A = [0.4, 0.3, 0.2, 0.1]
X_B = [0.7, 0.1, 0.1, 0.1]
SOFTPLUS_M1, SOFTPLUS_0 = math.log1p(math.exp(-1)), math.log(2)
# With beta_hat = 0 (fit a = b = 0) the online bound's denominator is
# (1 - x_d) softplus(-1) + x_d softplus(0).
BOUND_A = np.array([0.2, 0.1, 0.0, 0.0]) / (0.6 * SOFTPLUS_M1 + 0.4 * SOFTPLUS_0)
FIT = {"a": 0.0, "b": 0.0, "r2": math.nan, "pearson_r": math.nan, "n": 2}
PROFILE = LatencyProfile(draft_token_s=0.01, target_token_s=0.02, uncertainty_s=0.001)
REFERENCE = ChannelCondition(name="ref", fading="awgn", bandwidth_hz=1e6, snr_db=10.0)
CUHLM = {"prob_bits": 8, "theta_tv": 0.25, "risk_budget": 0.1, "kstar_channel": "ref"}


def _trace(grid=(1, 2, 4)) -> pd.DataFrame:
    """Prompt B's row first: ordered_trace puts prompts in order of first appearance."""
    rows = [
        {"prompt_id": "b", "position": 0, "u": 0.1, "beta": 0.05, "x_d": 0.7},
        {"prompt_id": "a", "position": 0, "u": 0.5, "beta": 0.3, "x_d": 0.4},
    ]
    frame = pd.DataFrame(rows).assign(draft_token=0, committed_token=[11, 12])
    for k in grid:
        frame[f"nk_{k}"] = [0.0, [0.2, 0.1, 0.0, 0.0][k - 1] if k <= 4 else 0.0]
        frame[f"tvd_{k}"] = 0.0
    return frame


def _fit() -> LinearFit:
    return LinearFit.from_record(FIT)


def _probs(*rows):
    return [torch.tensor([row], dtype=torch.float64) for row in rows]


def test_trace_order_and_replayed_completions():
    trace = pd.DataFrame(
        {
            "prompt_id": ["q", "p", "q", "p"],
            "position": [1, 0, 0, 1],
            "committed_token": [5, 6, 7, 8],
            "nk_4": 0.0,
            "nk_1": 0.0,
        }
    )
    ordered = ordered_trace(trace)
    assert list(zip(ordered["prompt_id"], ordered["position"], strict=True)) == [
        ("q", 0),
        ("q", 1),
        ("p", 0),
        ("p", 1),
    ]
    assert trace_k_grid(ordered) == [1, 4]
    records = [
        PromptRecord(i, f"prompt {i}", None, None, "chat", "constructed", "calib")
        for i in ("p", "q", "r")
    ]
    ordered_records, completions = replay_completions(ordered, records)
    assert [r.id for r in ordered_records] == ["q", "p"]
    assert completions == [[7, 5], [6, 8]]
    with pytest.raises(ValueError, match=r"traced prompts \['p'\] are not calibration prompts"):
        replay_completions(ordered, records[1:])
    with pytest.raises(ValueError, match="no nk_"):
        trace_k_grid(trace[["prompt_id"]])


def test_replayed_curves_check_the_replay_against_the_trace():
    trace = ordered_trace(_trace())
    curves, diff = replayed_curves(_probs(X_B, X_A), trace, _fit())
    expected = dense_bound_curves(_probs(X_B, X_A), trace["u"], trace["x_d"], trace["beta"], _fit())
    np.testing.assert_allclose(curves.bound_sums, expected.bound_sums)
    np.testing.assert_allclose(curves.mean_bound(None), BOUND_A / 2, atol=1e-12)
    np.testing.assert_allclose(diff, [0.0, 0.0], atol=1e-15)
    # the prompts' distributions swapped: x_d off by 0.3 on average
    with pytest.raises(RuntimeError, match="misaligned"):
        replayed_curves(_probs(X_A, X_B), trace, _fit())
    assert 0.3 > REPLAY_MAX_MEAN_ABS_DIFF
    with pytest.raises(ValueError, match="replayed |V| = 4 differs from the trace's 8"):
        replayed_curves(_probs(X_B, X_A), ordered_trace(_trace((1, 2, 8))), _fit())


@pytest.mark.parametrize(
    ("u_th", "theta_tv", "k_star"),
    [
        # u_th -1 transmits both tokens: mean bound BOUND_A / 2 = 0.215, 0.107, 0, 0
        (-1.0, 0.25, 1),
        (-1.0, 0.15, 2),
        (-1.0, 0.05, 3),
        # u_th 0.3 skips B (u 0.1): the mean is A's own bound, 0.430, 0.215, 0, 0
        (0.3, 0.25, 2),
        (0.3, 0.5, 1),
    ],
)
def test_choose_k_takes_the_smallest_k_within_theta_at_the_fit_threshold(u_th, theta_tv, k_star):
    trace = ordered_trace(_trace())
    curves, diff = replayed_curves(_probs(X_B, X_A), trace, _fit())
    choice = choose_k(
        curves, {**FIT, "u_th": u_th}, PROFILE, REFERENCE, {**CUHLM, "theta_tv": theta_tv}
    )
    assert choice.offline.k_star == k_star
    assert choice.u_th == (None if u_th < 0 else u_th)
    record = choice.record(trace_k_grid(trace), diff)
    assert (record["k_star"], record["vocab_size"], record["k_grid"]) == (k_star, 4, [1, 2, 4])
    assert record["k_search"] == "every integer k in [1, 4]"
    assert record["replay"] == {"tokens": 2, "mean_abs_x_d_diff": 0.0, "max_abs_x_d_diff": 0.0}
    assert record["latency_inputs"]["target_s"] == 0.02 and record["joint"]["channel"] == "ref"
    table = choice.grid_table(trace, [1, 2, 4])
    chosen = table.loc[table["chosen"], "k"].tolist()
    assert chosen == ([k_star] if k_star in (1, 2, 4) else [])


def test_the_joint_programme_skips_the_safe_token():
    """Skipping B (risk 0.05 <= 0.1) halves the uploads; skipping A too would risk 0.175. With
    only A sent, theta 0.25 needs k = 2."""
    trace = ordered_trace(_trace())
    curves, _ = replayed_curves(_probs(X_B, X_A), trace, _fit())
    joint = choose_k(curves, {**FIT, "u_th": -1.0}, PROFILE, REFERENCE, CUHLM).joint
    assert (joint.k_star, joint.u_th) == (2, pytest.approx(0.1))
    assert joint.risk == pytest.approx(0.05) and joint.p_tx == pytest.approx(0.5)


def test_joint_sensitivity_re_solves_per_budget_and_bandwidth():
    """The hand case under two risk budgets and two bandwidths: budget 0.1 skips B only (k 2,
    as above); budget 0.2 may skip A too (risk 0.175), so nothing is sent and k is the
    smallest; a thousandth of the bandwidth prices each upload 1000 times higher."""
    from edgespec.cuhlm.joint import joint_sensitivity
    from edgespec.wireless.channel import ergodic_rate_bps

    trace = ordered_trace(_trace())
    curves, _ = replayed_curves(_probs(X_B, X_A), trace, _fit())
    table = joint_sensitivity(curves, 0.25, PROFILE, {"ref": REFERENCE}, 8, [0.1, 0.2], (1, 1e-3))
    assert len(table) == 4 and set(table["status"]) == {"optimal"}
    by = table.set_index(["risk_budget", "bandwidth_factor"])
    assert (by.loc[(0.1, 1.0), "k_star"], by.loc[(0.1, 1.0), "u_th"]) == (2, pytest.approx(0.1))
    assert by.loc[(0.2, 1.0), "skip_fraction"] == 1.0 and by.loc[(0.2, 1.0), "k_star"] == 1
    assert by.loc[(0.1, 1e-3), "bandwidth_hz"] == pytest.approx(1e3)
    rate = ergodic_rate_bps(REFERENCE)  # AWGN: 1e6 log2(11)
    assert by.loc[(0.1, 1.0), "ergodic_rate_bps"] == pytest.approx(rate)
    # B(2) = 2 (8 + ceil(log2 4)) = 20 bits
    assert by.loc[(0.1, 1.0), "upload_s"] == pytest.approx(20 / rate)
    assert by.loc[(0.1, 1e-3), "upload_s"] == pytest.approx(20 / (rate * 1e-3))
