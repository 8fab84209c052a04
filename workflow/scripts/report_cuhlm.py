"""Rule report_cuhlm (CU-HLM wing, edgespec.report): the CU-HLM summary table, the paper comparison
and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.cuhlm.evaluate import relative_to
from edgespec.report import markdown_table, paper_comparison

params = snakemake.params
scores = pd.read_parquet(snakemake.input.scores)
quality = scores.groupby("variant")[
    ["exact_match", "semantic_accuracy", "similarity_to_llm", "answer_fidelity"]
].mean()
metrics = [read_json(p) for p in snakemake.input.metrics]
rows = []
for channel in sorted(params.channels):
    by_variant = {}
    for m in metrics:
        if m["channel"] == channel:
            by_variant[m["variant"]] = {**m, **quality.loc[m["variant"]].to_dict()}
    for row in relative_to(by_variant, reference="hlm").values():
        cond = params.channels[channel]
        rows.append({**row, "fading": cond["fading"], "snr_db": cond["snr_db"]})
summary = pd.DataFrame(rows).drop(columns=["condition"])
order = {v: i for i, v in enumerate(params.variants)}
summary = summary.sort_values(
    ["fading", "snr_db", "variant"],
    key=lambda s: s.map(order) if s.name == "variant" else s,
    kind="stable",
)
write_csv(summary, snakemake.output.summary)

provenance = read_json(snakemake.input.provenance)
profile_source = summary["profile_source"].iloc[0]
pair = provenance.get("description", provenance.get("preset"))
subtitle = f"{provenance.get('preset')} pair; latency profile: {profile_source}"
comparison = paper_comparison(summary)
fit = read_json(snakemake.input.fit)
kstar = read_json(snakemake.input.kstar)
k_table = pd.read_csv(snakemake.input.k_table)
thresholds = pd.read_csv(snakemake.input.thresholds)
headline_cols = [
    "variant",
    "channel",
    "throughput_gain",
    "skip_rate",
    "true_skip_rate",
    "vocab_compression",
    "uplink_bytes_per_token",
    "measured_tvd_mean",
    "relative_semantic_accuracy",
    "relative_exact_match",
]
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text(
        "\n\n".join(
            [
                "# CU-HLM family: measured results",
                f"Model pair: {pair}. Compute times: {profile_source} profile "
                f"({'this machine' if profile_source == 'measured' else 'from config'}).",
                f"Calibration: beta = {fit['a']:.4f} u {fit['b']:+.4f} (R2 {fit['r2']:.3f}, "
                f"r {fit['pearson_r']:.3f}, {fit['n']} tokens); u_th used = {fit['u_th']:.4f} "
                f"({fit['threshold_rule']}); offline k* = {kstar['k_star']} of |V| = "
                f"{kstar['vocab_size']} (theta_tv = {kstar['theta_tv']}, {kstar['status']}).",
                "## Against the papers' numbers (same metric definitions)",
                markdown_table(comparison),
                "## Thresholds",
                markdown_table(thresholds),
                "## Top-k: online bound, measured TVD and how often each bound holds",
                markdown_table(k_table),
                "## Every variant and channel",
                markdown_table(summary[headline_cols]),
            ]
        )
        + "\n"
    )

plots.throughput_vs_snr(summary, snakemake.output.throughput, subtitle=subtitle)
ref_channel = (
    "rayleigh_snr10" if "rayleigh_snr10" in set(summary["channel"]) else summary["channel"].iloc[0]
)
plots.accuracy_vs_throughput(
    summary[summary["channel"] == ref_channel],
    ref_channel,
    snakemake.output.accuracy,
    subtitle=subtitle,
)
online_k = []
if snakemake.input.online:
    online = pd.read_parquet(snakemake.input.online)
    online_k = online.loc[online["uploaded"], "k"].to_numpy()
plots.k_distribution(
    online_k, kstar["vocab_size"], kstar["k_star"], snakemake.output.kdist, subtitle=subtitle
)
traces = pd.concat([pd.read_parquet(p, columns=["u"]) for p in snakemake.input.traces])
plots.skip_vs_threshold(traces["u"], thresholds, snakemake.output.skip, subtitle=subtitle)
