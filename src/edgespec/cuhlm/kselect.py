"""Choosing the top-k upload size for CU-HLM (methods §3.4).

The device knows x, its sampled token d, x_d and its uncertainty u. For each k it can compute
N_k = ||x - x_hat_k||_1 (:func:`reconstruction_errors_all_k`, one sort per row). Two bounds on
the resampling distortion TVD(r, r_hat_k) use it:

- the provable bound N_k / (x_d beta_d) (:func:`provable_bound`; needs the target's y, so it is
  for offline evaluation only): (.)^+ is 1-Lipschitz, so the unnormalised residuals differ by at
  most N_k in L1, normalising gives TVD <= N_k / Z, and Z = ||(y - x)^+||_1 >= x_d beta_d;
- the online bound U_TV(t; k) = N_k / [(1 - x_d) softplus(-1) + x_d softplus(-beta_hat)], with
  beta_hat = clip(a u + b, 0, 1) from the calibration fit. This denominator is the CU-HLM
  paper's eq. (26) as reconstructed from a public replication (docs/methods.md §3.4); it is a
  device-side surrogate for Z, not a proven lower bound, and the evaluation reports how often
  it holds.

CU-HLM online picks k(t) per token (:func:`online_k`); CU-HLM offline picks one k* on a
calibration trace by a small mixed-integer programme (:func:`optimize_k_star`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np
import pandas as pd
import torch

from edgespec.cuhlm.calibration import LinearFit
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


def softplus(z, eta: float = 1.0):
    """l_eta(z) = (1 / eta) log(1 + exp(eta z)), elementwise, stable for large |z|.

    Accepts floats, numpy arrays and torch tensors (a tensor in gives a tensor out).
    """
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if isinstance(z, torch.Tensor):
        return torch.logaddexp(torch.zeros_like(z), eta * z) / eta
    out = np.logaddexp(0.0, eta * np.asarray(z, dtype=np.float64)) / eta
    return float(out) if np.ndim(out) == 0 else out


def beta_hat(u, fit: LinearFit):
    """Device-side estimate of the rejection probability, clip(a u + b, 0, 1)."""
    if isinstance(u, torch.Tensor):
        return (fit.a * u.to(torch.float64) + fit.b).clamp(0.0, 1.0)
    out = np.clip(fit.a * np.asarray(u, dtype=np.float64) + fit.b, 0.0, 1.0)
    return float(out) if np.ndim(out) == 0 else out


def online_bound_denominator(x_d, beta_hat_d, eta: float = 1.0):
    """(1 - x_d) softplus(-1) + x_d softplus(-beta_hat): the online bound's denominator.

    Reconstructed form of CU-HLM eq. (26) (from a public replication, not the paper's text);
    it lies in [softplus(-1), softplus(0)] = [0.313, 0.693] for eta = 1.
    """
    return (1 - x_d) * softplus(-1.0, eta) + x_d * softplus(-beta_hat_d, eta)


def reconstruction_errors_all_k(probs: torch.Tensor) -> torch.Tensor:
    """N_k = ||x - x_hat_k||_1 for every k = 1..V: a [B, V] float64 tensor, column k-1 is N_k.

    One descending sort and one prefix sum per row, then one batched ``searchsorted``: with
    S_k the top-k mass, the tail level l_k = (1 - S_k)^+ / (V - k) (the edge's reconstruction,
    as in :func:`edgespec.decoding.compression.reconstruct_topk`) and T_k the tail mass, the
    tail entries >= l_k form a prefix of the sorted tail, of length m_k and sum H_k, and
    N_k = 2 (H_k - m_k l_k) + (V - k) l_k - T_k. N_V = 0.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be [B, V], got shape {tuple(probs.shape)}")
    batch, vocab = probs.shape
    x = probs.to(torch.float64)
    desc = x.sort(dim=-1, descending=True).values
    prefix = torch.cumsum(desc, dim=-1)  # prefix[:, k-1] = S_k
    padded = torch.cat([x.new_zeros(batch, 1), prefix], dim=1)  # padded[:, k] = S_k
    k = torch.arange(1, vocab + 1, device=probs.device)
    tail_size = (vocab - k).to(torch.float64)
    tail_mass = prefix[:, -1:] - prefix
    level = (1 - prefix).clamp_min(0) / tail_size.clamp_min(1)
    ascending = desc.flip(-1).contiguous()
    # Entries >= level form a prefix of the descending row; the first k of them are kept.
    count_ge = vocab - torch.searchsorted(ascending, level.contiguous(), right=False)
    above = torch.minimum((count_ge - k).clamp_min(0), vocab - k)
    above_sum = padded.gather(1, k.expand(batch, vocab) + above) - prefix
    errors = 2 * (above_sum - above * level) + tail_size * level - tail_mass
    return torch.where(tail_size > 0, errors.clamp_min(0), torch.zeros_like(errors))


def online_k(
    probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    u,
    fit: LinearFit,
    theta_tv: float,
    k_max: int | None = None,
    eta: float = 1.0,
) -> torch.Tensor:
    """CU-HLM online: per row, the smallest k with U_TV(t; k) <= theta_tv (methods §3.4).

    Device information only: ``probs`` [B, V] (x), ``draft_tokens`` [B] (d), ``u`` [B] (or a
    scalar) and the calibration ``fit``. k is searched in 1..k_max (default V); a row with no
    such k gets k_max (with the default, k = V always qualifies since N_V = 0). DuoDecoding's
    fallback min(300, V/100) is the caller's choice of ``k_max``. Returns a long tensor [B].
    """
    batch, vocab = probs.shape
    cap = vocab if k_max is None else int(k_max)
    if not 1 <= cap <= vocab:
        raise ValueError(f"k_max must lie in [1, {vocab}], got {k_max}")
    errors = reconstruction_errors_all_k(probs)[:, :cap]
    x_d = probs.to(torch.float64).gather(1, draft_tokens.view(batch, 1).long()).squeeze(1)
    u_t = torch.as_tensor(u, dtype=torch.float64, device=probs.device).expand(batch)
    denominator = online_bound_denominator(x_d, beta_hat(u_t, fit), eta)
    meets = errors / denominator.unsqueeze(1) <= theta_tv
    first = meets.to(torch.int8).argmax(dim=1) + 1
    return torch.where(meets.any(dim=1), first, torch.full_like(first, cap)).long()


def provable_bound(nk, x_d, beta):
    """N_k / (x_d beta_d), broadcasting; inf where x_d beta_d == 0 < N_k, 0 where N_k == 0.

    A rigorous bound on TVD(r, r_hat_k) (module docstring); needs beta_d, i.e. the target.
    """
    if isinstance(nk, torch.Tensor):
        nk = nk.to(torch.float64)
        den = torch.as_tensor(x_d, dtype=torch.float64) * torch.as_tensor(beta, dtype=torch.float64)
        ratio = nk / torch.where(den > 0, den, torch.ones_like(den))
        return torch.where(nk == 0, 0.0, torch.where(den > 0, ratio, math.inf))
    nk = np.asarray(nk, dtype=np.float64)
    den = np.asarray(x_d, dtype=np.float64) * np.asarray(beta, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = nk / np.where(den > 0, den, 1.0)
    out = np.where(nk == 0, 0.0, np.where(den > 0, ratio, np.inf))
    return float(out) if out.ndim == 0 else out


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
    ``table``: per grid k at the chosen u_th (transmitted tokens only): ``k``,
    ``payload_bits``, ``mean_online_bound``, ``mean_measured_tvd``,
    ``online_bound_holds_fraction`` (U_TV >= measured TVD), ``provable_bound_holds_fraction``,
    ``expected_latency_s``, ``tvd_feasible``, ``chosen``.
    """

    k_star: int
    u_th: float | None
    objective_s: float
    status: str
    solver: str
    slack: dict[str, float] = field(default_factory=dict)
    table: pd.DataFrame = field(default_factory=pd.DataFrame)


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


def _online_bounds(trace: pd.DataFrame, k_grid: list[int], fit: LinearFit, eta: float):
    x_d = trace["x_d"].to_numpy(np.float64)
    denominator = online_bound_denominator(x_d, beta_hat(trace["u"].to_numpy(np.float64), fit), eta)
    nk = trace[[f"nk_{k}" for k in k_grid]].to_numpy(np.float64)
    return nk / denominator[:, None], nk


def _validate(trace, k_grid, latency, theta_tv, u_th, u_th_grid, risk_budget) -> list[int]:
    if not k_grid:
        raise ValueError("k_grid is empty")
    grid = sorted(int(k) for k in k_grid)
    if len(set(grid)) != len(grid):
        raise ValueError(f"k_grid has duplicates: {k_grid}")
    missing_keys = [key for key in LATENCY_KEYS if key not in latency]
    if missing_keys:
        raise ValueError(f"latency is missing {missing_keys}")
    vocab = int(latency["vocab_size"])
    if grid[0] < 1 or grid[-1] > vocab:
        raise ValueError(f"k_grid must lie in [1, vocab_size={vocab}], got {grid}")
    if latency["mean_uplink_rate_bps"] <= 0:
        raise ValueError("mean_uplink_rate_bps must be > 0")
    columns = ["u", "beta", "x_d"] + [f"{c}_{k}" for k in grid for c in ("nk", "tvd")]
    missing = [c for c in columns if c not in trace.columns]
    if missing:
        raise KeyError(f"trace is missing columns {missing}")
    if len(trace) == 0:
        raise ValueError("trace is empty")
    if theta_tv < 0:
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
    return grid


def _candidate_thresholds(u: np.ndarray, u_th, u_th_grid) -> list[float | None]:
    """Thresholds to consider. Grid values that skip the same set of tokens are equivalent
    (u lives on the 1/M lattice); only the smallest of each group is kept."""
    if u_th_grid is None:
        return [None if u_th is None else float(u_th)]
    u_sorted = np.sort(u)
    kept: list[float | None] = []
    seen: set[int] = set()
    for value in sorted(float(v) for v in u_th_grid):
        count = int(np.searchsorted(u_sorted, value, side="right"))
        if count not in seen:
            seen.add(count)
            kept.append(value)
    return kept


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


def optimize_k_star(
    trace: pd.DataFrame,
    k_grid: list[int],
    fit: LinearFit,
    theta_tv: float,
    latency: dict,
    u_th: float | None = None,
    u_th_grid: list[float] | None = None,
    risk_budget: float | None = None,
    solver: str = "HIGHS",
    eta: float = 1.0,
) -> KStarSolution:
    """CU-HLM offline: one k* (optionally jointly with u_th) minimising expected latency.

    Mixed-integer programme (cvxpy; HiGHS, falling back to SciPy's ``milp``) over the grid:

        minimise  E[tau] = tau_SLM + tau_unc + P(u > u_th) (B(k) / R + tau_LLM + RTT)
        s.t.      mean over transmitted tokens (u > u_th) of U_TV(t; k) <= theta_tv
                  mean beta over skipped tokens (u <= u_th) <= risk_budget   (if given)

    with B(k) = k (prob_bits + ceil(log2 V)) and R = ``mean_uplink_rate_bps`` (E[tau] uses
    B(k)/R at that rate: pass a harmonic-mean rate for E[B/R] under fading). U_TV(t; k) is the
    online bound from the trace's ``nk_{k}``, ``x_d`` and beta_hat(u). Modes: ``u_th=None``
    and no grid transmits every token; a fixed ``u_th``; or ``u_th_grid`` (with
    ``risk_budget``) for the joint choice. When the chosen u_th skips every token, all k cost
    the same and k* is the smallest grid k. Infeasible budgets raise
    :class:`InfeasibleBudgetError` naming the binding constraint. HiGHS's stdout banner is
    silenced at the file-descriptor level (:func:`_stdout_fd_silenced`).

    The trace has one row per generated token of a standard-HLM run with every token
    transmitted, with columns ``u``, ``beta``, ``x_d`` and ``nk_{k}``, ``tvd_{k}`` per grid k.
    """
    grid = _validate(trace, k_grid, latency, theta_tv, u_th, u_th_grid, risk_budget)
    u = trace["u"].to_numpy(np.float64)
    beta = trace["beta"].to_numpy(np.float64)
    x_d = trace["x_d"].to_numpy(np.float64)
    bounds, nk = _online_bounds(trace, grid, fit, eta)
    thresholds = _candidate_thresholds(u, u_th, u_th_grid)

    masks = [np.ones_like(u, bool) if th is None else u > th for th in thresholds]
    p_tx = np.array([m.mean() for m in masks])
    mean_bound = np.stack(
        [bounds[m].mean(axis=0) if m.any() else np.zeros(len(grid)) for m in masks], axis=1
    )  # [K, J]
    risk = np.array([beta[~m].mean() if (~m).any() else 0.0 for m in masks])  # [J]

    vocab = int(latency["vocab_size"])
    bits = np.array([upload_bits(k, vocab, int(latency["prob_bits"])) for k in grid], float)
    per_upload = (
        bits / float(latency["mean_uplink_rate_bps"]) + latency["target_s"] + latency["rtt_s"]
    )
    cost = np.outer(per_upload, p_tx)  # [K, J], the variable part of E[tau]
    base = float(latency["draft_s"] + latency["uncertainty_s"])

    k_idx, j_idx, status, used = _solve_mip(cost, mean_bound, risk, theta_tv, risk_budget, solver)
    if k_idx is None:
        error = _diagnose(mean_bound, risk, thresholds, grid, theta_tv, risk_budget)
        feasible_pairs = (mean_bound <= theta_tv) & (
            True if risk_budget is None else (risk <= risk_budget)[None, :]
        )
        if feasible_pairs.any():
            raise RuntimeError(
                f"{used} reported the k* programme {status}, but enumeration finds a feasible "
                f"(k, u_th) pair; diagnosis would have been: {error}"
            )
        raise error
    if p_tx[j_idx] == 0:
        k_idx = 0

    mask = masks[j_idx]
    tvd = trace[[f"tvd_{k}" for k in grid]].to_numpy(np.float64)
    provable = provable_bound(nk, x_d[:, None], beta[:, None])
    any_tx = bool(mask.any())

    def masked_mean(values: np.ndarray) -> np.ndarray:
        return values[mask].mean(axis=0) if any_tx else np.full(len(grid), np.nan)

    table = pd.DataFrame(
        {
            "k": grid,
            "payload_bits": bits.astype(np.int64),
            "mean_online_bound": masked_mean(bounds),
            "mean_measured_tvd": masked_mean(tvd),
            "online_bound_holds_fraction": masked_mean(bounds + HOLDS_ATOL >= tvd),
            "provable_bound_holds_fraction": masked_mean(provable + HOLDS_ATOL >= tvd),
            "expected_latency_s": base + cost[:, j_idx],
            "tvd_feasible": mean_bound[:, j_idx] <= theta_tv,
            "chosen": np.arange(len(grid)) == k_idx,
        }
    )
    slack = {"tvd": float(theta_tv - mean_bound[k_idx, j_idx])}
    if risk_budget is not None:
        slack["risk"] = float(risk_budget - risk[j_idx])
    return KStarSolution(
        k_star=grid[k_idx],
        u_th=thresholds[j_idx],
        objective_s=base + float(cost[k_idx, j_idx]),
        status=status,
        solver=used,
        slack=slack,
        table=table,
    )
