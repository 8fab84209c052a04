"""Does WISV's policy move with the channel? The numbers the report states per regime
(methods §4.2, §5); torch-free.

The relabeling repairs mismatch j under CSI sample c iff lam r_j > C_rep(c) (when the risk
budget does not bind), so between the cheapest and the dearest sample only the mined risks in
(C_min / lam, C_max / lam] can change label (:func:`label_mobility`): the range of the repair
cost and the grading of the risks are the two levers. :func:`trend` measures how consistently
a curve (safe fraction, the head's accept rate) rises with the repair cost, and
:func:`policy_verdict` writes what a regime shows, with its numbers. :func:`breakdown_table`
splits each answer's latency into its parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

PART_TITLES = {
    "prefill_s": "prefill",
    "draft_s": "draft",
    "uplink_s": "uplink",
    "rtt_s": "RTT",
    "verify_s": "target verification",
    "head_s": "head",
    "retransmission_s": "retransmissions",
    "downlink_s": "downlink",
}
"""Each part of an answer's latency, in the order the breakdown stacks them."""

POLICY_VARIANTS = ("vanilla_sd", "head_no_csi", "wisv_fh", "wisv_sh")
"""The variants whose AAL, rounds and latency the report compares on the good and poor channel."""


def label_mobility(
    risk: Sequence[float], repair_costs: Sequence[float], lam: float
) -> dict[str, Any]:
    """How many mined risks can change label between the cheapest and the dearest CSI sample.

    ``risk`` the mined r_j; ``repair_costs`` C_rep of every CSI sample [rounds]; ``lam`` in
    rounds per unit risk. Returns the count of mismatches, of risks at 0, at 1 and strictly
    between (graded), the repair bar C / lam at both ends, and ``movable``: the risks in
    (C_min / lam, C_max / lam], repaired under the cheapest sample and skipped under the
    dearest (where the risk budget does not bind)."""
    r = np.asarray(risk, dtype=np.float64)
    costs = np.asarray(repair_costs, dtype=np.float64)
    if costs.size == 0 or not (math.isfinite(lam) and lam > 0):
        raise ValueError("need repair costs and lam > 0")
    low, high = float(costs.min()) / lam, float(costs.max()) / lam
    graded = (r > 0) & (r < 1)
    return {
        "mismatches": int(r.size),
        "risk_zero": int((r == 0).sum()),
        "risk_one": int((r == 1).sum()),
        "risk_graded": int(graded.sum()),
        "repair_cost_rounds": [float(costs.min()), float(costs.max())],
        "repair_bar": [low, high],
        "movable": int(((r > low) & (r <= high)).sum()),
    }


def trend(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Spearman's rank correlation of ``y`` with ``x`` (NaN where either is constant), and
    ``y`` at the smallest and the largest ``x``."""
    from scipy.stats import spearmanr  # imported here: scipy takes a while to import

    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.size == 0:
        return {"spearman": math.nan, "at_best": math.nan, "at_worst": math.nan}
    order = np.argsort(xs, kind="stable")
    rho = math.nan
    if xs.size > 1 and np.ptp(xs) > 0 and np.ptp(ys) > 0:
        rho = float(spearmanr(xs, ys).statistic)
    return {"spearman": rho, "at_best": float(ys[order[0]]), "at_worst": float(ys[order[-1]])}


def policy_verdict(
    regime: str,
    safe: pd.DataFrame,
    accept: Mapping[str, Sequence[float]] | None,
    mobility: Mapping[str, Any],
    relabel: Mapping[str, Any],
) -> str:
    """One paragraph: do the safe fraction (``safe``, rule relabel_csi's safe_fraction.csv) and
    the CSI head's held-out accept rate (``accept``, train_head's accept_by_state) rise with
    the repair cost in ``regime``, and if not, why (``mobility``: :func:`label_mobility`;
    ``relabel`` the relabeling's summary)."""
    s = trend(safe["repair_cost"], safe["safe_fraction"])
    lo, hi = mobility["repair_cost_rounds"]
    bar_lo, bar_hi = mobility["repair_bar"]
    text = [
        f"**{regime}.** Over {len(safe)} CSI samples a repair costs {lo:.3f}-{hi:.3f} rounds of "
        f"T_0 = {relabel['round_compute_s'] * 1e3:.1f} ms; the safe fraction goes from "
        f"{s['at_best']:.3f} at the cheapest sample to {s['at_worst']:.3f} at the dearest "
        f"(Spearman {s['spearman']:.2f} against the repair cost)."
    ]
    if accept is not None and len(accept.get("repair_cost", ())):
        a = trend(accept["repair_cost"], accept["accept_rate"])
        text.append(
            f"The CSI head accepts {a['at_best']:.3f} of the held-out mismatches at the cheapest "
            f"sample and {a['at_worst']:.3f} at the dearest (Spearman {a['spearman']:.2f})."
        )
    moved = s["at_worst"] > s["at_best"]
    if not moved:
        text.append(
            f"Why the labels do not move: with lambda = {relabel['lam_rounds_per_risk']:g} "
            f"rounds per unit risk a mismatch is repaired iff its risk exceeds C_rep / lambda, "
            f"{bar_lo:.3f} at the cheapest sample and {bar_hi:.3f} at the dearest; of the "
            f"{mobility['mismatches']} mined risks {mobility['risk_zero']} are 0, "
            f"{mobility['risk_one']} are 1 and {mobility['risk_graded']} graded, and "
            f"{mobility['movable']} lie in ({bar_lo:.3f}, {bar_hi:.3f}], the only ones the "
            "channel could flip (fewer still where the risk budget binds)."
        )
    return " ".join(text)


def breakdown_table(costs: pd.DataFrame) -> pd.DataFrame:
    """Each answer's latency by part [s]: per (regime, variant, channel, gamma), the mean over
    fading seeds of the mean over prompts of every ``PART_TITLES`` part and of the total
    (``latency_s``, which they add up to)."""
    parts = list(PART_TITLES)
    keys = ["regime", "variant", "channel", "gamma"]
    per_seed = costs.groupby([*keys, "fading_index"], sort=True)[[*parts, "latency_s"]].mean()
    return per_seed.groupby(level=keys, sort=True).mean().reset_index()


def check_breakdown(costs: pd.DataFrame, tolerance: float = 1e-9) -> None:
    """ValueError unless every answer's parts add up to its latency (every cost charged once)."""
    total = costs[list(PART_TITLES)].sum(axis=1)
    if not np.allclose(total, costs["latency_s"], rtol=tolerance, atol=tolerance):
        raise ValueError("the latency parts do not add up to the answers' latencies")
