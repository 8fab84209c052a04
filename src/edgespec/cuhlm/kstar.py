"""The offline k* of a run (rule ``optimize_k``, methods §3.4): the calibration draft replayed
for the bound curves over every k, the programmes solved at ``cuhlm.kstar_channel``, and the
``kstar.json`` record.

The trace stores N_k only on its k grid; the search over every k in [1, |V|] needs the draft
distributions x(t) themselves, which :func:`edgespec.cuhlm.traces.replay_draft_probs`
recomputes, one teacher-forced forward per prompt, with the draft loaded as the traces decoded
it (:func:`load_replay_draft`). :func:`replayed_curves` builds the curves from them and checks
that the replay reproduces the trace's x_d (a misaligned replay would price other tokens).
:func:`choose_k` then solves the offline programme (threshold fixed at the fit's u_th) and the
joint (u_th, k) one (:mod:`edgespec.cuhlm.joint`) at the reference channel.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.joint import latency_inputs, solve_joint
from edgespec.cuhlm.kcurves import BoundCurves, dense_bound_curves
from edgespec.cuhlm.kselect import KStarSolution, k_table, optimize_k_star
from edgespec.models.load import load_model, load_tokenizer, to_device
from edgespec.models.precision import quantize_for_role, quantized_roles, weights_dtype
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

log = logging.getLogger(__name__)

REPLAY_MAX_MEAN_ABS_DIFF = 0.1
"""The replayed x_d of the traced tokens must match the trace's on average to this: rounding of
a batched low-precision decode moves x_d by far less; a misaligned replay by far more."""


def ordered_trace(trace: pd.DataFrame) -> pd.DataFrame:
    """``trace`` one prompt after another (in order of first appearance), each in position
    order: the order :func:`edgespec.cuhlm.traces.replay_draft_probs` yields rows in."""
    prompt_order = {pid: i for i, pid in enumerate(pd.unique(trace["prompt_id"]))}
    return trace.sort_values(
        ["prompt_id", "position"],
        key=lambda s: s.map(prompt_order) if s.name == "prompt_id" else s,
    ).reset_index(drop=True)


def trace_k_grid(trace: pd.DataFrame) -> list[int]:
    """The trace's k grid (its ``nk_{k}`` columns), increasing; it always ends with |V|."""
    grid = sorted(int(c[3:]) for c in trace.columns if c.startswith("nk_"))
    if not grid:
        raise ValueError("the trace has no nk_{k} columns: not a collect_traces table")
    return grid


def replay_completions(trace: pd.DataFrame, records: Sequence) -> tuple[list, list[list[int]]]:
    """The prompt records of an :func:`ordered_trace` in its order, and each prompt's committed
    tokens; ``records`` are the calibration prompts of the data files."""
    by_id = {r.id: r for r in records}
    order = list(pd.unique(trace["prompt_id"]))
    missing = sorted(set(order) - set(by_id))
    if missing:
        raise ValueError(
            f"traced prompts {missing[:5]} are not calibration prompts of the data files"
        )
    completions = [
        trace.loc[trace["prompt_id"] == pid, "committed_token"].astype(int).tolist()
        for pid in order
    ]
    return [by_id[pid] for pid in order], completions


def load_replay_draft(model_dir: str | Path, models: Mapping) -> tuple:
    """(draft, tokenizer, token_by_token) to replay the traces with: the draft in the run's
    dtype and quantisation (``models``: :func:`edgespec.runconfig.model_settings`), and whether
    to replay it a token at a time, as it decoded (an int8 draft scales its activations per
    forward: on the default pair mean |dx_d| 0.084 so, against 0.143 in one forward per
    prompt)."""
    draft_dir = Path(model_dir) / "draft"
    tokenizer = load_tokenizer(draft_dir, role="draft")
    quantize = models.get("quantize", "none")
    draft = load_model(draft_dir, weights_dtype("draft", quantize, models["dtype"]), "draft")
    draft = quantize_for_role(draft, "draft", quantize)
    token_by_token = "draft" in quantized_roles(quantize)
    return to_device(draft, models.get("device", "cpu")), tokenizer, token_by_token


def replayed_curves(
    prob_chunks: Iterable[torch.Tensor], trace: pd.DataFrame, fit: LinearFit
) -> tuple[BoundCurves, np.ndarray]:
    """:func:`edgespec.cuhlm.kcurves.dense_bound_curves` of an :func:`ordered_trace` from its
    replayed draft distributions (``prob_chunks``, [n_i, V] per prompt), and |x_d replay -
    x_d trace| per token. A replay whose |V| differs from the trace grid's, or whose mean
    difference exceeds :data:`REPLAY_MAX_MEAN_ABS_DIFF`, is an error."""
    drafted = trace["draft_token"].to_numpy()
    replayed: list[np.ndarray] = []

    def chunks():
        start = 0
        for probs in prob_chunks:
            stop = start + probs.shape[0]
            tokens = torch.tensor(drafted[start:stop]).view(-1, 1)
            if probs.shape[0]:
                replayed.append(probs.to(torch.float64).gather(1, tokens).squeeze(1).numpy())
            start = stop
            yield probs

    x_d = trace["x_d"].to_numpy()
    curves = dense_bound_curves(chunks(), trace["u"].to_numpy(), x_d, trace["beta"].to_numpy(), fit)
    vocab_size = trace_k_grid(trace)[-1]
    if curves.vocab_size != vocab_size:
        raise ValueError(
            f"replayed |V| = {curves.vocab_size} differs from the trace's {vocab_size}"
        )
    diff = np.abs(np.concatenate(replayed) - x_d)
    log.info(
        "replayed %d calibration tokens: |x_d replay - x_d trace| mean %.3g, max %.3g",
        len(diff),
        diff.mean(),
        diff.max(),
    )
    if diff.mean() > REPLAY_MAX_MEAN_ABS_DIFF:
        raise RuntimeError(
            f"the replayed draft distributions do not match the trace (mean |dx_d| = "
            f"{diff.mean():.3g} > {REPLAY_MAX_MEAN_ABS_DIFF}): prompts or completions are "
            "misaligned"
        )
    return curves, diff


@dataclass
class KStarChoice:
    """The programmes :func:`choose_k` solved: ``offline`` (threshold ``u_th``, None: every
    token transmitted) and ``joint`` at ``channel``, with the ``latency`` inputs they were
    priced with and the settings that posed them."""

    offline: KStarSolution
    joint: KStarSolution
    latency: dict
    fit: LinearFit
    u_th: float | None
    theta_tv: float
    risk_budget: float | None
    channel: str

    def grid_table(self, trace: pd.DataFrame, k_grid: Sequence[int]) -> pd.DataFrame:
        """``k_table.csv``: :func:`edgespec.cuhlm.kselect.k_table` on the trace grid at the
        offline threshold, with the offline k* marked."""
        return k_table(
            trace, k_grid, self.fit, self.u_th, self.theta_tv, self.latency, self.offline.k_star
        )

    def record(self, k_grid: Sequence[int], replay_diff: np.ndarray) -> dict:
        """``kstar.json``: both solutions, the settings, the trace grid and the replay check."""
        vocab_size = int(self.latency["vocab_size"])
        offline, joint = self.offline, self.joint
        return {
            "k_star": offline.k_star,
            "u_th": offline.u_th,
            "objective_s": offline.objective_s,
            "status": offline.status,
            "solver": offline.solver,
            "slack": offline.slack,
            "mean_online_bound": offline.mean_bound,
            "theta_tv": self.theta_tv,
            "vocab_size": vocab_size,
            "k_search": f"every integer k in [1, {vocab_size}]",
            "k_grid": list(k_grid),
            "latency_inputs": self.latency,
            "joint": {
                "channel": self.channel,
                "k_star": int(joint.k_star),
                "u_th": float(joint.u_th),
                "skip_fraction": float(1.0 - joint.p_tx),
                "skip_risk": float(joint.risk),
                "risk_budget": self.risk_budget,
                "mean_online_bound": float(joint.mean_bound),
                "objective_s": float(joint.objective_s),
            },
            "replay": {
                "tokens": int(len(replay_diff)),
                "mean_abs_x_d_diff": float(replay_diff.mean()),
                "max_abs_x_d_diff": float(replay_diff.max()),
            },
        }


def choose_k(
    curves: BoundCurves,
    fit_record: dict,
    profile: LatencyProfile,
    reference: ChannelCondition,
    cuhlm: Mapping,
) -> KStarChoice:
    """The offline k* at the fit's threshold (``fit.json``'s ``u_th``; a negative one skips
    nothing, so every token is transmitted) and the joint (u_th, k*) at the ``reference``
    channel (``cuhlm.kstar_channel``), under ``cuhlm``'s ``theta_tv``, ``risk_budget`` and
    ``prob_bits``, with ``profile``'s compute times."""
    latency = latency_inputs(profile, reference, cuhlm["prob_bits"], curves.vocab_size)
    u_th = fit_record["u_th"] if fit_record["u_th"] >= 0 else None
    offline = optimize_k_star(curves, cuhlm["theta_tv"], latency, u_th=u_th)
    log.info(
        "offline k* = %d (u_th %s, every k in [1, %d]), E[tau] = %.4f s, %s via %s",
        offline.k_star,
        offline.u_th,
        curves.vocab_size,
        offline.objective_s,
        offline.status,
        offline.solver,
    )
    # rule joint_kstar solves it at every channel of the sweep, for the report
    joint = solve_joint(curves, cuhlm["theta_tv"], latency, cuhlm["risk_budget"])
    channel = cuhlm["kstar_channel"]
    log.info(
        "joint programme at %s: k* = %d, u_th = %g, %s",
        channel,
        joint.k_star,
        joint.u_th,
        joint.status,
    )
    return KStarChoice(
        offline=offline,
        joint=joint,
        latency=latency,
        fit=LinearFit.from_record(fit_record),
        u_th=u_th,
        theta_tv=cuhlm["theta_tv"],
        risk_budget=cuhlm["risk_budget"],
        channel=channel,
    )
