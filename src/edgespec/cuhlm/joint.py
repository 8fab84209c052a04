"""The joint (u_th, k) programme per channel (methods §3.4, variant ``cuhlm_joint``).

The threshold ranges over "skip nothing" and every observed u, under the measured skip risk
``<= cuhlm.risk_budget``; the channel's ergodic rate decides between skipping more and
uploading more entries. The workflow solves it at ``cuhlm.kstar_channel`` for the decoded
variant (rule ``optimize_k``, in ``kstar.json``) and at every channel of the sweep for the
report (rule ``joint_kstar``, from the same saved bound curves), so that a change to the sweep
re-solves the table without replaying the draft or decoding again.

Where the risk budget binds, the choice can stay put across the whole SNR sweep: the skip
rate is then set by the budget, and the upload of the k the bound needs costs little at any
of the sweep's rates. :func:`joint_sensitivity` re-solves it under other risk budgets and
slower uplinks (bandwidth multiples); the report says where the channel moves it
(``edgespec.cuhlm.report.joint_moves``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from edgespec.cuhlm.kcurves import BoundCurves
from edgespec.cuhlm.kselect import InfeasibleBudgetError, KStarSolution, optimize_k_star
from edgespec.wireless.channel import ChannelCondition, ergodic_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wireless.payload import upload_bits


def latency_inputs(
    profile: LatencyProfile, condition: ChannelCondition, prob_bits: int, vocab_size: int
) -> dict:
    """The expected-latency inputs of :func:`optimize_k_star` under one channel."""
    return {
        "draft_s": profile.draft_token_s,
        "uncertainty_s": profile.uncertainty_s,
        "target_s": profile.target_token_s,
        "rtt_s": condition.rtt_s,
        "mean_uplink_rate_bps": ergodic_rate_bps(condition),
        "prob_bits": prob_bits,
        "vocab_size": vocab_size,
        "topk_s": dict(profile.topk_s),
    }


def solve_joint(
    curves: BoundCurves, theta_tv: float, latency: dict, risk_budget: float | None
) -> KStarSolution:
    """(u_th, k*) jointly: u_th over "skip nothing" (-1) and every observed u."""
    u_grid = [-1.0, *curves.u_values.tolist()]
    return optimize_k_star(curves, theta_tv, latency, u_th_grid=u_grid, risk_budget=risk_budget)


def joint_row(
    name: str, condition: ChannelCondition, solution: KStarSolution, decoded: bool
) -> dict:
    """One row of ``joint_kstar.csv``: the channel and its joint solution."""
    return {
        "channel": name,
        "fading": condition.fading,
        "snr_db": condition.mean_snr_db(),
        "ergodic_rate_bps": ergodic_rate_bps(condition),
        "k_star": solution.k_star,
        "u_th": solution.u_th,
        "skip_fraction": 1.0 - solution.p_tx,
        "skip_risk": solution.risk,
        "mean_online_bound": solution.mean_bound,
        "expected_latency_s": solution.objective_s,
        "status": solution.status,
        "decoded": decoded,
    }


BANDWIDTH_FACTORS = (1.0, 1e-1, 1e-2, 1e-3, 1e-4)
"""Multiples of the sweep's uplink bandwidth at which :func:`joint_sensitivity` re-solves the
programme: slower uplinks make each uploaded entry dearer, so they show where the channel
starts to move the choice."""


def joint_sensitivity(
    curves: BoundCurves,
    theta_tv: float,
    profile: LatencyProfile,
    channels: Mapping[str, ChannelCondition],
    prob_bits: int,
    risk_budgets: Sequence[float],
    bandwidth_factors: Sequence[float] = BANDWIDTH_FACTORS,
) -> pd.DataFrame:
    """The joint programme at every channel of ``channels`` under every risk budget and every
    bandwidth multiple: one row per (risk_budget, bandwidth_factor, channel) with the channel's
    ``bandwidth_hz`` [Hz], ``snr_db``, ``ergodic_rate_bps`` [bit/s], ``k_star``, ``u_th``,
    ``skip_fraction``, ``skip_risk``, ``upload_s`` (B(k*) / E[R], seconds per upload) and
    ``status`` ("infeasible" where no (u_th, k) meets the budgets)."""
    rows = []
    for budget in risk_budgets:
        for factor in bandwidth_factors:
            for name, base in channels.items():
                condition = dataclasses.replace(base, bandwidth_hz=base.bandwidth_hz * factor)
                latency = latency_inputs(profile, condition, prob_bits, curves.vocab_size)
                row = {
                    "risk_budget": float(budget),
                    "bandwidth_factor": float(factor),
                    "channel": name,
                    "fading": condition.fading,
                    "bandwidth_hz": condition.bandwidth_hz,
                    "snr_db": condition.mean_snr_db(),
                    "ergodic_rate_bps": latency["mean_uplink_rate_bps"],
                }
                try:
                    solution = solve_joint(curves, theta_tv, latency, budget)
                except InfeasibleBudgetError:
                    rows.append({**row, "status": "infeasible"})
                    continue
                bits = upload_bits(np.asarray([solution.k_star]), curves.vocab_size, prob_bits)
                rows.append(
                    {
                        **row,
                        "k_star": solution.k_star,
                        "u_th": solution.u_th,
                        "skip_fraction": 1.0 - solution.p_tx,
                        "skip_risk": solution.risk,
                        "upload_s": float(bits[0]) / latency["mean_uplink_rate_bps"],
                        "status": solution.status,
                    }
                )
    return pd.DataFrame(rows)
