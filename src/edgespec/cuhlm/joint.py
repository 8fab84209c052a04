"""The joint (u_th, k) programme per channel (methods §3.4, variant ``cuhlm_joint``).

The threshold ranges over "skip nothing" and every observed u, under the measured skip risk
``<= cuhlm.risk_budget``; the channel's ergodic rate decides between skipping more and
uploading more entries. The workflow solves it at ``cuhlm.kstar_channel`` for the decoded
variant (rule ``optimize_k``, in ``kstar.json``) and at every channel of the sweep for the
report (rule ``joint_kstar``, from the same saved bound curves), so that a change to the sweep
re-solves the table without replaying the draft or decoding again.
"""

from __future__ import annotations

from edgespec.cuhlm.kcurves import BoundCurves
from edgespec.cuhlm.kselect import KStarSolution, optimize_k_star
from edgespec.wireless.channel import ChannelCondition, ergodic_rate_bps
from edgespec.wireless.delay import LatencyProfile


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
