"""Channel-aware relabeling of draft/target mismatches (WISV, methods §4.2).

The formulation below is this project's own reconstruction: the WISV paper's relabeling
objective is not public (docs/methods.md §9).

A mismatch j (the draft token differs from the target's) carries a risk r_j in [0, 1], the
probability that accepting the draft token changes the answer (label mining, methods §4.2:
0/1 where the answers decide, graded 1 - similarity elsewhere). Under one CSI sample c the edge
can

- *repair* it (z_j = 1): commit the target's token, which ends the round early, so the answer
  needs about one more interaction round, costing C_rep(c) (``edgespec.wisv.csi``
  ``repair_cost_rounds``: in rounds of compute T_0, so 1 plus the round's communication over
  T_0); or
- *skip* it (z_j = 0): accept the draft token and risk the answer with probability r_j.

Per group of mismatches (one prompt's response, J mismatches) we solve the boolean programme

    min_z  sum_j z_j * C_rep(c) + lam * sum_j (1 - z_j) * r_j
    s.t.   sum_j (1 - z_j) * r_j <= risk_budget * J           (only if risk_budget is given)
           z in {0, 1}^J

Units: C_rep and ``lam`` share a unit; the workflow states both in rounds of compute, so lam
(rounds per unit risk) is how many rounds one would pay to avoid one expected answer change, the
same trade-off on any machine. Without the budget the problem separates: repair j iff
r_j > C_rep(c) / lam, and a worse channel (larger C_rep) raises that bar. ``risk_budget`` is the
mean skipped risk allowed per mismatch, a hard accuracy guard whatever the channel.

Ties are broken deterministically: among the optimal z, the solver's second stage picks the one
minimising sum_j (j + 1) z_j (j the mismatch's order in the response), i.e. fewer repairs and,
at equal count, the earliest mismatches repaired (an early change propagates through more of the
answer). Without this, equal 0/1 risks left the choice to the solver.

Structure (used by the tests as a check, not by the code): for a fixed number k of repairs,
repairing the k highest-risk mismatches both minimises the objective and maximises the slack in
the budget, and the objective's increments C_rep - lam * r_(k) grow with k. The optimum is
therefore "repair the top k", with k = max(k_free, k_budget): k_free = #{j : lam * r_j > C_rep}
and k_budget the fewest repairs that meet the budget. k_free falls as C_rep grows, and k_budget
does not depend on the channel, so a worse channel never makes fewer mismatches safe.

:func:`relabel_under_csi` is rule relabel_csi: CSI samples spanning the evaluation channels
(``edgespec.wisv.csi``), each priced with its own repair cost (:func:`price_csi_samples`), and
the programme per (sample, prompt).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import cvxpy as cp
import numpy as np
import pandas as pd

from edgespec.wireless.arq import ArqSettings
from edgespec.wisv.csi import (
    CsiSample,
    csi_ranges,
    per_fit,
    repair_cost_rounds,
    round_compute_s,
    sample_csi,
)
from edgespec.wisv.protocols import fh_payload
from edgespec.wisv.regimes import Pricing

log = logging.getLogger(__name__)

FEATURE_PREFIX = "phi_"
"""Prefix of the CSI feature columns (phi(c) in methods §4.1) in ``relabel_over_csi``'s output."""

_SOLVERS = ("HIGHS", "SCIPY")
_FEASIBILITY_TOL = 1e-6
_SOLVER_OPTIONS: dict[str, dict[str, Any]] = {
    # A zero MIP gap makes the solver prove optimality (the default 1e-4 may stop early).
    "HIGHS": {"output_flag": False, "mip_rel_gap": 0.0},
    "SCIPY": {"scipy_options": {"mip_rel_gap": 0.0}},
}


class RelabelError(ValueError):
    """The relabeling problem is infeasible, unsolved, or given invalid inputs."""


@lru_cache(maxsize=64)
def _problem(num: int) -> tuple[cp.Problem, cp.Variable, dict[str, cp.Parameter]]:
    """A parametrised (DPP) problem for J = num mismatches, compiled once and reused."""
    z = cp.Variable(num, boolean=True)
    params = {
        "cost": cp.Parameter(nonneg=True),
        "lam_risk": cp.Parameter(num, nonneg=True),
        "risk": cp.Parameter(num, nonneg=True),
        "budget": cp.Parameter(),
    }
    objective = cp.Minimize(params["cost"] * cp.sum(z) + params["lam_risk"] @ (1 - z))
    constraints = [params["risk"] @ (1 - z) <= params["budget"]]
    return cp.Problem(objective, constraints), z, params


@lru_cache(maxsize=64)
def _tiebreak_problem(num: int) -> tuple[cp.Problem, cp.Variable, dict[str, cp.Parameter]]:
    """Second stage: among z within ``optimum`` of the first stage's objective, the smallest
    sum_j (j + 1) z_j."""
    z = cp.Variable(num, boolean=True)
    params = {
        "cost": cp.Parameter(nonneg=True),
        "lam_risk": cp.Parameter(num, nonneg=True),
        "risk": cp.Parameter(num, nonneg=True),
        "budget": cp.Parameter(),
        "optimum": cp.Parameter(),
    }
    primary = params["cost"] * cp.sum(z) + params["lam_risk"] @ (1 - z)
    order = np.arange(1, num + 1, dtype=np.float64)
    constraints = [
        params["risk"] @ (1 - z) <= params["budget"],
        primary <= params["optimum"],
    ]
    return cp.Problem(cp.Minimize(order @ z), constraints), z, params


TIE_TOLERANCE = 1e-7
"""Relative slack on the optimal objective within which z counts as optimal (second stage)."""


def _solve(problem: cp.Problem, z: cp.Variable, solver: str) -> tuple[np.ndarray, float]:
    order = [solver] + [s for s in _SOLVERS if s != solver]
    installed = set(cp.installed_solvers())
    errors = []
    for name in order:
        if name not in installed:
            errors.append(f"{name}: not installed")
            continue
        try:
            problem.solve(solver=name, **_SOLVER_OPTIONS.get(name, {}))
        except cp.error.SolverError as exc:
            errors.append(f"{name}: {exc}")
            continue
        status = problem.status
        if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
            raise _Infeasible()
        if status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and z.value is not None:
            return np.asarray(z.value) > 0.5, float(problem.value)
        errors.append(f"{name}: status {status}")
    raise RelabelError("relabeling not solved: " + "; ".join(errors))


class _Infeasible(Exception):
    pass


def relabel_mismatches(
    risk: np.ndarray,
    repair_cost: float,
    lam: float,
    risk_budget: float | None,
    solver: str = "HIGHS",
) -> np.ndarray:
    """Solve the relabeling programme (module docstring) for one group; True = repair.

    ``risk`` [J] in [0, 1], in the group's order (position in the response); ``repair_cost``
    = C_rep(c) and ``lam`` (per unit risk) in one unit, e.g. rounds; ``risk_budget`` the
    allowed mean skipped risk per mismatch (None: no budget). Two cvxpy boolean programmes are
    solved, by ``solver`` first ("HIGHS") and, should that fail or be missing, by the other of
    HIGHS/SCIPY: the optimum, then the deterministic tie-break among optimal z. Raises
    RelabelError if the budget is infeasible (only a negative budget is: repairing everything
    skips no risk).
    """
    risk = np.asarray(risk, dtype=np.float64)
    if risk.ndim != 1:
        raise RelabelError(f"risk must be 1-D, got shape {risk.shape}")
    if not np.all(np.isfinite(risk)) or np.any(risk < 0) or np.any(risk > 1):
        raise RelabelError("risk must lie in [0, 1]")
    if not (math.isfinite(repair_cost) and repair_cost >= 0):
        raise RelabelError(f"repair_cost must be finite and >= 0, got {repair_cost}")
    if not (math.isfinite(lam) and lam >= 0):
        raise RelabelError(f"lam must be finite and >= 0 (per unit risk), got {lam}")
    if risk_budget is not None and not math.isfinite(risk_budget):
        raise RelabelError(f"risk_budget must be finite or None, got {risk_budget}")
    num = risk.shape[0]
    if num == 0:
        return np.zeros(0, dtype=bool)

    # Without a budget the constraint is made slack: skipping everything skips sum(risk).
    bound = float(risk.sum()) + 1.0 if risk_budget is None else float(risk_budget) * num
    values = {
        "cost": float(repair_cost),
        "lam_risk": lam * risk,
        "risk": risk,
        "budget": bound,
    }
    problem, z, params = _problem(num)
    for key, value in values.items():
        params[key].value = value
    try:
        _, optimum = _solve(problem, z, solver)
        problem, z, params = _tiebreak_problem(num)
        for key, value in values.items():
            params[key].value = value
        params["optimum"].value = optimum + TIE_TOLERANCE * max(1.0, abs(optimum))
        decision, _ = _solve(problem, z, solver)
    except _Infeasible:
        raise RelabelError(
            f"relabeling infeasible: risk_budget={risk_budget} allows a total skipped risk "
            f"of {bound:g} over {num} mismatches; the budget must be >= 0"
        ) from None
    skipped = float(risk[~decision].sum())
    if skipped > bound + _FEASIBILITY_TOL * max(1.0, num):
        raise RelabelError("the solver returned a solution that breaks the budget")
    return decision


def _check_csi_samples(csi_samples: Sequence[Mapping[str, Any]]) -> list[str]:
    if len(csi_samples) == 0:
        raise RelabelError("csi_samples is empty")
    names: list[str] | None = None
    for i, sample in enumerate(csi_samples):
        if "features" not in sample or "repair_cost" not in sample:
            raise RelabelError(f"csi sample {i} needs 'features' and 'repair_cost'")
        keys = list(sample["features"])
        if names is None:
            names = keys
        elif set(keys) != set(names):
            raise RelabelError(f"csi sample {i} has features {keys}, expected {names}")
    return list(names or [])


def relabel_over_csi(
    mismatches: pd.DataFrame,
    csi_samples: Sequence[Mapping[str, Any]],
    lam: float,
    risk_budget: float | None,
    group_by: str = "prompt_id",
    solver: str = "HIGHS",
) -> pd.DataFrame:
    """Relabel every mismatch under every CSI sample: one optimisation per (sample, group).

    ``mismatches`` has columns ``group_by`` (prompt id), ``risk`` (soft risk in [0, 1]) and
    ``label`` (base label, 0 safe / 1 important); if ``risk`` is absent the hard label is used
    as the risk; rows of a group are taken in their order in ``mismatches`` (the tie-break's
    order: sort by position). Each CSI sample is ``{"features": {name: value},
    "repair_cost": float}`` (features e.g. from ``edgespec.wisv.csi.CsiSample.features``, the
    cost in the unit of ``lam``, e.g. ``repair_cost_rounds``).

    Returns one row per (mismatch, CSI sample), ordered by sample then mismatch, with columns
    ``mismatch`` (the index label in ``mismatches``), ``group_by``, ``csi_sample`` (position in
    ``csi_samples``), ``phi_<name>`` per CSI feature, ``repair_cost``, ``risk``, ``label``
    (base) and ``label_csi`` (1 = repair/important, 0 = safe to accept under this CSI).
    """
    if group_by not in mismatches.columns:
        raise RelabelError(f"mismatches lacks the group column {group_by!r}")
    if "risk" in mismatches.columns:
        risk = mismatches["risk"].to_numpy(dtype=np.float64)
    elif "label" in mismatches.columns:
        risk = mismatches["label"].to_numpy(dtype=np.float64)
    else:
        raise RelabelError("mismatches needs a 'risk' or a 'label' column")
    names = _check_csi_samples(csi_samples)
    if "label" in mismatches.columns:
        base = mismatches["label"].to_numpy()
    else:
        base = np.full(len(mismatches), -1)

    groups = mismatches[group_by].to_numpy()
    positions = pd.Series(np.arange(len(mismatches))).groupby(groups, sort=False).indices
    frames = []
    for sample_id, sample in enumerate(csi_samples):
        cost = float(sample["repair_cost"])
        repair = np.zeros(len(mismatches), dtype=bool)
        for group, pos in positions.items():
            try:
                repair[pos] = relabel_mismatches(risk[pos], cost, lam, risk_budget, solver)
            except RelabelError as exc:
                raise RelabelError(f"csi sample {sample_id}, {group_by}={group!r}: {exc}") from exc
        frame = {
            "mismatch": mismatches.index.to_numpy(),
            group_by: groups,
            "csi_sample": np.full(len(mismatches), sample_id),
        }
        for name in names:
            frame[FEATURE_PREFIX + name] = np.full(len(mismatches), sample["features"][name])
        frame.update(
            {
                "repair_cost": np.full(len(mismatches), cost),
                "risk": risk,
                "label": base,
                "label_csi": repair.astype(np.int64),
            }
        )
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True)


def csi_feature_columns(relabeled: pd.DataFrame) -> list[str]:
    """The ``phi_<name>`` CSI feature columns of a ``relabel_over_csi`` result, in order."""
    return [c for c in relabeled.columns if str(c).startswith(FEATURE_PREFIX)]


def safe_fraction_by_channel(relabeled: pd.DataFrame) -> pd.DataFrame:
    """Per CSI sample: how many mismatches became safe, sorted by repair cost.

    Columns: ``csi_sample``, the CSI feature columns, ``repair_cost``, ``n_mismatches``,
    ``n_safe``, ``safe_fraction`` and ``skipped_risk_mean`` (mean risk skipped per mismatch,
    the quantity the risk budget bounds).
    """
    features = csi_feature_columns(relabeled)
    frame = relabeled.assign(
        _safe=(relabeled["label_csi"] == 0).astype(np.int64),
        _skipped_risk=np.where(relabeled["label_csi"] == 0, relabeled["risk"], 0.0),
    )
    out = frame.groupby(["csi_sample", *features, "repair_cost"], sort=False, dropna=False).agg(
        n_mismatches=("_safe", "size"),
        n_safe=("_safe", "sum"),
        skipped_risk_mean=("_skipped_risk", "mean"),
    )
    out = out.reset_index()
    out["safe_fraction"] = out["n_safe"] / out["n_mismatches"]
    columns = [
        "csi_sample",
        *features,
        "repair_cost",
        "n_mismatches",
        "n_safe",
        "safe_fraction",
        "skipped_risk_mean",
    ]
    return out[columns].sort_values(["repair_cost", "csi_sample"], ignore_index=True)


TRADE_OFF_KEYS = (
    "wisv.relabel.lam_rounds_per_risk",
    "wisv.relabel.risk_budget",
    "wisv.similarity_threshold",
    "wisv.relabel.snr_db_range",
    "wisv.relabel.bandwidth_hz_range",
    "wisv.relabel.rtt_s_range",
)
"""The config keys that set the relabeling trade-off (named when a label set has one class)."""


def check_two_classes(labels: Any, what: str, detail: str = "") -> None:
    """RelabelError unless ``labels`` (1 = important, 0 = safe) hold both classes; the message
    gives the counts and names the config keys that set the trade-off, so that a one-class label
    set stops the workflow here and not in head training."""
    labels = np.asarray(labels)
    important = int((labels == 1).sum())
    safe = int((labels == 0).sum())
    if important and safe:
        return
    raise RelabelError(
        f"{what}: {safe} safe and {important} important of {len(labels)}{detail}; a decision "
        f"head needs both classes. The trade-off is set by {', '.join(TRADE_OFF_KEYS)} (and "
        "the prompts mined: data.datasets, data.calib_fraction)."
    )


def price_csi_samples(
    samples: Sequence[CsiSample],
    feature_names: Sequence[str],
    uplink_bits: float,
    round_compute: float,
    arq: ArqSettings | None = None,
) -> list[dict[str, Any]]:
    """Each CSI sample as :func:`relabel_over_csi` takes it: its features ``feature_names``
    and its own repair cost [rounds] (``csi.repair_cost_rounds`` of that sample, for an upload
    of ``uplink_bits`` [bit], a round of compute ``round_compute`` [s] and retransmissions under
    ``arq``)."""
    return [
        {
            "features": sample.features(feature_names),
            "repair_cost": repair_cost_rounds(sample, uplink_bits, round_compute, arq),
        }
        for sample in samples
    ]


@dataclass(frozen=True)
class Relabeling:
    """Rule relabel_csi's results: the relabeled rows (:func:`relabel_over_csi`), the safe
    fraction per CSI sample (:func:`safe_fraction_by_channel` with each sample's
    ``CsiSample.describe``) and the summary."""

    relabeled: pd.DataFrame
    safe: pd.DataFrame
    summary: dict[str, Any]


def relabel_under_csi(
    table: pd.DataFrame,
    pricing: Pricing,
    channels: Mapping[str, Mapping[str, Any]],
    wisv: Mapping[str, Any],
    rng: np.random.Generator,
    source: str = "the mined labels",
) -> Relabeling:
    """Relabel the mined mismatches ``table`` (``labels.LABEL_COLUMNS``, read from ``source``)
    under CSI samples spanning the evaluation ``channels``, drawn from ``rng``, priced under
    one regime's ``pricing`` (``edgespec.wisv.regimes``).

    ``wisv`` holds config keys wisv.relabel (gamma, num_csi_samples, lam_rounds_per_risk,
    risk_budget, the ``*_range`` overrides), wisv.correlation, wisv.csi_features and wisv.arq.
    A repair is priced per sample (:func:`price_csi_samples`) with the FH upload of one
    gamma-token round at the regime's sizes (``pricing.protocol``), T_0 of its profile and its
    CSI head's time, and the retransmissions of wisv.arq. Each prompt's mismatches are
    relabeled in response order (the programme's tie-break repairs earlier ones). Raises
    RelabelError where the mined or the relabeled labels hold one class only.
    """
    cfg = wisv["relabel"]
    check_two_classes(table["label"], f"the mined labels ({source})")
    gamma = cfg["gamma"]
    protocol = pricing.protocol
    uplink_bits = fh_payload(
        gamma, protocol["vocab_size"], protocol["hidden_size"], protocol["bits_per_value"]
    ).uplink_bits
    head_s = float(pricing.head_times["head_round_s"]["wisv_head"])
    round_compute = round_compute_s(pricing.profile, gamma, head_s)
    ranges = csi_ranges(channels, cfg)
    samples = sample_csi(
        ranges, cfg["num_csi_samples"], rng, wisv["correlation"], per_fit(channels)
    )
    arq = ArqSettings.from_dict(wisv.get("arq"))
    csi = price_csi_samples(samples, wisv["csi_features"], uplink_bits, round_compute, arq)
    costs = [c["repair_cost"] for c in csi]
    ordered = table.sort_values(["prompt_id", "position"], kind="stable")
    relabeled = relabel_over_csi(ordered, csi, cfg["lam_rounds_per_risk"], cfg["risk_budget"])
    described = pd.DataFrame([{"csi_sample": i, **s.describe()} for i, s in enumerate(samples)])
    safe = safe_fraction_by_channel(relabeled).merge(described, on="csi_sample")
    safe_before = float((table["label"] == 0).mean())
    log.info(
        "%s: T_0 = %.4f s per round; repair costs %.3f to %.3f rounds; safe fraction from %.3f "
        "(best channel) to %.3f (worst), %.3f before relabeling",
        pricing.regime,
        round_compute,
        min(costs),
        max(costs),
        safe["safe_fraction"].iloc[0],
        safe["safe_fraction"].iloc[-1],
        safe_before,
    )
    check_two_classes(
        relabeled["label_csi"],
        "the relabeled labels",
        f" rows ({len(table)} mismatches x {len(samples)} CSI samples; repair costs "
        f"{min(costs):.3f} to {max(costs):.3f} rounds of T_0 = {round_compute:.3f} s)",
    )
    summary = {
        "regime": pricing.regime,
        "round_compute_s": round_compute,
        "uplink_bits": uplink_bits,
        "ranges": {k: list(v) for k, v in ranges.items()},
        "correlation": wisv["correlation"],
        "lam_rounds_per_risk": cfg["lam_rounds_per_risk"],
        "risk_budget": cfg["risk_budget"],
        "csi_samples": len(samples),
        "mismatches": len(table),
        "safe_before": safe_before,
        "safe_best_channel": float(safe["safe_fraction"].iloc[0]),
        "safe_worst_channel": float(safe["safe_fraction"].iloc[-1]),
        "safe_after": float((relabeled["label_csi"] == 0).mean()),
        "repair_cost_rounds": [min(costs), max(costs)],
    }
    return Relabeling(relabeled, safe, summary)
