"""Rule report_cuhlm (CU-HLM wing, edgespec.cuhlm.summary, edgespec.report, edgespec.plots): the
CU-HLM summary with intervals under both latency profiles, the paper comparison, the headline
table and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.cuhlm.summary import summary_table
from edgespec.hardware import HardwareSpec, roofline_profile
from edgespec.report import headline_table, markdown_table, paper_comparison, precision_paragraph

params = snakemake.params
evaluation = params.evaluation
fit = read_json(snakemake.input.fit)
kstar = read_json(snakemake.input.kstar)
vocab_size = kstar["vocab_size"]
primary = read_json(snakemake.input.profile)
provenance = read_json(snakemake.input.provenance)
precision = read_json(snakemake.input.precision)
quantization = (
    read_json(snakemake.input.quantization) if "quantization" in snakemake.input.keys() else None
)
metrics = pd.concat([pd.read_parquet(p) for p in snakemake.input.metrics], ignore_index=True)
tokens = {
    variant: pd.read_parquet(path)
    for variant, path in zip(params.variants, snakemake.input.tokens, strict=True)
}
scores = pd.read_parquet(snakemake.input.scores)

summary = summary_table(
    metrics,
    tokens,
    scores,
    vocab_size,
    params.prob_bits,
    params.seed,
    evaluation["seed_interval"],
    evaluation["bootstrap_interval"],
    evaluation["bootstrap_samples"],
)
order = {v: i for i, v in enumerate(params.variants)}
summary = summary.sort_values(
    ["profile", "fading", "snr_db", "variant"],
    key=lambda s: s.map(order) if s.name == "variant" else s,
    kind="stable",
).reset_index(drop=True)
write_csv(summary, snakemake.output.summary)

primary_label = (
    "measured compute (this machine)"
    if primary.get("source") == "measured"
    else f"{primary.get('source')} compute (latency.given)"
)
profiles = {"primary": primary_label}
hardware_text = "not evaluated (latency.paper_hardware.enabled: false)"
if "paper_hw" in set(summary["profile"]):
    profiles["paper_hw"] = "emulated paper hardware"
    paper_profile, derivation = roofline_profile(
        HardwareSpec.from_dict(params.paper_hardware), vocab_size, params.uncertainty_samples
    )
    hardware_text = (
        f"draft {derivation['draft_params']:.3g} parameters x {derivation['bytes_per_weight']:g} B "
        f"on {derivation['device_name']} ({derivation['device_bandwidth_gb_s']:g} GB/s): "
        f"tau_SLM = {1e3 * paper_profile.draft_token_s:.2f} ms; target "
        f"{derivation['target_params']:.3g} x {derivation['bytes_per_weight']:g} B on "
        f"{derivation['edge_name']} ({derivation['edge_bandwidth_gb_s']:g} GB/s): tau_LLM = "
        f"{1e3 * paper_profile.target_token_s:.2f} ms; one pass over the |V| = {vocab_size} "
        f"logits {1e6 * derivation['vocab_pass_s']:.2f} us (uncertainty "
        f"{derivation['uncertainty_passes']} passes, online k(t) "
        f"{derivation['online_k_passes']}, top-k 1)"
    )
primary_text = (
    f"tau_SLM = {1e3 * primary['draft_token_s']:.2f} ms, tau_LLM = "
    f"{1e3 * primary['target_token_s']:.2f} ms, tau_unc = {1e3 * primary['uncertainty_s']:.2f} "
    f"ms, online k(t) = {1e3 * primary.get('online_k_s', 0.0):.2f} ms, top-k extraction "
    + ", ".join(f"k={k}: {1e3 * s:.3f} ms" for k, s in primary.get("topk_s", {}).items())
)

comparison = paper_comparison(summary, profiles)
write_csv(headline_table(summary, profiles), snakemake.output.headline)
joint_table = pd.read_csv(snakemake.input.joint)
k_table = pd.read_csv(snakemake.input.k_table)
thresholds = pd.read_csv(snakemake.input.thresholds)
channel = params.kstar_channel


def cell(row, column, scale=1.0, unit=""):
    point, low, high = row[column], row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if pd.isna(point):
        return "n/a"
    if low is None or pd.isna(low) or pd.isna(high):
        return f"{point * scale:.3g}{unit}"
    return f"{point * scale:.3g}{unit} [{low * scale:.3g}, {high * scale:.3g}]"


def variant_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, channel) with the profile-dependent columns side by side."""
    if frame.empty:
        return pd.DataFrame({"note": ["none of these variants was evaluated (cuhlm.variants)"]})
    base = frame[frame["profile"] == "primary"]
    out = []
    for _, row in base.iterrows():
        line = {"variant": row["variant"], "channel": row["channel"]}
        for profile, label in profiles.items():
            other = frame[
                (frame["profile"] == profile)
                & (frame["variant"] == row["variant"])
                & (frame["channel"] == row["channel"])
            ].iloc[0]
            line[f"gain over HLM ({label})"] = cell(other, "throughput_gain", unit="x")
            line[f"tokens/s ({label})"] = cell(other, "throughput_tps")
        line.update(
            {
                "skip rate": cell(row, "skip_rate", 100, "%"),
                "vocab. compression": cell(row, "vocab_compression", 100, "%"),
                "uplink B/token": cell(row, "uplink_bytes_per_token"),
                "TVD(r, r_hat)": cell(row, "measured_tvd_mean"),
                "TVD(y_hat, y)": cell(row, "output_tvd_mean"),
                "acceptance": cell(row, "acceptance_rate", 100, "%"),
                "semantic acc. vs HLM": cell(row, "relative_semantic_accuracy", 100, "%"),
            }
        )
        out.append(line)
    return pd.DataFrame(out)


exact_rows = summary[
    summary["variant"].isin(["cuhlm_offline", "cuhlm_exact", "cuhlm_joint"])
    & (summary["channel"] == channel)
]
slm_only = fit.get("slm_only_variants") or []
seeds = int(summary["fading_seeds"].max())
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text(
        "\n\n".join(
            [
                "# CU-HLM family: measured results",
                f"Model pair: {provenance.get('description', provenance.get('preset'))}. "
                + precision_paragraph(precision, quantization),
                "Every delay-based figure (throughput, latency, gain over HLM) is the median over "
                f"{seeds} fading seeds with its central {100 * evaluation['seed_interval']:g}% "
                "interval in brackets; gains are taken per seed against HLM under the same "
                "fading draws (common random numbers: the same normalised draws for every "
                "variant and SNR at each prompt, token position and seed). Token-level "
                "fractions and accuracy figures carry a "
                f"{100 * evaluation['bootstrap_interval']:g}% bootstrap interval over the "
                f"evaluation prompts ({evaluation['bootstrap_samples']} resamples). Under "
                "Rayleigh fading E[1/R] is unbounded, so single-draw throughputs swing widely; "
                "hence the intervals.",
                f"Latency profiles: **{primary_label}**: {primary_text}. "
                f"**Emulated paper hardware** (memory-bound roofline, methods §5): "
                f"{hardware_text}. The papers' vocabulary is 32,000 tokens; ours is "
                f"{vocab_size}, so a full upload is {vocab_size / 32000:.2f}x the papers' in "
                "both columns.",
                f"Calibration: beta = {fit['a']:.4f} u {fit['b']:+.4f} (R2 {fit['r2']:.3f}, "
                f"r {fit['pearson_r']:.3f}, {fit['n']} tokens); u_th used = {fit['u_th']:.4f} "
                f"({fit['threshold_rule']})."
                + (
                    f" **Warning**: a threshold >= 1 was clamped to 1; {', '.join(slm_only)} "
                    "skip every token and have become SLM-only."
                    if slm_only
                    else ""
                ),
                f"Offline k* = {kstar['k_star']} of |V| = {vocab_size} ({kstar['k_search']}; "
                f"threshold fixed, so k* is the smallest k whose mean online bound is within "
                f"theta_tv = {kstar['theta_tv']}, whatever the rate). Joint (u_th, k) programme "
                f"(risk budget {kstar['joint']['risk_budget']}), decoded as `cuhlm_joint` at "
                f"{channel} only: k* = {kstar['joint']['k_star']}, u_th = "
                f"{kstar['joint']['u_th']:.4g}. Draft distributions of the calibration tokens "
                f"were replayed for the every-k search: mean |x_d replay - x_d trace| = "
                f"{kstar['replay']['mean_abs_x_d_diff']:.2g}.",
                "## Against the papers' numbers (same metric definitions)",
                markdown_table(comparison),
                "## Joint k* and u_th against SNR (one programme per channel; only "
                f"{channel} is decoded, as cuhlm_joint)",
                markdown_table(
                    joint_table[
                        [
                            "channel",
                            "snr_db",
                            "ergodic_rate_bps",
                            "k_star",
                            "u_th",
                            "skip_fraction",
                            "skip_risk",
                            "expected_latency_s",
                            "decoded",
                        ]
                    ]
                ),
                f"## What exact verification costs ({channel})",
                "cuhlm_exact draws d from the uploaded x_hat (same k* and bytes as "
                "cuhlm_offline), so its output law is y: TVD(y_hat, y) = 0.",
                markdown_table(variant_rows(exact_rows)),
                "## Thresholds",
                markdown_table(thresholds),
                "## Top-k on the trace grid: online bound, residual and output TVD, and how "
                "often each bound holds for each",
                markdown_table(k_table),
                "## Every variant and channel",
                markdown_table(variant_rows(summary)),
            ]
        )
        + "\n"
    )

subtitle = f"{provenance.get('preset')} pair; {seeds} fading seeds, median and interval"
plots.throughput_vs_snr(summary, snakemake.output.throughput, profiles, subtitle=subtitle)
plots.gain_vs_snr(summary, snakemake.output.gain, profiles, subtitle=subtitle)
ref_channel = channel if channel in set(summary["channel"]) else summary["channel"].iloc[0]
plots.accuracy_vs_throughput(
    summary[(summary["channel"] == ref_channel) & (summary["profile"] == "primary")],
    ref_channel,
    snakemake.output.accuracy,
    subtitle=subtitle,
)
online_k = []
if "cuhlm_online" in tokens:
    online = tokens["cuhlm_online"]
    online_k = online.loc[online["uploaded"], "k"].to_numpy()
plots.k_distribution(
    online_k, vocab_size, kstar["k_star"], snakemake.output.kdist, subtitle=subtitle
)
traces = pd.concat([pd.read_parquet(p, columns=["u"]) for p in snakemake.input.traces])
plots.skip_vs_threshold(traces["u"], thresholds, snakemake.output.skip, subtitle=subtitle)
plots.joint_kstar_vs_snr(
    joint_table,
    kstar["k_star"],
    channel,
    snakemake.output.joint_figure,
    subtitle=f"{provenance.get('preset')} pair; risk budget {kstar['joint']['risk_budget']}, "
    f"theta_tv {kstar['theta_tv']}; u_th = -1 skips nothing",
)
