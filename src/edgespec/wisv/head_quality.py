"""What the trained WISV heads show on held-out mismatches (rule train_head; methods §4.2).

- :func:`heldout_auc`: each head's ROC AUC on the original labels of the validation
  mismatches (the CSI head's q averaged over the relabeling's CSI states, the score its tau is
  chosen on), with a percentile bootstrap interval over validation prompts;
- :func:`accept_by_state`: the CSI head's accept rate (q >= tau) on the validation mismatches
  under each CSI state, beside that state's repair cost and the relabeled safe fraction: does
  the policy move with the channel;
- :func:`learning_curve`: a head's held-out AUC against the number of training mismatches
  (the head retrained on growing shares of the training prompts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import bootstrap_interval
from edgespec.seeding import numpy_rng

LEARNING_SHARES = (0.25, 0.5, 0.75, 1.0)
"""Shares of the training prompts the learning curve retrains each head on."""


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC (the Mann-Whitney U of the positives' ranks, ties at mid-rank), NaN with one
    class; ``sklearn.metrics.roc_auc_score``'s value at a fraction of its cost, since the
    bootstrap calls it thousands of times."""
    from scipy.stats import rankdata  # imported here: scipy takes a while to import

    y = np.asarray(y)
    pos = int((y == 1).sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return math.nan
    ranks = rankdata(np.asarray(score, dtype=np.float64))
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


def per_mismatch_q(q_val: np.ndarray) -> np.ndarray:
    """One score per validation mismatch: q itself, or a CSI head's [N, S] q averaged over
    the S CSI states (the score every head's tau is chosen on)."""
    q = np.asarray(q_val, dtype=np.float64)
    return q.mean(axis=1) if q.ndim == 2 else q


def heldout_auc(
    q_val: np.ndarray,
    y_safe: np.ndarray,
    prompts: Sequence[Any],
    seed: int,
    level: float = 0.95,
    samples: int = 2000,
    tag: str = "",
) -> dict[str, float]:
    """ROC AUC of ``q_val`` (:func:`per_mismatch_q`) against ``y_safe`` (1 = safe) on the
    validation mismatches, and its percentile bootstrap interval at ``level`` over the
    validation prompts (``prompts``, one per mismatch; resampled whole, ``samples`` times, from
    a generator seeded by ``seed`` and ``tag``). NaN where one class is missing."""
    score = per_mismatch_q(q_val)
    y = np.asarray(y_safe)
    groups = pd.Series(np.arange(len(y))).groupby(np.asarray(prompts), sort=True).indices
    rows = [np.asarray(r) for r in groups.values()]

    def statistic(idx: np.ndarray) -> float:
        chosen = np.concatenate([rows[int(i)] for i in idx])
        return _auc(y[chosen], score[chosen])

    boot = bootstrap_interval(
        np.arange(len(rows), dtype=float),
        numpy_rng(seed, "head-auc", tag),
        level,
        samples,
        statistic=statistic,
    )
    return {"auc": _auc(y, score), "auc_lo": boot.low, "auc_hi": boot.high, "level": level}


def accept_by_state(
    q_val: np.ndarray, tau: float, states: pd.DataFrame, relabeled_val: pd.DataFrame
) -> pd.DataFrame:
    """The CSI head's accept rate on the validation mismatches under each CSI state.

    ``q_val`` [N_val, S] (state s = column s, the relabeling's ``csi_sample`` order);
    ``states`` one row per CSI sample in that order with ``csi_sample`` and ``repair_cost``;
    ``relabeled_val`` the relabeled rows of the validation mismatches (``csi_sample``,
    ``label_csi``). Columns: csi_sample, repair_cost [rounds], accept_rate (share of the
    validation mismatches with q >= tau), relabeled_safe (share the relabeling made safe),
    sorted by repair cost (channel quality, best first)."""
    q = np.asarray(q_val, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] != len(states):
        raise ValueError(f"q_val must be [N_val, {len(states)}], got {q.shape}")
    safe = (relabeled_val["label_csi"] == 0).groupby(relabeled_val["csi_sample"]).mean().to_dict()
    out = pd.DataFrame(
        {
            "csi_sample": states["csi_sample"].to_numpy(),
            "repair_cost": states["repair_cost"].to_numpy(dtype=np.float64),
            "accept_rate": (q >= tau).mean(axis=0),
            "relabeled_safe": [safe.get(s, math.nan) for s in states["csi_sample"]],
        }
    )
    return out.sort_values(["repair_cost", "csi_sample"], ignore_index=True)


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of two curves (NaN where either is constant): how
    consistently a quantity rises with the repair cost."""
    from scipy.stats import spearmanr  # imported here, as sklearn above

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def learning_curve(
    fit_auc: Any,
    train_prompts: Sequence[Any],
    seed: int,
    shares: Sequence[float] = LEARNING_SHARES,
) -> pd.DataFrame:
    """Held-out AUC against training size: ``fit_auc(prompts)`` retrains a head on the
    training rows of ``prompts`` and returns (training mismatches, held-out AUC); it is called
    with the first ``share`` of the training prompts in one seeded order (the same order for
    every share, so each set contains the smaller ones). Columns: share, prompts, mismatches,
    auc; a share too small to hold both classes gives NaN."""
    order = list(train_prompts)
    numpy_rng(seed, "learning-curve").shuffle(order)
    rows = []
    for share in shares:
        chosen = order[: max(2, math.ceil(share * len(order)))]
        try:
            n, auc = fit_auc(chosen)
        except ValueError:  # one class only in so few prompts
            n, auc = math.nan, math.nan
        rows.append({"share": share, "prompts": len(chosen), "mismatches": n, "auc": auc})
    return pd.DataFrame(rows)


def quality_metrics(
    auc: Mapping[str, Mapping[str, float]],
    accept: pd.DataFrame | None,
    curves: Mapping[str, pd.DataFrame],
) -> dict[str, Any]:
    """The JSON-ready held-out block of train_head's metrics: AUCs with intervals by head, the
    CSI head's accept rate by CSI state and its rank correlation with the repair cost, and the
    learning curves by head."""
    out: dict[str, Any] = {"heldout_auc": {k: dict(v) for k, v in auc.items()}}
    if accept is not None:
        out["accept_by_state"] = accept.to_dict(orient="list")
        out["accept_vs_cost_spearman"] = rank_correlation(
            accept["repair_cost"], accept["accept_rate"]
        )
    out["learning_curve"] = {k: v.to_dict(orient="list") for k, v in curves.items()}
    return out
