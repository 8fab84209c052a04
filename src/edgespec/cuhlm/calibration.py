"""Calibration of the opportunistic-skip rule (U-HLM / CU-HLM, methods §3.3).

Inputs are per-token arrays from a calibration run of standard HLM in which every token is
transmitted: the device's uncertainty ``u`` (a multiple of 1/M in [0, 1]) and the realised
rejection probability ``beta = max(0, 1 - y_d / x_d)``.

The linear model beta ~ a u + b is fitted by ordinary least squares over tokens (not over
bins). Thresholds follow methods §3.3:

- risk-averse: u_th = -b / a (skip only tokens the model predicts are never rejected);
- risk-prone: u_th = (delta - b) / a, delta the empirical fraction of tokens with y_d < x_d;
- risk budget: the largest u_th whose rejection risk among skipped tokens,
  E[beta 1{u <= u_th}] / P(u <= u_th), stays <= epsilon, with the risk either predicted by the
  clipped linear model or measured.

The skip rule is ``u <= u_th`` with an exact comparison, the same one the engine applies; the
risk-budget thresholds are observed u values, so they compare exactly with the lattice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

SKIP_NOTHING_THRESHOLD = -1.0
"""A threshold below every possible u (u >= 0): skips no token. Returned by
:func:`risk_budget_threshold` when even u_th = 0 exceeds the budget."""


class CalibrationError(ValueError):
    """The calibration data or fit cannot support the requested quantity."""


@dataclass
class LinearFit:
    """beta ~ a * u + b fitted by least squares over ``n`` tokens.

    ``r2`` is the coefficient of determination of the fit and ``pearson_r`` the Pearson
    correlation of (u, beta); both are NaN when beta is constant.
    """

    a: float
    b: float
    r2: float
    pearson_r: float
    n: int

    @classmethod
    def from_record(cls, record: dict) -> LinearFit:
        """The fit of a ``fit.json`` record (:func:`calibration_record`)."""
        return cls(record["a"], record["b"], record["r2"], record["pearson_r"], record["n"])

    def predict(self, u) -> np.ndarray:
        """The unclipped linear prediction a * u + b."""
        return self.a * np.asarray(u, dtype=np.float64) + self.b

    def predict_clipped(self, u) -> np.ndarray:
        """beta_hat = clip(a * u + b, 0, 1), the device-side estimate of beta_d."""
        return np.clip(self.predict(u), 0.0, 1.0)


class RiskEstimate(NamedTuple):
    """Rejection risk among skipped tokens and the fraction of tokens skipped.

    ``risk`` is E[beta 1{u <= u_th}] / P(u <= u_th); it is defined as 0.0 when no token is
    skipped (nothing skipped, nothing risked).
    """

    risk: float
    skip_fraction: float


def _as_arrays(u, beta=None) -> tuple[np.ndarray, np.ndarray | None]:
    u_arr = np.asarray(u, dtype=np.float64).ravel()
    if not np.all(np.isfinite(u_arr)):
        raise CalibrationError("u contains NaN or infinite values")
    if beta is None:
        return u_arr, None
    beta_arr = np.asarray(beta, dtype=np.float64).ravel()
    if beta_arr.shape != u_arr.shape:
        raise CalibrationError(
            f"u and beta must have the same length, got {u_arr.size} and {beta_arr.size}"
        )
    if not np.all(np.isfinite(beta_arr)):
        raise CalibrationError("beta contains NaN or infinite values")
    return u_arr, beta_arr


def fit_rejection_model(u, beta) -> LinearFit:
    """Least-squares fit beta ~ a u + b over tokens (scikit-learn ``LinearRegression``).

    Raises :class:`CalibrationError` with fewer than 3 tokens or when u is constant (the slope
    is then undetermined).
    """
    u_arr, beta_arr = _as_arrays(u, beta)
    n = u_arr.size
    if n < 3:
        raise CalibrationError(f"need at least 3 calibration tokens to fit beta ~ a u + b, got {n}")
    if np.ptp(u_arr) == 0:
        raise CalibrationError(
            f"u is constant ({u_arr[0]:g}) on all {n} calibration tokens: the slope a is "
            "undetermined"
        )
    from sklearn.linear_model import LinearRegression  # decoding jobs import LinearFit only

    model = LinearRegression().fit(u_arr.reshape(-1, 1), beta_arr)
    a = float(model.coef_[0])
    b = float(model.intercept_)
    residual = beta_arr - (a * u_arr + b)
    total = float(np.sum((beta_arr - beta_arr.mean()) ** 2))
    if total > 0:
        r2 = 1.0 - float(np.sum(residual**2)) / total
        pearson_r = float(np.corrcoef(u_arr, beta_arr)[0, 1])
    else:
        r2 = pearson_r = float("nan")
    return LinearFit(a=a, b=b, r2=r2, pearson_r=pearson_r, n=n)


def binned_rejection(u, beta, confidence: float = 0.95, max_bins: int = 50) -> pd.DataFrame:
    """Mean rejection probability per uncertainty level, with a confidence interval.

    One row per distinct u value when there are at most ``max_bins`` of them (the usual case:
    u takes M + 1 values), otherwise ``max_bins`` equal-width bins over [min u, max u].
    Columns: ``u_low``, ``u_high`` (the bin's range of observed u), ``u_mean``, ``count``,
    ``beta_mean``, ``beta_std`` (sample standard deviation), ``ci_low``, ``ci_high``.

    The interval is the normal-approximation interval for a mean with Student-t quantiles:
    beta_mean +- t_{(1+confidence)/2, count-1} * beta_std / sqrt(count), clipped to [0, 1].
    It is NaN for a bin with a single token.
    """
    if not 0 < confidence < 1:
        raise CalibrationError(f"confidence must lie in (0, 1), got {confidence}")
    u_arr, beta_arr = _as_arrays(u, beta)
    if u_arr.size == 0:
        raise CalibrationError("no calibration tokens")
    distinct = np.unique(u_arr)
    if distinct.size <= max_bins:
        keys = np.searchsorted(distinct, u_arr)
    else:
        edges = np.linspace(u_arr.min(), u_arr.max(), max_bins + 1)
        keys = np.clip(np.searchsorted(edges, u_arr, side="right") - 1, 0, max_bins - 1)
    frame = pd.DataFrame({"key": keys, "u": u_arr, "beta": beta_arr})
    grouped = frame.groupby("key", sort=True)
    out = pd.DataFrame(
        {
            "u_low": grouped["u"].min(),
            "u_high": grouped["u"].max(),
            "u_mean": grouped["u"].mean(),
            "count": grouped["beta"].size(),
            "beta_mean": grouped["beta"].mean(),
            "beta_std": grouped["beta"].std(ddof=1),
        }
    ).reset_index(drop=True)
    counts = out["count"].to_numpy()
    dof = np.maximum(counts - 1, 1)
    from scipy import stats

    quantile = stats.t.ppf(0.5 + confidence / 2, dof)
    half = quantile * out["beta_std"].to_numpy() / np.sqrt(counts)
    half = np.where(counts > 1, half, np.nan)
    out["ci_low"] = np.clip(out["beta_mean"].to_numpy() - half, 0.0, 1.0)
    out["ci_high"] = np.clip(out["beta_mean"].to_numpy() + half, 0.0, 1.0)
    return out


def _check_slope(fit: LinearFit) -> None:
    if not fit.a > 0:
        raise CalibrationError(
            f"the fitted slope a={fit.a:g} is not positive: uncertainty does not predict "
            "rejection, so no threshold u_th can be derived from the linear model"
        )


def risk_averse_threshold(fit: LinearFit) -> float:
    """u_th = -b / a: skip exactly the tokens whose predicted beta a u + b is <= 0.

    A negative value skips nothing (u >= 0).
    """
    _check_slope(fit)
    return -fit.b / fit.a


def rejectable_fraction(x_d, y_d) -> float:
    """delta = the empirical fraction of tokens with y_d < x_d (draft could be rejected)."""
    x_arr = np.asarray(x_d, dtype=np.float64).ravel()
    y_arr = np.asarray(y_d, dtype=np.float64).ravel()
    if x_arr.size == 0 or x_arr.shape != y_arr.shape:
        raise CalibrationError("x_d and y_d must be non-empty and of equal length")
    return float(np.mean(y_arr < x_arr))


def risk_prone_threshold(fit: LinearFit, delta: float) -> float:
    """u_th = (delta - b) / a, delta the empirical fraction of tokens with y_d < x_d.

    Reconstructed from a public replication (the papers do not state the formula; methods §3.3 and
    docs/methods.md §3.3); see :func:`rejectable_fraction` for delta.
    """
    _check_slope(fit)
    if not 0 <= delta <= 1:
        raise CalibrationError(f"delta is a fraction of tokens and must lie in [0, 1], got {delta}")
    return (delta - fit.b) / fit.a


MAX_UNCERTAINTY = 1.0
"""u(t) is a fraction of perturbed samples, so u <= 1: a threshold >= 1 skips every token."""


def clamp_threshold(u_th: float) -> tuple[float, bool]:
    """``u_th`` clamped to at most :data:`MAX_UNCERTAINTY`, and whether it skips every token.

    The linear-model thresholds can exceed 1 (e.g. risk-prone (delta - b)/a with a small slope);
    a variant using such a threshold never uploads, so it has become SLM-only. The caller warns.
    """
    value = float(u_th)
    if not math.isfinite(value):
        raise CalibrationError(f"a threshold must be finite, got {u_th!r}")
    return min(value, MAX_UNCERTAINTY), value >= MAX_UNCERTAINTY


def _mean_over_skipped(u_arr: np.ndarray, values: np.ndarray, u_th: float) -> RiskEstimate:
    if u_arr.size == 0:
        raise CalibrationError("no calibration tokens")
    skipped = u_arr <= u_th
    if not skipped.any():
        return RiskEstimate(0.0, 0.0)
    return RiskEstimate(float(values[skipped].mean()), float(skipped.mean()))


def predicted_risk(fit: LinearFit, u, u_th: float) -> RiskEstimate:
    """Risk among skipped tokens under the clipped linear model.

    E[clip(a u + b, 0, 1) 1{u <= u_th}] / P(u <= u_th), with the expectation over the observed
    uncertainty distribution ``u``.
    """
    u_arr, _ = _as_arrays(u)
    return _mean_over_skipped(u_arr, fit.predict_clipped(u_arr), u_th)


def empirical_risk(u, beta, u_th: float) -> RiskEstimate:
    """Measured risk among skipped tokens: mean beta over the tokens with u <= u_th."""
    u_arr, beta_arr = _as_arrays(u, beta)
    return _mean_over_skipped(u_arr, beta_arr, u_th)


def risk_budget_threshold(
    u,
    beta,
    fit: LinearFit,
    epsilon: float,
    use: Literal["predicted", "empirical"] = "predicted",
) -> float:
    """The largest u_th, among 0 and the distinct observed u values, whose risk is <= epsilon.

    The risk is :func:`predicted_risk` (``use="predicted"``) or :func:`empirical_risk`
    (``use="empirical"``). Every candidate is scanned (the risk need not be monotone in u_th),
    so the result is non-decreasing in epsilon. When no candidate meets the budget (u = 0 is
    observed and already too risky) the result is :data:`SKIP_NOTHING_THRESHOLD`.
    """
    if epsilon < 0:
        raise CalibrationError(f"epsilon must be >= 0, got {epsilon}")
    if use not in ("predicted", "empirical"):
        raise CalibrationError(f"use must be 'predicted' or 'empirical', got {use!r}")
    u_arr, beta_arr = _as_arrays(u, beta)
    if u_arr.size == 0:
        raise CalibrationError("no calibration tokens")
    values = np.unique(np.concatenate([[0.0], u_arr]))
    order = np.argsort(u_arr, kind="stable")
    u_sorted = u_arr[order]
    if use == "predicted":
        per_token = fit.predict_clipped(u_sorted)
    else:
        per_token = beta_arr[order]
    # Risk at each candidate from prefix sums over the sorted tokens (one pass, no loop).
    cumulative = np.concatenate([[0.0], np.cumsum(per_token)])
    counts = np.searchsorted(u_sorted, values, side="right")
    risk = np.where(counts > 0, cumulative[counts] / np.maximum(counts, 1), 0.0)
    ok = risk <= epsilon
    if not ok.any():
        return SKIP_NOTHING_THRESHOLD
    return float(values[ok].max())


def threshold_table(
    u,
    beta,
    fit: LinearFit,
    epsilons,
    delta: float | None = None,
    use: Literal["predicted", "empirical"] = "predicted",
) -> pd.DataFrame:
    """Every threshold rule with its skip fraction and its predicted and measured risk.

    Rows: ``risk_averse``, ``risk_prone`` and one ``risk_budget_eps={epsilon:g}`` per budget
    (solved with ``use``). Columns: ``rule``, ``epsilon`` (NaN for the first two), ``u_th``
    (as the formula gives it, before :func:`clamp_threshold`), ``skip_fraction``,
    ``predicted_risk``, ``empirical_risk``, ``skips_every_token`` (u_th >= 1: SLM-only).
    ``delta`` defaults to the fraction of tokens with beta > 0, which equals the fraction with
    y_d < x_d.
    """
    u_arr, beta_arr = _as_arrays(u, beta)
    if delta is None:
        delta = float(np.mean(beta_arr > 0))
    rules: list[tuple[str, float, float]] = [
        ("risk_averse", float("nan"), risk_averse_threshold(fit)),
        ("risk_prone", float("nan"), risk_prone_threshold(fit, delta)),
    ]
    for eps in epsilons:
        eps = float(eps)
        rules.append(
            (f"risk_budget_eps={eps:g}", eps, risk_budget_threshold(u_arr, beta_arr, fit, eps, use))
        )
    rows = []
    for name, eps, u_th in rules:
        predicted = predicted_risk(fit, u_arr, u_th)
        measured = empirical_risk(u_arr, beta_arr, u_th)
        rows.append(
            {
                "rule": name,
                "epsilon": eps,
                "u_th": u_th,
                "skip_fraction": predicted.skip_fraction,
                "predicted_risk": predicted.risk,
                "empirical_risk": measured.risk,
                "skips_every_token": bool(u_th >= MAX_UNCERTAINTY),
            }
        )
    return pd.DataFrame(rows)


THRESHOLD_RULES = ("risk_averse", "risk_prone", "risk_budget")
"""The values of config key ``cuhlm.threshold_rule``."""

THRESHOLD_USERS = {
    "risk_averse": ("uhlm_risk_averse",),
    "risk_prone": ("uhlm_risk_prone",),
    "threshold_rule": ("fixed_topk", "cuhlm_offline", "cuhlm_online", "cuhlm_exact"),
}
"""The variants that skip at each threshold of a ``fit.json`` record: they become SLM-only
when it is >= 1."""


def clamp_and_warn(name: str, value: float, users: Sequence[str], slm_only: list[str]) -> float:
    """:func:`clamp_threshold`; where ``value`` >= 1 it logs a warning that ``users`` skip
    every token and adds them to ``slm_only``."""
    clamped, skips_everything = clamp_threshold(value)
    if skips_everything:
        slm_only.extend(users)
        log.warning(
            "%s threshold %.4f >= 1 clamped to 1: u(t) <= 1 always, so it skips every token and "
            "%s have become SLM-only",
            name,
            value,
            ", ".join(users),
        )
    return clamped


def calibration_record(
    u, beta, x_d, y_d, rule: str, risk_budget: float | None = None
) -> tuple[LinearFit, dict]:
    """The fit beta ~ a u + b on the calibration tokens and the ``fit.json`` record: the fit,
    delta (:func:`rejectable_fraction`), the risk-averse and risk-prone thresholds and the one
    ``rule`` (``cuhlm.threshold_rule``, with ``risk_budget`` for ``risk_budget``) picks, each
    clamped to 1 (:func:`clamp_and_warn`; ``u_th_unclamped`` keeps the formulas' values and
    ``slm_only_variants`` the variants a clamp made SLM-only). A fit whose slope is not
    positive defines no threshold: every one is :data:`SKIP_NOTHING_THRESHOLD` and
    ``valid_slope`` is false."""
    if rule not in THRESHOLD_RULES:
        raise CalibrationError(
            f"cuhlm.threshold_rule must be one of {', '.join(THRESHOLD_RULES)}, got {rule!r}"
        )
    if rule == "risk_budget" and risk_budget is None:
        raise CalibrationError("cuhlm.threshold_rule risk_budget needs cuhlm.risk_budget")
    u_arr, beta_arr = _as_arrays(u, beta)
    fit = fit_rejection_model(u_arr, beta_arr)
    delta = rejectable_fraction(x_d, y_d)
    log.info(
        "fit over %d tokens: a=%.4f b=%.4f R2=%.3f r=%.3f",
        fit.n,
        fit.a,
        fit.b,
        fit.r2,
        fit.pearson_r,
    )
    if fit.a > 0:
        u_averse, u_prone = risk_averse_threshold(fit), risk_prone_threshold(fit, delta)
    else:
        # uncertainty does not predict rejection: the variants that skip skip nothing
        log.warning("slope a=%.4f <= 0: thresholds undefined, skipping disabled", fit.a)
        u_averse = u_prone = SKIP_NOTHING_THRESHOLD
    if rule == "risk_budget":
        u_th = risk_budget_threshold(u_arr, beta_arr, fit, risk_budget) if fit.a > 0 else u_averse
    else:
        u_th = u_averse if rule == "risk_averse" else u_prone
    raw = {"risk_averse": u_averse, "risk_prone": u_prone, "threshold_rule": u_th}
    slm_only: list[str] = []
    name = {"threshold_rule": f"threshold_rule {rule}"}
    clamped = {
        key: clamp_and_warn(name.get(key, key), value, THRESHOLD_USERS[key], slm_only)
        for key, value in raw.items()
    }
    record = {
        "a": fit.a,
        "b": fit.b,
        "r2": fit.r2,
        "pearson_r": fit.pearson_r,
        "n": fit.n,
        "delta": delta,
        "u_th_risk_averse": clamped["risk_averse"],
        "u_th_risk_prone": clamped["risk_prone"],
        "threshold_rule": rule,
        "u_th": clamped["threshold_rule"],
        "u_th_unclamped": raw,
        "slm_only_variants": sorted(set(slm_only)),
        "valid_slope": bool(fit.a > 0),
    }
    return fit, record


def reported_thresholds(u, beta, record: dict, risk_budgets) -> pd.DataFrame:
    """:func:`threshold_table` of a ``fit.json`` record at the reported ``risk_budgets``
    (``cuhlm.risk_budgets``); without a valid slope, the risk-averse and risk-prone rows skip
    nothing (:data:`SKIP_NOTHING_THRESHOLD`, no skip, no risk)."""
    if record["valid_slope"]:
        fit = LinearFit.from_record(record)
        return threshold_table(u, beta, fit, risk_budgets, delta=record["delta"])
    return pd.DataFrame(
        [
            {
                "rule": rule,
                "epsilon": float("nan"),
                "u_th": SKIP_NOTHING_THRESHOLD,
                "skip_fraction": 0.0,
                "predicted_risk": 0.0,
                "empirical_risk": 0.0,
                "skips_every_token": False,
            }
            for rule in ("risk_averse", "risk_prone")
        ]
    )
