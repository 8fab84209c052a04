"""The CU-HLM report (rule ``report_cuhlm``, methods §6 and §8): the summary with intervals in
the variants' order, the latency profiles it is priced under, the papers' numbers beside ours,
the headline table, the Markdown page and the figures; torch-free.

:func:`build_report` turns the loaded artifacts (:class:`ReportInputs`) into the tables and the
page (:class:`CuhlmReport`); :func:`draw_figures` writes the figures from them. Every delay
figure is the median over fading seeds with its interval, every token-level or accuracy figure
a bootstrap over prompts (``edgespec.cuhlm.summary``); a cell reads ``point [lo, hi]``
(:func:`interval_cell`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from edgespec import plots
from edgespec.cuhlm.quality import QUALITY_TEXT, budget_rows, interval_cell, quality_rows
from edgespec.cuhlm.summary import summary_table
from edgespec.hardware import HardwareSpec, roofline_profile
from edgespec.report import (
    decidable_line,
    headline_table,
    markdown_table,
    paper_comparison,
    precision_paragraph,
)
from edgespec.wireless.payload import upload_bits

PAPERS_VOCAB_SIZE = 32000
"""The vocabulary of the papers' pair (TinyLlama / Llama-2), tokens."""

EXACT_VARIANTS = ("cuhlm_offline", "cuhlm_exact", "cuhlm_joint")
"""The rows of the report's "what exact verification costs" table."""

JOINT_COLUMNS = (
    "channel",
    "snr_db",
    "ergodic_rate_bps",
    "k_star",
    "u_th",
    "skip_fraction",
    "skip_risk",
    "expected_latency_s",
    "decoded",
)
"""The columns of ``joint_kstar.csv`` the report shows."""

FIGURES = ("throughput", "gain", "accuracy", "kdist", "skip", "joint_figure")
"""The figure outputs of rule ``report_cuhlm``, the keys of :func:`draw_figures`' paths."""


@dataclass(frozen=True)
class ReportSettings:
    """The config a report reads: the variants in report order, the interval levels
    (``evaluation.seed_interval``, ``evaluation.bootstrap_interval``, fractions in (0, 1)) and
    ``evaluation.bootstrap_samples``, ``latency.paper_hardware``, the uncertainty samples M,
    ``cuhlm.prob_bits``, ``cuhlm.kstar_channel`` and the run's seed."""

    variants: Sequence[str]
    seed_interval: float
    bootstrap_interval: float
    bootstrap_samples: int
    paper_hardware: Mapping
    uncertainty_samples: int
    prob_bits: int
    kstar_channel: str
    seed: int


@dataclass
class ReportInputs:
    """The artifacts a report reads: ``fit.json``, ``kstar.json``, the primary latency profile
    (``profile.json``, seconds), the model provenance, ``precision.json`` and (where a model was
    quantised) ``quantization.json``; the evaluated metrics of every variant, its decoded tokens
    (variant -> table), the text scores, and the calibration tables ``thresholds.csv``,
    ``k_table.csv``, ``joint_kstar.csv`` and ``joint_sensitivity.csv``."""

    fit: dict
    kstar: dict
    profile: dict
    provenance: dict
    precision: dict
    quantization: dict | None
    metrics: pd.DataFrame
    tokens: Mapping[str, pd.DataFrame]
    scores: pd.DataFrame
    thresholds: pd.DataFrame
    k_table: pd.DataFrame
    joint: pd.DataFrame
    joint_sensitivity: pd.DataFrame | None = None


@dataclass
class CuhlmReport:
    """What :func:`build_report` makes: ``summary`` (``cuhlm_summary.csv``), ``headline``
    (``cuhlm_headline.csv``), ``markdown`` (``cuhlm_summary.md``, newline-terminated) and the
    latency profiles (id -> column label) they are priced under."""

    summary: pd.DataFrame
    headline: pd.DataFrame
    markdown: str
    profiles: dict[str, str]


def ordered_summary(inputs: ReportInputs, settings: ReportSettings) -> pd.DataFrame:
    """:func:`edgespec.cuhlm.summary.summary_table` sorted by profile, fading, SNR and then
    variant in ``settings.variants`` order."""
    summary = summary_table(
        inputs.metrics,
        inputs.tokens,
        inputs.scores,
        inputs.kstar["vocab_size"],
        settings.prob_bits,
        settings.seed,
        settings.seed_interval,
        settings.bootstrap_interval,
        settings.bootstrap_samples,
    )
    order = {v: i for i, v in enumerate(settings.variants)}
    return summary.sort_values(
        ["profile", "fading", "snr_db", "variant"],
        key=lambda s: s.map(order) if s.name == "variant" else s,
        kind="stable",
    ).reset_index(drop=True)


def primary_label(profile: dict) -> str:
    """The column label of the primary latency profile: measured here, or configured."""
    if profile.get("source") == "measured":
        return "measured compute (this machine)"
    return f"{profile.get('source')} compute (latency.given)"


def latency_profiles(profile: dict, summary: pd.DataFrame) -> dict[str, str]:
    """Profile id -> column label: the primary one, and the emulated paper hardware where the
    summary priced it."""
    profiles = {"primary": primary_label(profile)}
    if "paper_hw" in set(summary["profile"]):
        profiles["paper_hw"] = "emulated paper hardware"
    return profiles


def primary_profile_text(profile: dict) -> str:
    """The primary profile's compute times, in milliseconds."""
    return (
        f"tau_SLM = {1e3 * profile['draft_token_s']:.2f} ms, tau_LLM = "
        f"{1e3 * profile['target_token_s']:.2f} ms, tau_unc = {1e3 * profile['uncertainty_s']:.2f} "
        f"ms, online k(t) = {1e3 * profile.get('online_k_s', 0.0):.2f} ms, top-k extraction "
        + ", ".join(f"k={k}: {1e3 * s:.3f} ms" for k, s in profile.get("topk_s", {}).items())
    )


def paper_hardware_text(paper_hardware: Mapping, vocab_size: int, uncertainty_samples: int) -> str:
    """How the emulated paper-hardware profile is derived (``edgespec.hardware``), with its
    compute times in milliseconds."""
    profile, d = roofline_profile(
        HardwareSpec.from_dict(paper_hardware), vocab_size, uncertainty_samples
    )
    return (
        f"draft {d['draft_params']:.3g} parameters x {d['bytes_per_weight']:g} B "
        f"on {d['device_name']} ({d['device_bandwidth_gb_s']:g} GB/s): "
        f"tau_SLM = {1e3 * profile.draft_token_s:.2f} ms; target "
        f"{d['target_params']:.3g} x {d['bytes_per_weight']:g} B on "
        f"{d['edge_name']} ({d['edge_bandwidth_gb_s']:g} GB/s): tau_LLM = "
        f"{1e3 * profile.target_token_s:.2f} ms; one pass over the |V| = {vocab_size} "
        f"logits {1e6 * d['vocab_pass_s']:.2f} us (uncertainty "
        f"{d['uncertainty_passes']} passes, online k(t) "
        f"{d['online_k_passes']}, top-k 1)"
    )


def variant_rows(frame: pd.DataFrame, profiles: Mapping[str, str]) -> pd.DataFrame:
    """One row per (variant, channel) of ``frame`` (summary rows), the profile-dependent
    columns side by side (one per profile), then the token-level and accuracy figures."""
    if frame.empty:
        return pd.DataFrame({"note": ["none of these variants was evaluated (cuhlm.variants)"]})
    out = []
    for _, row in frame[frame["profile"] == "primary"].iterrows():
        line = {"variant": row["variant"], "channel": row["channel"]}
        for profile, label in profiles.items():
            other = frame[
                (frame["profile"] == profile)
                & (frame["variant"] == row["variant"])
                & (frame["channel"] == row["channel"])
            ].iloc[0]
            line[f"gain over HLM ({label})"] = interval_cell(other, "throughput_gain", unit="x")
            line[f"tokens/s ({label})"] = interval_cell(other, "throughput_tps")
        line.update(
            {
                "skip rate": interval_cell(row, "skip_rate", 100, "%"),
                "vocab. compression": interval_cell(row, "vocab_compression", 100, "%"),
                "uplink B/token": interval_cell(row, "uplink_bytes_per_token"),
                "TVD(r, r_hat)": interval_cell(row, "measured_tvd_mean"),
                "TVD(y_hat, y)": interval_cell(row, "output_tvd_mean"),
                "acceptance": interval_cell(row, "acceptance_rate", 100, "%"),
                "semantic acc. vs HLM": interval_cell(row, "relative_semantic_accuracy", 100, "%"),
            }
        )
        out.append(line)
    return pd.DataFrame(out)


def slm_only_warning(fit: dict) -> str:
    """The warning that a threshold at or above 1 (clamped to 1 by rule ``fit_calibration``)
    made the variants in ``fit["slm_only_variants"]`` SLM-only; empty when there are none."""
    slm_only = fit.get("slm_only_variants") or []
    if not slm_only:
        return ""
    return (
        f" **Warning**: a threshold >= 1 was clamped to 1; {', '.join(slm_only)} "
        "skip every token and have become SLM-only."
    )


def calibration_text(fit: dict) -> str:
    """The calibration fit and the threshold used, with :func:`slm_only_warning`."""
    return (
        f"Calibration: beta = {fit['a']:.4f} u {fit['b']:+.4f} (R2 {fit['r2']:.3f}, "
        f"r {fit['pearson_r']:.3f}, {fit['n']} tokens); u_th used = {fit['u_th']:.4f} "
        f"({fit['threshold_rule']})." + slm_only_warning(fit)
    )


def kstar_text(kstar: dict, channel: str) -> str:
    """The offline k*, the joint programme's (u_th, k*) at ``channel`` and the replay check."""
    vocab_size, joint = kstar["vocab_size"], kstar["joint"]
    return (
        f"Offline k* = {kstar['k_star']} of |V| = {vocab_size} ({kstar['k_search']}; "
        f"threshold fixed, so k* is the smallest k whose mean online bound is within "
        f"theta_tv = {kstar['theta_tv']}, whatever the rate). Joint (u_th, k) programme "
        f"(risk budget {joint['risk_budget']}), decoded as `cuhlm_joint` at "
        f"{channel} only: k* = {joint['k_star']}, u_th = "
        f"{joint['u_th']:.4g}. Draft distributions of the calibration tokens "
        f"were replayed for the every-k search: mean |x_d replay - x_d trace| = "
        f"{kstar['replay']['mean_abs_x_d_diff']:.2g}."
    )


def joint_moves(sensitivity: pd.DataFrame) -> pd.DataFrame:
    """Per (fading, risk_budget, bandwidth) of ``joint_sensitivity.csv``
    (``edgespec.cuhlm.joint.joint_sensitivity``): the distinct (u_th, k*) choices across the SNRs
    (``choices``), their ranges, and ``moves`` (True where the channel changes the choice)."""
    solved = sensitivity[sensitivity["status"] != "infeasible"]
    keys = ["fading", "risk_budget", "bandwidth_factor"]
    rows = []
    for key, group in solved.groupby(keys, sort=True):
        pairs = group[["u_th", "k_star"]].drop_duplicates()
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "bandwidth_hz": float(group["bandwidth_hz"].max()),
                "snr_db": f"{group['snr_db'].min():g} to {group['snr_db'].max():g}",
                "choices": len(pairs),
                "k_star": f"{int(group['k_star'].min())}-{int(group['k_star'].max())}",
                "u_th": f"{group['u_th'].min():.3g}-{group['u_th'].max():.3g}",
                "max_upload_ms": 1e3 * float(group["upload_s"].max()),
                "moves": len(pairs) > 1,
            }
        )
    return pd.DataFrame(rows)


def joint_text(
    joint: pd.DataFrame, profile: Mapping, budget: float, prob_bits: int, vocab_size: int
) -> str:
    """Whether the joint programme's choice moves over the sweep, and if not why: the risk
    budget binds, and an upload of k* entries costs little against tau_LLM at every rate."""
    solved = joint.dropna(subset=["k_star"])
    if solved.empty:
        return ""
    pairs = solved[["u_th", "k_star"]].drop_duplicates()
    span = f"{solved['snr_db'].min():g} to {solved['snr_db'].max():g} dB"
    if len(pairs) > 1:
        return f"The joint programme's choice moves with the channel over {span}."
    u_th, k_star = pairs.iloc[0]
    slowest = float(solved["ergodic_rate_bps"].min())
    bits = float(upload_bits(np.asarray([int(k_star)]), vocab_size, prob_bits)[0])
    risk = solved["skip_risk"].max()
    return (
        f"The joint programme chooses the same (u_th, k*) = ({u_th:.3g}, {int(k_star)}) at "
        f"every channel ({span}): its skip risk {risk:.3g} is at the risk budget {budget:g}, "
        f"so the budget, not the rate, sets the skip rate, and an upload of k* entries "
        f"({bits / 8:.0f} B) takes {1e3 * bits / slowest:.3g} ms even at the slowest ergodic "
        f"rate ({slowest / 1e6:.3g} Mbit/s), against tau_LLM = "
        f"{1e3 * profile['target_token_s']:.3g} ms per verification. Re-solved under other "
        "risk budgets and slower uplinks (the sweep's bandwidth times a factor), the choice "
        "moves with the SNR where `moves` says so:"
    )


def _intervals_text(seeds: int, settings: ReportSettings) -> str:
    return (
        "Every delay-based figure (throughput, latency, gain over HLM) is the median over "
        f"{seeds} fading seeds with its central {100 * settings.seed_interval:g}% "
        "interval in brackets; gains are taken per seed against HLM under the same "
        "fading draws (common random numbers: the same normalised draws for every "
        "variant and SNR at each prompt, token position and seed). Token-level "
        "fractions and accuracy figures carry a "
        f"{100 * settings.bootstrap_interval:g}% bootstrap interval over the "
        f"evaluation prompts ({settings.bootstrap_samples} resamples). Under "
        "Rayleigh fading E[1/R] is unbounded, so single-draw throughputs swing widely; "
        "hence the intervals."
    )


def _profiles_text(
    inputs: ReportInputs, settings: ReportSettings, profiles: Mapping[str, str]
) -> str:
    vocab_size = inputs.kstar["vocab_size"]
    hardware = "not evaluated (latency.paper_hardware.enabled: false)"
    if "paper_hw" in profiles:
        hardware = paper_hardware_text(
            settings.paper_hardware, vocab_size, settings.uncertainty_samples
        )
    return (
        f"Latency profiles: **{profiles['primary']}**: {primary_profile_text(inputs.profile)}. "
        f"**Emulated paper hardware** (memory-bound roofline, methods §5): "
        f"{hardware}. The papers' vocabulary is 32,000 tokens; ours is "
        f"{vocab_size}, so a full upload is {vocab_size / PAPERS_VOCAB_SIZE:.2f}x the papers' "
        "in both columns."
    )


def _sensitivity_sections(inputs: ReportInputs, settings: ReportSettings) -> list[str]:
    if inputs.joint_sensitivity is None or inputs.joint_sensitivity.empty:
        return []
    budget = inputs.kstar["joint"]["risk_budget"]
    vocab_size = inputs.kstar["vocab_size"]
    return [
        joint_text(inputs.joint, inputs.profile, budget, settings.prob_bits, vocab_size),
        markdown_table(joint_moves(inputs.joint_sensitivity)),
    ]


def render_markdown(
    summary: pd.DataFrame,
    inputs: ReportInputs,
    settings: ReportSettings,
    profiles: Mapping[str, str],
    headline: pd.DataFrame | None = None,
) -> str:
    """``cuhlm_summary.md``: the run's setting, then the paper comparison, the joint programme
    over the sweep, the exact-verification rows at ``cuhlm.kstar_channel``, the thresholds, the
    k table and every variant and channel."""
    channel = settings.kstar_channel
    provenance = inputs.provenance
    exact_rows = summary[summary["variant"].isin(EXACT_VARIANTS) & (summary["channel"] == channel)]
    seeds = int(summary["fading_seeds"].max())
    sections = [
        "# CU-HLM family: measured results",
        f"Model pair: {provenance.get('description', provenance.get('preset'))}. "
        + precision_paragraph(inputs.precision, inputs.quantization),
        _intervals_text(seeds, settings),
        _profiles_text(inputs, settings, profiles),
        calibration_text(inputs.fit),
        kstar_text(inputs.kstar, channel),
        "## Against the papers' numbers (same metric definitions)",
        decidable_line(headline if headline is not None else headline_table(summary, profiles)),
        QUALITY_TEXT,
        markdown_table(paper_comparison(summary, dict(profiles))),
        "## Quality against its noise floor (HLM, lossless; paired by prompt)",
        markdown_table(quality_rows(summary)),
        "## Token budget (per dataset)",
        markdown_table(budget_rows(inputs.scores)),
        "## Joint k* and u_th against SNR (one programme per channel; only "
        f"{channel} is decoded, as cuhlm_joint)",
        markdown_table(inputs.joint[list(JOINT_COLUMNS)]),
        *_sensitivity_sections(inputs, settings),
        f"## What exact verification costs ({channel})",
        "cuhlm_exact draws d from the uploaded x_hat (same k* and bytes as "
        "cuhlm_offline), so its output law is y: TVD(y_hat, y) = 0 to float64 rounding. "
        "(With q = p, TVD(y_hat, y) is half the difference of the two laws' sums; a float32 "
        "softmax over the vocabulary sums to 1 only to about 1e-5, which the decode table "
        "once recorded as a distortion; it now renormalises both laws in float64: "
        "`bench/exact_distortion.py`, methods §3.4.)",
        markdown_table(variant_rows(exact_rows, profiles)),
        "## Thresholds",
        markdown_table(inputs.thresholds),
        "## Top-k on the trace grid: online bound, residual and output TVD, and how "
        "often each bound holds for each",
        markdown_table(inputs.k_table),
        "## Every variant and channel",
        markdown_table(variant_rows(summary, profiles)),
    ]
    return "\n\n".join(sections) + "\n"


def build_report(inputs: ReportInputs, settings: ReportSettings) -> CuhlmReport:
    """The summary, headline table and Markdown page of one run (module docstring)."""
    summary = ordered_summary(inputs, settings)
    profiles = latency_profiles(inputs.profile, summary)
    headline = headline_table(summary, profiles)
    return CuhlmReport(
        summary=summary,
        headline=headline,
        markdown=render_markdown(summary, inputs, settings, profiles, headline),
        profiles=profiles,
    )


def draw_figures(
    report: CuhlmReport,
    inputs: ReportInputs,
    settings: ReportSettings,
    trace_u,
    paths: Mapping[str, str],
) -> None:
    """The report's figures (``edgespec.plots``), one PNG per key of :data:`FIGURES` in
    ``paths``; ``trace_u`` is u(t) of every calibration token (the skip-vs-threshold figure)."""
    summary, profiles, kstar = report.summary, report.profiles, inputs.kstar
    channel = settings.kstar_channel
    preset = inputs.provenance.get("preset")
    subtitle = (
        f"{preset} pair; {int(summary['fading_seeds'].max())} fading seeds, median and interval"
    )
    plots.throughput_vs_snr(summary, paths["throughput"], profiles, subtitle=subtitle)
    plots.gain_vs_snr(summary, paths["gain"], profiles, subtitle=subtitle)
    ref_channel = channel if channel in set(summary["channel"]) else summary["channel"].iloc[0]
    plots.accuracy_vs_throughput(
        summary[(summary["channel"] == ref_channel) & (summary["profile"] == "primary")],
        ref_channel,
        paths["accuracy"],
        subtitle=subtitle,
    )
    online_k = []
    if "cuhlm_online" in inputs.tokens:
        online = inputs.tokens["cuhlm_online"]
        online_k = online.loc[online["uploaded"], "k"].to_numpy()
    plots.k_distribution(
        online_k, kstar["vocab_size"], kstar["k_star"], paths["kdist"], subtitle=subtitle
    )
    plots.skip_vs_threshold(trace_u, inputs.thresholds, paths["skip"], subtitle=subtitle)
    plots.joint_kstar_vs_snr(
        inputs.joint,
        kstar["k_star"],
        channel,
        paths["joint_figure"],
        subtitle=f"{preset} pair; risk budget {kstar['joint']['risk_budget']}, "
        f"theta_tv {kstar['theta_tv']}; u_th = -1 skips nothing",
    )
