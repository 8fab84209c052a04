"""Figures of the report. Each function takes tables, writes one PNG atomically, returns nothing."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from edgespec.artifacts import atomic_path  # noqa: E402


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _subtitle(ax, text: str | None) -> None:
    if text:
        ax.set_title(text, fontsize=9)


def beta_vs_u(u, beta, bins: pd.DataFrame, a: float, b: float, path, subtitle=None) -> None:
    """Rejection probability against uncertainty: tokens, per-u means with CI, and the fit."""
    fig, ax = plt.subplots(figsize=(6, 4))
    rng = np.random.default_rng(0)  # jitter only, so overlapping points stay visible
    jitter = rng.uniform(-0.01, 0.01, size=len(u))
    ax.scatter(np.asarray(u) + jitter, beta, s=4, alpha=0.15, color="grey", label="tokens")
    ax.errorbar(
        bins["u_mean"],
        bins["beta_mean"],
        yerr=[bins["beta_mean"] - bins["ci_low"], bins["ci_high"] - bins["beta_mean"]],
        fmt="o",
        color="C0",
        ms=4,
        capsize=2,
        label="mean per u (95% CI)",
    )
    grid = np.linspace(0, 1, 101)
    ax.plot(grid, np.clip(a * grid + b, 0, 1), color="C3", label=f"fit: {a:.3f} u {b:+.3f}")
    ax.set_xlabel("uncertainty u(t)")
    ax.set_ylabel(r"rejection probability $\beta_d$")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    _subtitle(ax, subtitle)
    _save(fig, path)


def bound_vs_k(table: pd.DataFrame, theta_tv: float, k_star: int, path, subtitle=None) -> None:
    """Average online TVD bound and measured TVD against k (log-log), with theta and k*."""
    fig, ax = plt.subplots(figsize=(6, 4))
    t = table[table["k"] < table["k"].max()]
    ax.plot(t["k"], t["mean_online_bound"], "o-", label="mean online bound")
    ax.plot(t["k"], t["mean_measured_tvd"], "s-", label="mean measured TVD")
    ax.axhline(theta_tv, color="grey", ls="--", label=rf"$\theta_{{tv}}$ = {theta_tv:g}")
    ax.axvline(k_star, color="C3", ls=":", label=f"k* = {k_star}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("k (entries uploaded)")
    ax.set_ylabel("TVD")
    ax.legend(fontsize=8)
    _subtitle(ax, subtitle)
    _save(fig, path)


def throughput_vs_snr(summary: pd.DataFrame, path, subtitle=None) -> None:
    """Token throughput per variant against SNR, one panel per fading model (log y)."""
    fadings = sorted(summary["fading"].unique())
    fig, axes = plt.subplots(1, len(fadings), figsize=(5.5 * len(fadings), 4), squeeze=False)
    for ax, fading in zip(axes[0], fadings, strict=True):
        part = summary[summary["fading"] == fading]
        for variant, rows in part.groupby("variant", sort=False):
            rows = rows.sort_values("snr_db")
            ax.plot(rows["snr_db"], rows["throughput_tps"], "o-", ms=3, label=variant)
        ax.set_yscale("log")
        ax.set_xlabel("average SNR (dB)")
        ax.set_ylabel("token throughput (tokens/s)")
        ax.set_title(fading, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=7, loc="best")
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)


def accuracy_vs_throughput(rows: pd.DataFrame, channel: str, path, subtitle=None) -> None:
    """Semantic accuracy relative to HLM against throughput gain, one point per variant."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for _, row in rows.iterrows():
        ax.scatter(row["throughput_gain"], row["relative_semantic_accuracy"], s=30)
        ax.annotate(
            row["variant"],
            (row["throughput_gain"], row["relative_semantic_accuracy"]),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.axhline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_xlabel(f"throughput gain over HLM ({channel})")
    ax.set_ylabel("semantic accuracy relative to HLM")
    _subtitle(ax, subtitle)
    _save(fig, path)


def k_distribution(k_values, vocab_size: int, k_star: int | None, path, subtitle=None) -> None:
    """Histogram of the online k(t) over uploaded tokens (log-spaced bins)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    k_values = np.asarray(k_values)
    if len(k_values):
        edges = np.unique(np.geomspace(1, vocab_size, 40).astype(int))
        ax.hist(k_values, bins=edges, color="C0")
    if k_star:
        ax.axvline(k_star, color="C3", ls=":", label=f"offline k* = {k_star}")
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("k(t) (entries uploaded per transmitted token)")
    ax.set_ylabel("tokens")
    _subtitle(ax, subtitle)
    _save(fig, path)


def skip_vs_threshold(u, thresholds: pd.DataFrame, path, subtitle=None) -> None:
    """Skip rate P(u <= u_th) on the traces, with the configured thresholds marked."""
    fig, ax = plt.subplots(figsize=(6, 4))
    u = np.sort(np.asarray(u))
    grid = np.linspace(0, 1, 201)
    ax.plot(grid, np.searchsorted(u, grid, side="right") / max(len(u), 1), color="C0")
    for i, row in enumerate(thresholds.itertuples()):
        if row.u_th >= 0:
            ax.axvline(
                row.u_th, color=f"C{(i % 9) + 1}", ls=":", label=f"{row.rule}: {row.u_th:.3f}"
            )
    ax.set_xlabel(r"threshold $u_{th}$")
    ax.set_ylabel("skip rate on calibration traces")
    ax.legend(fontsize=7)
    _subtitle(ax, subtitle)
    _save(fig, path)


def safe_vs_channel(safe: pd.DataFrame, base_safe_fraction: float, path, subtitle=None) -> None:
    """Fraction of mismatches relabeled safe against the repair cost of each CSI sample."""
    fig, ax = plt.subplots(figsize=(6, 4))
    sc = ax.scatter(
        safe["repair_cost"], safe["safe_fraction"], c=safe["snr_db_mean"], cmap="viridis"
    )
    fig.colorbar(sc, ax=ax, label="average SNR of the CSI sample (dB)")
    if not np.isnan(base_safe_fraction):
        ax.axhline(base_safe_fraction, color="grey", ls="--", label="safe before relabeling")
        ax.legend(fontsize=8)
    ax.set_xlabel(r"repair cost under the CSI (rounds of compute $T_0$)")
    ax.set_ylabel("fraction of mismatches labeled safe")
    _subtitle(ax, subtitle)
    _save(fig, path)


def head_calibration(curves: dict, path, bins: int = 10) -> None:
    """Reliability diagram: mean predicted q against the observed safe fraction, per head."""
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=0.8)
    edges = np.linspace(0, 1, bins + 1)
    for label, (q, y) in curves.items():
        q, y = np.asarray(q), np.asarray(y)
        which = np.clip(np.digitize(q, edges) - 1, 0, bins - 1)
        xs, ys = [], []
        for b in range(bins):
            sel = which == b
            if sel.any():
                xs.append(q[sel].mean())
                ys.append(y[sel].mean())
        ax.plot(xs, ys, "o-", label=f"{label} (n={len(q)})")
    ax.set_xlabel("predicted probability safe (validation)")
    ax.set_ylabel("observed fraction safe")
    ax.legend(fontsize=7)
    _save(fig, path)


def latency_vs_channel(curves: dict, path, subtitle=None) -> None:
    """End-to-end latency per answer of FH and SH over average SNR (where each protocol wins)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, (snr, latency)) in enumerate(curves.items()):
        style = "o-" if label.startswith("FH") else "s--"
        ax.plot(snr, latency, style, ms=3, color=f"C{i // 2}", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("average uplink SNR (dB)")
    ax.set_ylabel("end-to-end latency per answer (s)")
    ax.legend(fontsize=8)
    _subtitle(ax, subtitle)
    _save(fig, path)


def aal_vs_gamma(summary: pd.DataFrame, path, subtitle=None) -> None:
    """Accepted length per round against gamma, per variant and channel (with the bootstrap
    interval over prompts where the summary has one)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for (variant, channel), rows in summary.groupby(["variant", "channel"], sort=False):
        rows = rows.sort_values("gamma")
        if {"aal_lo", "aal_hi"} <= set(rows.columns):
            err = np.vstack([rows["aal"] - rows["aal_lo"], rows["aal_hi"] - rows["aal"]])
            ax.errorbar(
                rows["gamma"],
                rows["aal"],
                yerr=np.clip(err, 0, None),
                fmt="o-",
                ms=3,
                capsize=2,
                label=f"{variant} ({channel})",
            )
        else:
            ax.plot(rows["gamma"], rows["aal"], "o-", ms=3, label=f"{variant} ({channel})")
    ax.set_xlabel(r"draft length $\gamma$")
    ax.set_ylabel("tokens committed per round (AAL)")
    ax.legend(fontsize=6, ncol=2)
    _subtitle(ax, subtitle)
    _save(fig, path)


def accuracy_vs_tau(tables: dict, chosen: dict, path, subtitle=None) -> None:
    """Validation: accept rate of important (answer-changing) mismatches against tau."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, table) in enumerate(tables.items()):
        t = table.sort_values("tau")
        ax.plot(t["tau"], t["unsafe_accept_rate"], "-", color=f"C{i}", label=f"{label}: unsafe")
        ax.plot(t["tau"], t["accept_rate"], ":", color=f"C{i}", label=f"{label}: all mismatches")
        ax.axvline(chosen[label], color=f"C{i}", ls="--", lw=0.8)
    ax.set_xlabel(r"acceptance threshold $\tau$")
    ax.set_ylabel("fraction of validation mismatches accepted")
    ax.legend(fontsize=7)
    _subtitle(ax, subtitle)
    _save(fig, path)
