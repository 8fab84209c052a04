"""Linear rejection model and skip thresholds (methods §3.3)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from edgespec.cuhlm.calibration import (
    SKIP_NOTHING_THRESHOLD,
    THRESHOLD_USERS,
    CalibrationError,
    LinearFit,
    binned_rejection,
    calibration_record,
    clamp_and_warn,
    clamp_threshold,
    empirical_risk,
    fit_rejection_model,
    predicted_risk,
    rejectable_fraction,
    reported_thresholds,
    risk_averse_threshold,
    risk_budget_threshold,
    risk_prone_threshold,
    threshold_table,
)

# Hand-computed example: with a = 0.8, b = -0.1 the clipped predictions are [0, .1, .3, .5, .7].
U5 = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
BETA5 = np.array([0.0, 0.1, 0.2, 0.5, 0.9])
FIT5 = LinearFit(a=0.8, b=-0.1, r2=float("nan"), pearson_r=float("nan"), n=5)


def synthetic(n=4000, a=0.6, b=0.2, noise=0.05, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 21, n) / 20
    beta = a * u + b + noise * rng.standard_normal(n)
    return u, beta


def test_linear_fit_recovers_slope_and_intercept():
    u, beta = synthetic()
    fit = fit_rejection_model(u, beta)
    assert fit.a == pytest.approx(0.6, abs=0.01)
    assert fit.b == pytest.approx(0.2, abs=0.01)
    assert fit.n == len(u)
    assert fit.pearson_r == pytest.approx(np.corrcoef(u, beta)[0, 1])
    assert fit.r2 == pytest.approx(fit.pearson_r**2)  # simple regression: R^2 = r^2
    assert fit.r2 > 0.9


def test_linear_fit_exact_line():
    fit = fit_rejection_model([0, 0.5, 1], [-0.066, 0.3415, 0.749])
    assert (fit.a, fit.b) == (pytest.approx(0.815), pytest.approx(-0.066))
    assert fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize(
    "u, beta, match",
    [([0.1, 0.2], [0.0, 0.1], "at least 3"), ([0.5, 0.5, 0.5], [0.0, 0.1, 0.2], "constant")],
)
def test_linear_fit_rejects_degenerate_data(u, beta, match):
    with pytest.raises(CalibrationError, match=match):
        fit_rejection_model(u, beta)


def test_risk_averse_and_risk_prone_thresholds_by_hand():
    paper = LinearFit(a=0.815, b=-0.066, r2=0.0, pearson_r=0.0, n=0)
    assert risk_averse_threshold(paper) == pytest.approx(0.066 / 0.815)
    assert risk_averse_threshold(paper) == pytest.approx(0.0810, abs=5e-5)
    assert risk_prone_threshold(paper, 0.596) == pytest.approx(0.8123, abs=5e-5)
    simple = LinearFit(a=0.5, b=-0.1, r2=0.0, pearson_r=0.0, n=0)
    assert risk_averse_threshold(simple) == pytest.approx(0.2)
    assert risk_prone_threshold(simple, 0.4) == pytest.approx(1.0)
    flat = LinearFit(a=0.0, b=0.1, r2=0.0, pearson_r=0.0, n=0)
    with pytest.raises(CalibrationError, match="slope"):
        risk_averse_threshold(flat)
    with pytest.raises(CalibrationError, match="slope"):
        risk_prone_threshold(flat, 0.5)
    with pytest.raises(CalibrationError, match="delta"):
        risk_prone_threshold(simple, 1.5)


def test_rejectable_fraction():
    assert rejectable_fraction([0.5, 0.2, 0.3, 0.1], [0.4, 0.2, 0.6, 0.05]) == 0.5


def test_predicted_and_empirical_risk_by_hand():
    predicted = predicted_risk(FIT5, U5, 0.5)
    assert predicted.skip_fraction == pytest.approx(0.6)
    assert predicted.risk == pytest.approx((0 + 0.1 + 0.3) / 3)
    measured = empirical_risk(U5, BETA5, 0.5)
    assert measured.skip_fraction == pytest.approx(0.6)
    assert measured.risk == pytest.approx(0.1)
    assert tuple(predicted_risk(FIT5, U5, -0.5)) == (0.0, 0.0)
    assert tuple(empirical_risk(U5, BETA5, -0.5)) == (0.0, 0.0)
    assert empirical_risk(U5, BETA5, 1.0).risk == pytest.approx(BETA5.mean())


def test_risk_budget_threshold_by_hand():
    # predicted risks at 0, .25, .5, .75, 1: 0, .05, .1333, .225, .32
    assert risk_budget_threshold(U5, BETA5, FIT5, 0.12) == 0.25
    assert risk_budget_threshold(U5, BETA5, FIT5, 0.14) == 0.5
    # empirical risks: 0, .05, .1, .2, .34
    assert risk_budget_threshold(U5, BETA5, FIT5, 0.12, use="empirical") == 0.5
    assert risk_budget_threshold(U5, BETA5, FIT5, 1.0, use="empirical") == 1.0
    # u = 0 observed and already too risky: skip nothing
    risky = np.array([0.3, 0.1, 0.2, 0.5, 0.9])
    assert risk_budget_threshold(U5, risky, FIT5, 0.1, use="empirical") == SKIP_NOTHING_THRESHOLD
    # u = 0 not observed: 0 skips nothing and is always within budget
    assert risk_budget_threshold(U5[1:], risky[1:], FIT5, 0.0, use="empirical") == 0.0
    with pytest.raises(CalibrationError):
        risk_budget_threshold(U5, BETA5, FIT5, 0.1, use="oracle")


@pytest.mark.parametrize("use", ["predicted", "empirical"])
def test_risk_budget_threshold_matches_scan_and_is_monotone(use):
    u, beta = synthetic(n=500, a=0.8, b=-0.1, noise=0.15, seed=3)
    beta = np.clip(beta, 0, 1)
    fit = fit_rejection_model(u, beta)
    risk_of = {
        "predicted": lambda th: predicted_risk(fit, u, th).risk,
        "empirical": lambda th: empirical_risk(u, beta, th).risk,
    }[use]
    candidates = sorted({0.0, *u.tolist()})
    previous = -math.inf
    for eps in np.linspace(0, 0.6, 25):
        got = risk_budget_threshold(u, beta, fit, eps, use=use)
        feasible = [th for th in candidates if risk_of(th) <= eps]
        assert got == (max(feasible) if feasible else SKIP_NOTHING_THRESHOLD)
        assert got >= previous
        previous = got


def test_binned_rejection_per_distinct_value():
    u = np.array([0.0, 0.0, 0.0, 0.5, 0.5, 1.0])
    beta = np.array([0.0, 0.1, 0.2, 0.4, 0.6, 0.9])
    table = binned_rejection(u, beta, confidence=0.9)
    assert table["u_mean"].tolist() == [0.0, 0.5, 1.0]
    assert table["count"].tolist() == [3, 2, 1]
    assert table["beta_mean"].to_numpy() == pytest.approx([0.1, 0.5, 0.9])
    half = stats.t.ppf(0.95, 2) * 0.1 / math.sqrt(3)
    assert table.loc[0, "ci_low"] == pytest.approx(max(0.0, 0.1 - half))
    assert table.loc[0, "ci_high"] == pytest.approx(0.1 + half)
    assert math.isnan(table.loc[2, "ci_low"]) and math.isnan(table.loc[2, "ci_high"])


def test_binned_rejection_bins_many_values():
    rng = np.random.default_rng(1)
    u = rng.random(1000)
    beta = np.clip(u + 0.1 * rng.standard_normal(1000), 0, 1)
    table = binned_rejection(u, beta, max_bins=10)
    assert len(table) == 10
    assert table["count"].sum() == 1000
    assert (table["ci_low"] <= table["beta_mean"]).all()
    assert (table["beta_mean"] <= table["ci_high"]).all()
    assert table["u_mean"].is_monotonic_increasing


def test_threshold_table():
    table = threshold_table(U5, BETA5, FIT5, [0.12, 0.3], delta=0.4)
    assert table["rule"].tolist() == [
        "risk_averse",
        "risk_prone",
        "risk_budget_eps=0.12",
        "risk_budget_eps=0.3",
    ]
    assert table["u_th"].to_numpy() == pytest.approx([0.125, 0.625, 0.25, 0.75])
    assert table["skip_fraction"].to_numpy() == pytest.approx([0.2, 0.6, 0.4, 0.8])
    assert table["empirical_risk"].to_numpy() == pytest.approx([0.0, 0.1, 0.05, 0.2])
    assert table["predicted_risk"].to_numpy() == pytest.approx([0.0, 0.4 / 3, 0.05, 0.225])
    assert (table.loc[2:, "predicted_risk"] <= table.loc[2:, "epsilon"]).all()
    # delta defaults to the fraction with beta > 0 (4 of 5)
    default = threshold_table(U5, BETA5, FIT5, [])
    assert default.loc[1, "u_th"] == pytest.approx((0.8 + 0.1) / 0.8)
    # ...which exceeds 1: that rule skips every token (SLM-only), and the table says so.
    assert default["skips_every_token"].tolist() == [False, True]
    assert not table["skips_every_token"].any()


def test_threshold_above_one_is_clamped_and_flagged():
    """u <= 1, so a threshold >= 1 skips everything: clamp_threshold caps it at 1 and says so."""
    fit = LinearFit(a=0.3, b=-0.05, r2=float("nan"), pearson_r=float("nan"), n=10)
    raw = risk_prone_threshold(fit, 0.4)
    assert raw == pytest.approx(1.5)
    assert clamp_threshold(raw) == (1.0, True)
    assert clamp_threshold(1.0) == (1.0, True)
    assert clamp_threshold(0.4) == (0.4, False)
    assert clamp_threshold(-1.0) == (-1.0, False)
    with pytest.raises(CalibrationError, match="finite"):
        clamp_threshold(math.inf)
    # The clamped threshold skips exactly the tokens the raw one did (all of them).
    u = np.linspace(0, 1, 21)
    assert empirical_risk(u, u, 1.0).skip_fraction == empirical_risk(u, u, raw).skip_fraction == 1


def test_clamp_and_warn_fires_at_one_and_not_below(caplog):
    """A threshold at or above 1 skips every token: the warning names the variants, which join
    the SLM-only list; below 1 nothing is said or added."""
    slm_only: list[str] = []
    with caplog.at_level("WARNING"):
        assert clamp_and_warn("risk_prone", 0.999, ["uhlm_risk_prone"], slm_only) == 0.999
    assert slm_only == [] and not caplog.records
    with caplog.at_level("WARNING"):
        assert clamp_and_warn("risk_prone", 1.0, ["uhlm_risk_prone"], slm_only) == 1.0
        assert clamp_and_warn("rule", 1.7, ["cuhlm_offline", "fixed_topk"], slm_only) == 1.0
    assert slm_only == ["uhlm_risk_prone", "cuhlm_offline", "fixed_topk"]
    assert len(caplog.records) == 2
    assert "uhlm_risk_prone have become SLM-only" in caplog.records[0].getMessage()


# u on a 1/4 lattice, beta = 0.4 u + 0.1 exactly: a = 0.4, b = 0.1, so risk-averse u_th = -0.25
# (skips nothing) and risk-prone u_th = (delta - 0.1) / 0.4.
U_LINE = np.repeat([0.0, 0.25, 0.5, 0.75, 1.0], 2)
BETA_LINE = 0.4 * U_LINE + 0.1


def _x_y(rejectable: int):
    """x_d, y_d over the 10 tokens with y_d < x_d on the first ``rejectable``."""
    x_d = np.full(10, 0.5)
    return x_d, np.where(np.arange(10) < rejectable, 0.25, 0.75)


@pytest.mark.parametrize(
    ("rejectable", "rule", "u_th", "slm_only"),
    [
        # delta 0.3: risk-prone (0.3 - 0.1) / 0.4 = 0.5, below 1
        (3, "risk_prone", 0.5, []),
        # delta 0.6: risk-prone 1.25 >= 1, clamped; the rule's users go SLM-only too
        (6, "risk_prone", 1.0, ["cuhlm_exact", "cuhlm_offline", "cuhlm_online", "fixed_topk"]),
        (6, "risk_averse", -0.25, []),
    ],
)
def test_calibration_record_by_hand(rejectable, rule, u_th, slm_only):
    x_d, y_d = _x_y(rejectable)
    fit, record = calibration_record(U_LINE, BETA_LINE, x_d, y_d, rule)
    assert (fit.a, fit.b) == (pytest.approx(0.4), pytest.approx(0.1))
    assert LinearFit.from_record(record) == fit
    assert record["delta"] == pytest.approx(rejectable / 10)
    assert record["u_th_risk_averse"] == pytest.approx(-0.25)
    prone = (rejectable / 10 - 0.1) / 0.4
    assert record["u_th_unclamped"]["risk_prone"] == pytest.approx(prone)
    assert record["u_th_risk_prone"] == pytest.approx(min(prone, 1.0))
    assert record["u_th"] == pytest.approx(u_th) and record["threshold_rule"] == rule
    prone_users = list(THRESHOLD_USERS["risk_prone"]) if prone >= 1 else []
    assert record["slm_only_variants"] == sorted(set(slm_only + prone_users))
    assert record["valid_slope"]


def test_calibration_record_risk_budget_and_bad_input():
    x_d, y_d = _x_y(3)
    # predicted risk among u <= 0.25 is mean(0.1, 0.2) = 0.15; with u <= 0.5 it is 0.2
    _, record = calibration_record(U_LINE, BETA_LINE, x_d, y_d, "risk_budget", 0.16)
    assert record["u_th"] == pytest.approx(0.25)
    with pytest.raises(CalibrationError, match="cuhlm.threshold_rule must be one of"):
        calibration_record(U_LINE, BETA_LINE, x_d, y_d, "risk_neutral")
    with pytest.raises(CalibrationError, match="needs cuhlm.risk_budget"):
        calibration_record(U_LINE, BETA_LINE, x_d, y_d, "risk_budget")


def test_a_falling_fit_skips_nothing(caplog):
    x_d, y_d = _x_y(3)
    with caplog.at_level("WARNING"):
        _, record = calibration_record(U_LINE, 0.6 - 0.4 * U_LINE, x_d, y_d, "risk_budget", 0.1)
    assert "thresholds undefined" in caplog.text
    assert not record["valid_slope"] and record["slm_only_variants"] == []
    for key in ("u_th", "u_th_risk_averse", "u_th_risk_prone"):
        assert record[key] == SKIP_NOTHING_THRESHOLD
    table = reported_thresholds(U_LINE, BETA_LINE, record, [0.1])
    assert table["rule"].tolist() == ["risk_averse", "risk_prone"]
    assert (table["u_th"] == SKIP_NOTHING_THRESHOLD).all() and (table["skip_fraction"] == 0).all()


def test_reported_thresholds_of_a_valid_fit_are_the_threshold_table():
    x_d, y_d = _x_y(3)
    fit, record = calibration_record(U_LINE, BETA_LINE, x_d, y_d, "risk_prone")
    table = reported_thresholds(U_LINE, BETA_LINE, record, [0.16])
    expected = threshold_table(U_LINE, BETA_LINE, fit, [0.16], delta=0.3)
    pd.testing.assert_frame_equal(table, expected)
    assert table.loc[table["rule"] == "risk_budget_eps=0.16", "u_th"].item() == pytest.approx(0.25)
