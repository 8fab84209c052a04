"""Choosing one top-k upload size for CU-HLM offline (methods §3.4).

CU-HLM offline picks one k* on the calibration tokens by a small mixed-integer programme
(:func:`optimize_k_star`) over every k of a set of mean-bound curves
(``edgespec.cuhlm.kcurves``, built from the bounds of ``edgespec.cuhlm.bounds``), and
:func:`k_table` reports, per trace grid k, how the bounds fare against the measured residual
and output distortions.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from edgespec.cuhlm.bounds import beta_hat, online_bound_denominator, provable_bound
from edgespec.cuhlm.calibration import LinearFit
from edgespec.wireless.delay import topk_extraction_s
from edgespec.wireless.payload import upload_bits

HOLDS_ATOL = 1e-6
"""Absolute slack when counting how often a bound is >= the measured TVD: traces are computed
in float32, whose rounding on a TVD is of this order."""

LATENCY_KEYS = (
    "draft_s",
    "uncertainty_s",
    "target_s",
    "rtt_s",
    "mean_uplink_rate_bps",
    "prob_bits",
    "vocab_size",
)


class InfeasibleBudgetError(ValueError):
    """No k (and u_th) meets the budgets; ``constraint`` names the binding one:
    ``"tvd"``, ``"risk"``, ``"tvd+risk"`` (each infeasible alone) or ``"joint"`` (each feasible
    alone, not together)."""

    def __init__(self, message: str, constraint: str):
        super().__init__(message)
        self.constraint = constraint


@dataclass
class KStarSolution:
    """Result of :func:`optimize_k_star`.

    ``objective_s``: expected per-token latency E[tau] at (k_star, u_th), seconds.
    ``status``: cvxpy's status; ``solver``: the solver that produced it.
    ``slack``: budget minus value for each active constraint (``"tvd"``, and ``"risk"`` when a
    risk budget was given); >= 0 up to solver tolerance.
    ``mean_bound``, ``p_tx``, ``risk``: the mean online bound at (k_star, u_th), the share of
    tokens transmitted and the mean beta over the skipped ones.
    ``candidates``: one row per candidate threshold: ``u_th``, ``p_tx``, ``risk``,
    ``smallest_feasible_k`` (0 when no k meets theta_tv) and ``expected_latency_s`` there.
    """

    k_star: int
    u_th: float | None
    objective_s: float
    status: str
    solver: str
    slack: dict[str, float] = field(default_factory=dict)
    mean_bound: float = math.nan
    p_tx: float = math.nan
    risk: float = math.nan
    candidates: pd.DataFrame = field(default_factory=pd.DataFrame)


@contextlib.contextmanager
def _stdout_fd_silenced() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null, so that HiGHS's C++ banner ("Running HiGHS ...",
    printed once per process whatever ``verbose`` says) cannot reach a stdout that a caller
    parses. C stdio buffers are flushed before fd 1 is restored. If fd 1 cannot be redirected
    (no such descriptor) the block runs unsilenced."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _diagnose(mean_bound, risk, thresholds, grid, theta_tv, risk_budget) -> InfeasibleBudgetError:
    """Check each constraint alone over every (k, u_th) and name the one(s) that bind."""
    fmt = lambda th: "none" if th is None else f"{th:g}"  # noqa: E731
    tvd_k, tvd_j = np.unravel_index(np.argmin(mean_bound), mean_bound.shape)
    tvd_min = float(mean_bound[tvd_k, tvd_j])
    tvd_alone = tvd_min <= theta_tv
    risk_alone = True
    risk_j = 0
    if risk_budget is not None:
        risk_j = int(np.argmin(risk))
        risk_alone = float(risk[risk_j]) <= risk_budget
    tvd_msg = (
        f"TVD budget theta_tv={theta_tv:g} is below the smallest average online bound "
        f"{tvd_min:.4g} (at k={grid[tvd_k]}, u_th={fmt(thresholds[tvd_j])}; largest grid k is "
        f"{grid[-1]})"
    )
    risk_msg = (
        f"risk budget {risk_budget} is below the smallest empirical skip risk "
        f"{float(risk[risk_j]):.4g} (at u_th={fmt(thresholds[risk_j])})"
    )
    if not tvd_alone and not risk_alone:
        return InfeasibleBudgetError(f"{tvd_msg}; and the {risk_msg}", "tvd+risk")
    if not tvd_alone:
        return InfeasibleBudgetError(tvd_msg, "tvd")
    if not risk_alone:
        return InfeasibleBudgetError(risk_msg, "risk")
    allowed = risk <= risk_budget
    best = float(mean_bound[:, allowed].min())
    return InfeasibleBudgetError(
        f"TVD budget theta_tv={theta_tv:g} and risk budget {risk_budget} conflict: each is "
        f"feasible alone, but among thresholds within the risk budget the smallest average "
        f"online bound is {best:.4g}",
        "joint",
    )


def _solve_mip(cost, mean_bound, risk, theta_tv, risk_budget, solver):
    """Boolean one-hots z (k) and w (u_th), linked by p_kj = z_k w_j.

    The objective and the TVD constraint depend on the pair, so they are written on p; the
    risk constraint depends on u_th alone and is written on w. For booleans the three
    inequalities p <= z, p <= w, p >= z + w - 1 force p = z w exactly (the standard product
    linearisation), which keeps z and w as the model's readable decisions. With a fixed u_th,
    w has one entry and p = z. Returns (z, w, status, solver) or None per solver failure.
    """
    import cvxpy as cp  # lazily: decoding jobs import this module and never solve

    n_k, n_j = cost.shape
    z = cp.Variable(n_k, boolean=True)
    w = cp.Variable(n_j, boolean=True)
    p = cp.Variable((n_k, n_j), boolean=True)
    z_col = cp.reshape(z, (n_k, 1), order="F") @ np.ones((1, n_j))
    w_row = np.ones((n_k, 1)) @ cp.reshape(w, (1, n_j), order="F")
    constraints = [
        cp.sum(z) == 1,
        cp.sum(w) == 1,
        p <= z_col,
        p <= w_row,
        p >= z_col + w_row - 1,
        cp.sum(cp.multiply(mean_bound, p)) <= theta_tv,
    ]
    if risk_budget is not None:
        constraints.append(risk @ w <= risk_budget)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(cost, p))), constraints)
    order = [solver] + [s for s in ("HIGHS", "SCIPY") if s != solver]
    errors = []
    for name in order:
        # Exact optimality: per-token latency differences between neighbouring k are tiny
        # (microseconds), below HiGHS's default absolute and relative MIP gaps.
        options = (
            {"mip_rel_gap": 0.0, "mip_abs_gap": 0.0}
            if name == "HIGHS"
            else {"scipy_options": {"mip_rel_gap": 0.0}}
            if name == "SCIPY"
            else {}
        )
        try:
            with _stdout_fd_silenced():
                problem.solve(solver=name, **options)
        except (cp.error.SolverError, ValueError) as exc:
            errors.append(f"{name}: {exc}")
            continue
        status = problem.status
        if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            return None, None, status, name
        if status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and z.value is not None:
            return int(np.argmax(z.value)), int(np.argmax(w.value)), status, name
        errors.append(f"{name}: status {status}")
    raise RuntimeError(f"k* programme not solved: {'; '.join(errors)}")


def upload_cost_s(k, latency: dict) -> np.ndarray:
    """Seconds one transmitted token costs beyond tau_SLM + tau_unc at upload size(s) k:
    B(k) / R + tau_LLM + RTT + the device's top-k extraction (none at k = |V|).

    ``latency`` keys: ``mean_uplink_rate_bps``, ``target_s``, ``rtt_s``, ``prob_bits``,
    ``vocab_size`` and optionally ``topk_s`` (k -> seconds, interpolated by
    :func:`edgespec.wireless.delay.topk_extraction_s`). Strictly increasing in k.
    """
    k = np.asarray(k, dtype=np.int64)
    vocab = int(latency["vocab_size"])
    bits = upload_bits(k, vocab, int(latency["prob_bits"])).astype(np.float64)
    extraction = np.where(
        k < vocab, topk_extraction_s(latency.get("topk_s") or {}, np.minimum(k, vocab)), 0.0
    )
    return (
        bits / float(latency["mean_uplink_rate_bps"])
        + latency["target_s"]
        + latency["rtt_s"]
        + extraction
    )


def _validate(curves, latency, theta_tv, u_th, u_th_grid, risk_budget) -> None:
    missing_keys = [key for key in LATENCY_KEYS if key not in latency]
    if missing_keys:
        raise ValueError(f"latency is missing {missing_keys}")
    if int(latency["vocab_size"]) != int(curves.vocab_size):
        raise ValueError(
            f"latency vocab_size {latency['vocab_size']} differs from the curves' |V| = "
            f"{curves.vocab_size}"
        )
    if not latency["mean_uplink_rate_bps"] > 0:
        raise ValueError("mean_uplink_rate_bps must be > 0")
    if not theta_tv >= 0:
        raise ValueError(f"theta_tv must be >= 0, got {theta_tv}")
    if u_th is not None and u_th_grid is not None:
        raise ValueError("give either a fixed u_th or a u_th_grid, not both")
    if u_th_grid is not None and risk_budget is None:
        raise ValueError(
            "a joint (k, u_th) search needs a risk_budget: without it the latency objective "
            "simply skips every token"
        )
    if u_th_grid is not None and len(u_th_grid) == 0:
        raise ValueError("u_th_grid is empty")


def _candidate_thresholds(curves, u_th, u_th_grid) -> list[float | None]:
    """Thresholds to consider. Grid values that skip the same set of tokens are equivalent
    (u lives on the 1/M lattice); only the smallest of each group is kept."""
    if u_th_grid is None:
        return [None if u_th is None else float(u_th)]
    kept: list[float | None] = []
    seen: set[bytes] = set()
    for value in sorted(float(v) for v in u_th_grid):
        key = curves.transmitted(value).tobytes()
        if key not in seen:
            seen.add(key)
            kept.append(value)
    return kept


def _cost_ranks(cost: np.ndarray) -> np.ndarray:
    """The rank of every (k, u_th) pair by cost, ties by threshold then k: the programme picks
    one pair, so minimising the rank is minimising the cost, and integer ranks keep the
    solver exact where neighbouring k differ by microseconds (below its tolerances)."""
    n_k, n_j = cost.shape
    k_idx, j_idx = np.meshgrid(np.arange(n_k), np.arange(n_j), indexing="ij")
    order = np.lexsort((k_idx.ravel(), j_idx.ravel(), cost.ravel()))
    ranks = np.empty(order.size, dtype=np.float64)
    ranks[order] = np.arange(order.size)
    return ranks.reshape(n_k, n_j)


def optimize_k_star(
    curves,
    theta_tv: float,
    latency: dict,
    u_th: float | None = None,
    u_th_grid: list[float] | None = None,
    risk_budget: float | None = None,
    solver: str = "HIGHS",
) -> KStarSolution:
    """CU-HLM offline: one k* (optionally jointly with u_th) minimising expected latency.

    Mixed-integer programme (cvxpy; HiGHS, falling back to SciPy's ``milp``) over every k of
    ``curves.k_values`` (a :class:`edgespec.cuhlm.kcurves.BoundCurves`: every integer in
    [1, |V|] for dense curves) and the candidate thresholds:

        minimise  E[tau] = tau_SLM + tau_unc + P(u > u_th) (B(k) / R + tau_LLM + RTT + t_topk(k))
        s.t.      mean over transmitted tokens (u > u_th) of U_TV(t; k) <= theta_tv
                  mean beta over skipped tokens (u <= u_th) <= risk_budget   (if given)

    with B(k) = k (prob_bits + ceil(log2 V)), R = ``mean_uplink_rate_bps`` (a plug-in: under
    Rayleigh fading E[B/R] = B E[1/R] is infinite, so the ergodic rate E[R] prices the upload)
    and t_topk the device's top-k extraction (:func:`upload_cost_s`). Modes: ``u_th=None`` and
    no grid transmits every token; a fixed ``u_th`` (the paper's offline rule: the objective
    then grows with k, so k* is the smallest k within theta_tv, whatever the rate); or
    ``u_th_grid`` (with ``risk_budget``) for the joint choice, where the rate decides the trade
    between skipping more and sending more entries.

    The cost grows strictly with k at every threshold, so for each threshold only its smallest
    k within theta_tv can be optimal; the programme is built on those candidate k (at most one
    per threshold) and is therefore equivalent to the one over every k, at the size of the
    threshold grid. Feasibility in theta_tv is decided exactly before the solve, and the
    solver minimises the pairs' cost ranks (:func:`_cost_ranks`), which picks the same pair as
    the cost; E[tau] is then evaluated at it. When the chosen u_th skips every token, all k
    cost the same and k* is the smallest k. Infeasible budgets raise
    :class:`InfeasibleBudgetError` naming the binding constraint; dense curves are always
    feasible (k = |V| with nothing skipped). HiGHS's stdout banner is silenced at the
    file-descriptor level (:func:`_stdout_fd_silenced`).
    """
    import cvxpy as cp  # lazily: decoding jobs import this module and never solve

    _validate(curves, latency, theta_tv, u_th, u_th_grid, risk_budget)
    k_values = curves.k_values
    thresholds = _candidate_thresholds(curves, u_th, u_th_grid)
    p_tx = np.array([curves.p_tx(th) for th in thresholds])
    risk = np.array([curves.risk(th) for th in thresholds])
    mean_bound = np.stack([curves.mean_bound(th) for th in thresholds], axis=1)  # [K, J]
    feasible = mean_bound <= theta_tv
    first = np.where(feasible.any(axis=0), feasible.argmax(axis=0), -1)  # [J]
    per_upload = upload_cost_s(k_values, latency)
    base = float(latency["draft_s"] + latency["uncertainty_s"])
    candidates = pd.DataFrame(
        {
            "u_th": [np.nan if th is None else th for th in thresholds],
            "p_tx": p_tx,
            "risk": risk,
            "smallest_feasible_k": np.where(first >= 0, k_values[np.maximum(first, 0)], 0),
            "expected_latency_s": np.where(
                first >= 0, base + p_tx * per_upload[np.maximum(first, 0)], np.nan
            ),
        }
    )
    rows = np.unique(first[first >= 0])
    status, used = cp.INFEASIBLE, solver
    k_idx = j_idx = None
    if rows.size:
        cost = np.outer(per_upload[rows], p_tx)  # [C, J], the variable part of E[tau]
        # Feasibility in theta_tv is decided exactly here; a pair over budget gets a bound no
        # solver tolerance can let through (a mean bound a hair above theta_tv would pass
        # HiGHS's 1e-7 feasibility tolerance, and slow uplinks reward exactly that).
        bound = mean_bound[rows]
        bound = np.where(bound <= theta_tv, bound, theta_tv + 1.0 + bound)
        pick, j_idx, status, used = _solve_mip(
            _cost_ranks(cost), bound, risk, theta_tv, risk_budget, solver
        )
        k_idx = None if pick is None else int(rows[pick])
    if k_idx is None:
        raise _diagnose(mean_bound, risk, thresholds, list(k_values), theta_tv, risk_budget)
    if p_tx[j_idx] == 0:
        k_idx = 0
    slack = {"tvd": float(theta_tv - mean_bound[k_idx, j_idx])}
    if risk_budget is not None:
        slack["risk"] = float(risk_budget - risk[j_idx])
    return KStarSolution(
        k_star=int(k_values[k_idx]),
        u_th=thresholds[j_idx],
        objective_s=base + float(p_tx[j_idx] * per_upload[k_idx]),
        status=status,
        solver=used,
        slack=slack,
        mean_bound=float(mean_bound[k_idx, j_idx]),
        p_tx=float(p_tx[j_idx]),
        risk=float(risk[j_idx]),
        candidates=candidates,
    )


def k_table(
    trace: pd.DataFrame,
    k_grid,
    fit: LinearFit,
    u_th: float | None,
    theta_tv: float,
    latency: dict,
    k_star: int | None = None,
    eta: float = 1.0,
) -> pd.DataFrame:
    """Per grid k at threshold ``u_th``, over the transmitted calibration tokens: ``k``,
    ``payload_bits``, ``mean_online_bound``, ``mean_measured_tvd`` (TVD(r, r_hat)),
    ``mean_output_tvd`` (TVD(y_hat, y), where the trace has ``otvd_{k}``), how often the online
    and the provable bound hold for each (``*_holds_fraction`` and
    ``*_holds_output_fraction``), ``expected_latency_s``, ``tvd_feasible`` and ``chosen``
    (k == ``k_star``; none when k* is not on the grid)."""
    grid = sorted(int(k) for k in k_grid)
    columns = ["u", "beta", "x_d"] + [f"{c}_{k}" for k in grid for c in ("nk", "tvd")]
    missing = [c for c in columns if c not in trace.columns]
    if missing:
        raise KeyError(f"trace is missing columns {missing}")
    u = trace["u"].to_numpy(np.float64)
    x_d = trace["x_d"].to_numpy(np.float64)
    beta = trace["beta"].to_numpy(np.float64)
    nk = trace[[f"nk_{k}" for k in grid]].to_numpy(np.float64)
    denominator = online_bound_denominator(x_d, beta_hat(u, fit), eta)
    bounds = nk / denominator[:, None]
    provable = provable_bound(nk, x_d[:, None], beta[:, None])
    mask = np.ones_like(u, bool) if u_th is None else u > u_th
    any_tx = bool(mask.any())

    def masked_mean(values: np.ndarray) -> np.ndarray:
        return values[mask].mean(axis=0) if any_tx else np.full(len(grid), np.nan)

    tvd = trace[[f"tvd_{k}" for k in grid]].to_numpy(np.float64)
    mean_bound = masked_mean(bounds)
    table = {
        "k": grid,
        "payload_bits": upload_bits(
            np.asarray(grid), int(latency["vocab_size"]), int(latency["prob_bits"])
        ).astype(np.int64),
        "mean_online_bound": mean_bound,
        "mean_measured_tvd": masked_mean(tvd),
        "online_bound_holds_fraction": masked_mean(bounds + HOLDS_ATOL >= tvd),
        "provable_bound_holds_fraction": masked_mean(provable + HOLDS_ATOL >= tvd),
    }
    if all(f"otvd_{k}" in trace.columns for k in grid):
        output = trace[[f"otvd_{k}" for k in grid]].to_numpy(np.float64)
        table["mean_output_tvd"] = masked_mean(output)
        table["online_bound_holds_output_fraction"] = masked_mean(bounds + HOLDS_ATOL >= output)
        table["provable_bound_holds_output_fraction"] = masked_mean(provable + HOLDS_ATOL >= output)
    p_tx = float(mask.mean())
    table["expected_latency_s"] = float(
        latency["draft_s"] + latency["uncertainty_s"]
    ) + p_tx * upload_cost_s(np.asarray(grid), latency)
    table["tvd_feasible"] = np.nan_to_num(mean_bound, nan=0.0) <= theta_tv
    table["chosen"] = np.asarray(grid) == (k_star if k_star is not None else -1)
    return pd.DataFrame(table)
