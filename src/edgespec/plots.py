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


def bound_vs_k(
    table: pd.DataFrame,
    theta_tv: float,
    k_star: int,
    path,
    subtitle=None,
    dense_k=None,
    dense_bound=None,
) -> None:
    """Average online TVD bound (every k when ``dense_k``/``dense_bound`` are given, and on the
    trace grid), measured residual and output TVD against k (log-log), with theta and k*."""
    fig, ax = plt.subplots(figsize=(6, 4))
    t = table[table["k"] < table["k"].max()]
    if dense_k is not None and dense_bound is not None:
        keep = np.asarray(dense_bound) > 0
        ax.plot(
            np.asarray(dense_k)[keep],
            np.asarray(dense_bound)[keep],
            "-",
            lw=1,
            color="C0",
            label="mean online bound, every k",
        )
    ax.plot(t["k"], t["mean_online_bound"], "o", color="C0", label="mean online bound (grid)")
    ax.plot(t["k"], t["mean_measured_tvd"], "s-", color="C1", label=r"mean TVD($r, \hat r$)")
    if "mean_output_tvd" in t:
        ax.plot(t["k"], t["mean_output_tvd"], "^-", color="C2", label=r"mean TVD($\hat y, y$)")
    ax.axhline(theta_tv, color="grey", ls="--", label=rf"$\theta_{{tv}}$ = {theta_tv:g}")
    ax.axvline(k_star, color="C3", ls=":", label=f"k* = {k_star}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("k (entries uploaded)")
    ax.set_ylabel("TVD")
    ax.legend(fontsize=7)
    _subtitle(ax, subtitle)
    _save(fig, path)


def _band_panels(summary, column, profiles, ylabel, path, subtitle, reference_line=None):
    """One panel per (profile, fading): ``column`` per variant against SNR, median line and a
    shaded ``column_lo``..``column_hi`` band (log y)."""
    fadings = sorted(summary["fading"].unique())
    fig, axes = plt.subplots(
        len(profiles),
        len(fadings),
        figsize=(5.5 * len(fadings), 3.8 * len(profiles)),
        squeeze=False,
    )
    variants = list(dict.fromkeys(summary["variant"]))
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    styles = {v: ("-" if i < 10 else "--") for i, v in enumerate(variants)}
    for r, (profile, label) in enumerate(profiles.items()):
        for c, fading in enumerate(fadings):
            ax = axes[r][c]
            part = summary[(summary["fading"] == fading) & (summary["profile"] == profile)]
            for variant, rows in part.groupby("variant", sort=False):
                rows = rows.sort_values("snr_db")
                ax.plot(
                    rows["snr_db"],
                    rows[column],
                    styles[variant],
                    marker="o",
                    ms=3,
                    color=colours[variant],
                    label=variant,
                )
                ax.fill_between(
                    rows["snr_db"],
                    rows[f"{column}_lo"],
                    rows[f"{column}_hi"],
                    color=colours[variant],
                    alpha=0.15,
                    lw=0,
                )
            if reference_line is not None:
                ax.axhline(reference_line, color="grey", lw=0.8, ls=":")
            ax.set_yscale("log")
            ax.set_xlabel("average SNR (dB)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{fading}; {label}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=6, loc="best")
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)


def throughput_vs_snr(summary: pd.DataFrame, path, profiles: dict, subtitle=None) -> None:
    """Token throughput per variant against SNR: median over fading seeds with its interval as
    a band, one panel per latency profile and fading model (log y)."""
    _band_panels(summary, "throughput_tps", profiles, "token throughput (tokens/s)", path, subtitle)


def gain_vs_snr(summary: pd.DataFrame, path, profiles: dict, subtitle=None) -> None:
    """Throughput gain over HLM (same fading draws) per variant against SNR, median and band."""
    _band_panels(
        summary, "throughput_gain", profiles, "throughput gain over HLM", path, subtitle, 1.0
    )


def accuracy_vs_throughput(rows: pd.DataFrame, channel: str, path, subtitle=None) -> None:
    """Semantic accuracy relative to HLM (bootstrap interval over prompts) against throughput
    gain (interval over fading seeds), one point per variant."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (_, row) in enumerate(rows.iterrows()):
        x, y = row["throughput_gain"], row["relative_semantic_accuracy"]
        xerr = [[max(x - row["throughput_gain_lo"], 0)], [max(row["throughput_gain_hi"] - x, 0)]]
        yerr = [
            [max(y - row["relative_semantic_accuracy_lo"], 0)],
            [max(row["relative_semantic_accuracy_hi"] - y, 0)],
        ]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", ms=4, capsize=2, color=f"C{i % 10}")
        ax.annotate(row["variant"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.axhline(1.0, color="grey", ls="--", lw=0.8)
    ax.set_xlabel(f"throughput gain over HLM ({channel})")
    ax.set_ylabel("semantic accuracy relative to HLM")
    _subtitle(ax, subtitle)
    _save(fig, path)


def joint_kstar_vs_snr(
    table: pd.DataFrame, offline_k: int, decoded_channel: str, path, subtitle=None
) -> None:
    """The joint programme's k* and u_th against SNR, one line per fading model; the offline
    k* (fixed threshold, rate-independent) as a reference and the decoded condition marked."""
    fig, (ax_k, ax_u) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (fading, rows) in enumerate(table.groupby("fading", sort=True)):
        rows = rows.sort_values("snr_db")
        ax_k.plot(rows["snr_db"], rows["k_star"], "o-", ms=3, color=f"C{i}", label=fading)
        ax_u.plot(rows["snr_db"], rows["u_th"], "o-", ms=3, color=f"C{i}", label=fading)
        mark = rows[rows["channel"] == decoded_channel]
        if len(mark):
            ax_k.plot(mark["snr_db"], mark["k_star"], "*", ms=12, color=f"C{i}")
            ax_u.plot(mark["snr_db"], mark["u_th"], "*", ms=12, color=f"C{i}")
    ax_k.axhline(offline_k, color="grey", ls=":", label=f"offline k* = {offline_k}")
    ax_k.set_yscale("log")
    ax_k.set_xlabel("average SNR (dB)")
    ax_k.set_ylabel("joint k*")
    ax_k.legend(fontsize=7)
    ax_u.set_xlabel("average SNR (dB)")
    ax_u.set_ylabel(r"joint $u_{th}$")
    ax_u.legend(fontsize=7)
    ax_k.set_title(f"star: decoded as cuhlm_joint ({decoded_channel})", fontsize=8)
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
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
    keys = [k for k in ("regime", "variant", "channel") if k in summary.columns]
    for key, rows in summary.groupby(keys, sort=False):
        *regime, variant, channel = key
        if regime:
            variant = f"{regime[0]}: {variant}"
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


# ---------------------------------------------------------------------------------------------
# Many devices, one edge (methods §10)
# ---------------------------------------------------------------------------------------------


def _against_devices(
    summary: pd.DataFrame,
    rows: list[tuple[str, str, bool]],
    path,
    subtitle,
    panels_by: tuple[str, ...] = ("channel", "uplink"),
    curves_by: str = "method",
):
    """One column per value of ``panels_by`` (channel and uplink scheme), one row per (metric,
    y label, log y), one curve per value of ``curves_by`` (method): the median over replicates
    against N, with its interval as a band."""
    panels = list(dict.fromkeys(summary[list(panels_by)].itertuples(index=False, name=None)))
    curves = list(dict.fromkeys(summary[curves_by]))
    fig, axes = plt.subplots(
        len(rows), len(panels), figsize=(4.6 * len(panels), 3.3 * len(rows)), squeeze=False
    )
    for c, panel in enumerate(panels):
        part = summary
        for column, value in zip(panels_by, panel, strict=True):
            part = part[part[column] == value]
        for r, (metric, label, log_y) in enumerate(rows):
            ax = axes[r][c]
            for i, curve in enumerate(curves):
                m = part[part[curves_by] == curve].sort_values("devices")
                if not len(m):
                    continue
                step = m["step"].iloc[0] if "step" in m else ""
                style = "o-" if step == "token" else "s--"
                name = f"{curve} (per {step})" if step and curves_by == "method" else str(curve)
                ax.plot(m["devices"], m[metric], style, ms=3, color=f"C{i % 10}", label=name)
                ax.fill_between(
                    m["devices"],
                    m[f"{metric}_lo"],
                    m[f"{metric}_hi"],
                    color=f"C{i % 10}",
                    alpha=0.15,
                    lw=0,
                )
            ax.set_xscale("log", base=2)
            counts = sorted(summary["devices"].unique())
            ax.set_xticks(counts, [str(int(n)) for n in counts])
            ax.xaxis.set_minor_locator(plt.NullLocator())  # only the simulated N
            if log_y:
                ax.set_yscale("log")
            ax.set_xlabel("devices sharing the edge (N)")
            ax.set_ylabel(label)
            ax.set_title(", ".join(map(str, panel)), fontsize=9)
            ax.grid(alpha=0.3, which="both")
    axes[0][-1].legend(fontsize=7, loc="best")
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)


def multidevice_scaling(summary: pd.DataFrame, path, subtitle=None) -> None:
    """Aggregate throughput and p95 latency per generated token against the number of
    devices under the base edge policy, one curve per method (CU-HLM solid, WISV dashed), one
    column per channel and uplink scheme, bands the intervals over replicates."""
    _against_devices(
        summary[summary["policy"] == "base"],
        [
            ("aggregate_tps", "aggregate throughput (tokens/s)", True),
            ("token_latency_p95_s", "p95 latency per generated token (s)", True),
        ],
        path,
        subtitle,
    )


def multidevice_utilisation(summary: pd.DataFrame, path, subtitle=None) -> None:
    """Edge and uplink utilisation and the edge's mean batch size against the number of
    devices under the base edge policy (a batching edge is busy long before it is full)."""
    _against_devices(
        summary[summary["policy"] == "base"],
        [
            ("edge_utilisation", "edge busy (fraction of time)", False),
            ("uplink_utilisation", "band carrying data (fraction of time)", False),
            ("mean_batch", "mean verification batch size", True),
        ],
        path,
        subtitle,
    )


def policy_vs_channel(curves: dict, path, subtitle=None) -> None:
    """Does the policy move with the channel: per regime, the relabeled safe fraction and the
    CSI head's held-out accept rate against each CSI sample's repair cost (rounds of T_0).
    ``curves``: regime -> {"safe": (cost, fraction), "accept": (cost, rate) or None}."""
    fig, axes = plt.subplots(1, max(len(curves), 1), figsize=(5 * max(len(curves), 1), 3.6))
    for ax, (regime, c) in zip(np.atleast_1d(axes), curves.items(), strict=False):
        for key, style, label in (
            ("safe", "o-", "safe fraction (relabeled)"),
            ("accept", "s--", "CSI head accept rate (held out)"),
        ):
            if c.get(key) is not None:
                x, y = (np.asarray(v, dtype=float) for v in c[key])
                order = np.argsort(x)
                ax.plot(x[order], y[order], style, ms=3, label=label)
        ax.set_xlabel("repair cost C_rep (rounds of T_0): channel quality, worse to the right")
        ax.set_ylabel("share of mismatches")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(regime, fontsize=9)
        ax.legend(fontsize=6)
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)


def latency_breakdown(table: pd.DataFrame, parts: dict, path, subtitle=None) -> None:
    """Stacked bars: each answer's mean latency by part (``parts``: column -> label), one bar
    per (variant, channel), one panel per (regime, gamma)."""
    panels = list(table.groupby(["regime", "gamma"], sort=False))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.5 * max(len(panels), 1), 4))
    for ax, ((regime, gamma), rows) in zip(np.atleast_1d(axes), panels, strict=False):
        labels = [f"{v}\n{c}" for v, c in zip(rows["variant"], rows["channel"], strict=True)]
        bottom = np.zeros(len(rows))
        for column, label in parts.items():
            values = rows[column].to_numpy(dtype=float)
            ax.bar(range(len(rows)), values, bottom=bottom, label=label)
            bottom += values
        ax.set_xticks(range(len(rows)), labels, fontsize=5, rotation=90)
        ax.set_ylabel("seconds per answer")
        ax.set_title(f"{regime}, gamma={gamma}", fontsize=9)
    np.atleast_1d(axes)[0].legend(fontsize=6)
    if subtitle:
        fig.suptitle(subtitle, fontsize=9)
    _save(fig, path)


def learning_curve(curves: dict, path, subtitle=None) -> None:
    """Held-out AUC against the number of training mismatches, per (regime, head)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, table in curves.items():
        t = pd.DataFrame(table)
        ax.plot(t["mismatches"], t["auc"], "o-", ms=3, label=label)
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("training mismatches")
    ax.set_ylabel("held-out ROC AUC (original labels)")
    ax.legend(fontsize=6)
    _subtitle(ax, subtitle)
    _save(fig, path)


def multidevice_policies(summary: pd.DataFrame, path, channel: str, subtitle=None) -> None:
    """The edge policy sweep (``max_batch``, batching window) on ``channel`` under the uplink
    scheme it was run at: aggregate throughput and p95 latency per generated token against N,
    one column per method, one curve per policy."""
    swept = summary[(summary["channel"] == channel) & (summary["policy"] != "base")]
    uplinks = set(swept["uplink"]) or set(summary["uplink"])
    part = summary[(summary["channel"] == channel) & summary["uplink"].isin(uplinks)]
    _against_devices(
        part,
        [
            ("aggregate_tps", "aggregate throughput (tokens/s)", True),
            ("token_latency_p95_s", "p95 latency per generated token (s)", True),
        ],
        path,
        subtitle,
        panels_by=("method", "uplink"),
        curves_by="policy",
    )


def testbed_against_simulator(summary: pd.DataFrame, terms: dict, path, subtitle=None) -> None:
    """Testbed against simulator, per method and channel (rows of ``summary``): left, the
    latency per answer measured and modelled, stacked by term (``terms``: column suffix ->
    label, columns ``measured_<term>`` and ``model_<term>``); right, the ratio measured /
    modelled with its interval over prompts (1 = the simulator's prediction)."""
    cells = [f"{r.method}\n{r.channel}" for r in summary.itertuples()]
    y = np.arange(len(cells))
    fig, (bars, ratio) = plt.subplots(
        1, 2, figsize=(11, 0.55 * len(cells) + 1.8), gridspec_kw={"width_ratios": [2, 1]}
    )
    for offset, side, hatch in ((-0.2, "measured", None), (0.2, "model", "//")):
        left = np.zeros(len(cells))
        for i, (term, label) in enumerate(terms.items()):
            width = summary[f"{side}_{term}"].to_numpy(dtype=float).clip(min=0)
            bars.barh(
                y + offset,
                width,
                0.38,
                left=left,
                color=f"C{i}",
                hatch=hatch,
                label=label if side == "measured" else None,
            )
            left += width
    bars.set_yticks(y, cells, fontsize=7)
    bars.invert_yaxis()
    bars.set_xscale("symlog", linthresh=0.1)
    bars.set_xlabel("latency per answer (s): upper bar measured, hatched bar modelled")
    bars.legend(fontsize=7, loc="lower right")
    point = summary["ratio"].to_numpy(dtype=float)
    err = np.vstack([point - summary["ratio_lo"], summary["ratio_hi"] - point])
    ratio.errorbar(point, y, xerr=np.abs(err), fmt="o", ms=4, capsize=3)
    ratio.axvline(1.0, color="grey", lw=0.8)
    ratio.set_yticks(y, [])
    ratio.invert_yaxis()
    ratio.set_xscale("log")
    ratio.set_xlabel("measured / modelled latency")
    _subtitle(bars, subtitle)
    _save(fig, path)
