"""Rule report_wisv (WISV wing, edgespec.wisv.summary): every WISV variant against vanilla SD with
intervals on common fading, beside the paper's numbers, and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from pathlib import Path

import numpy as np
import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.report import markdown_table, precision_paragraph
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import CSI_VARIANTS, round_latencies
from edgespec.wisv.summary import ANY_CHANNEL, display_table, headline, summarise

params = snakemake.params
costs = pd.concat([pd.read_parquet(p) for p in snakemake.input.costs], ignore_index=True)


def scores_of(path: str) -> list[pd.DataFrame]:
    """A score file's rows, keyed by the variants, channel and gamma its decode serves."""
    parts = Path(path).with_suffix("").parts
    stem = parts[parts.index("scores") + 1 :]
    frame = pd.read_parquet(path)
    gamma = int(stem[1][1:])
    if stem[0] == "wisv":
        channel, fseed = stem[2], int(stem[3][1:])
        return [
            frame.assign(variant=v, channel=channel, gamma=gamma, fading_index=fseed)
            for v in CSI_VARIANTS
        ]
    return [frame.assign(variant=stem[0], channel=ANY_CHANNEL, gamma=gamma, fading_index=-1)]


scores = pd.concat([f for p in snakemake.input.scores for f in scores_of(p)], ignore_index=True)
scores = scores[scores["variant"].isin(params.variants)]
summary = summarise(costs, scores, params.seed, params.evaluation)
write_csv(summary, snakemake.output.summary)
top = headline(summary)
write_csv(top, snakemake.output.headline)

head = read_json(snakemake.input.head)
head_times = read_json(snakemake.input.head_times)
labels = read_json(snakemake.input.labels)
relabel = read_json(snakemake.input.relabel)
provenance = read_json(snakemake.input.provenance)
precision = read_json(snakemake.input.precision)
quantization = (
    read_json(snakemake.input.quantization) if "quantization" in snakemake.input.keys() else None
)
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
subtitle = f"{provenance.get('preset')} pair; latency profile: {profile.source}"
seeds = params.evaluation["fading_seeds"]
crit = labels["criterion"]
head_names = {
    "wisv_head": "wisv_fh / wisv_sh (CSI, relabeled labels)",
    "relabel_no_csi_head": "head_relabel_no_csi (no CSI, relabeled labels)",
    "no_csi_head": "head_no_csi (no CSI, original labels)",
}
heads = pd.DataFrame(
    [
        {
            "head": label,
            "val AUC (own labels)": head[key]["val_auc"],
            "tau": head[key]["tau"],
            "val accept rate": head[key]["val_accept_rate"],
            "val unsafe accept rate": head[key]["val_unsafe_accept_rate"],
            "time per round (s)": head_times["head_round_s"][key],
        }
        for key, label in head_names.items()
    ]
)
ablation = summary[
    summary["variant"].isin(["head_no_csi", "head_relabel_no_csi", "wisv_fh"])
].copy()
ablation_cols = (
    ("latency vs vanilla (%)", "latency_reduction", -100.0),
    ("AAL vs vanilla (%)", "aal_gain", 100.0),
    ("accuracy drop (points)", "accuracy_drop", 100.0),
    ("semantic drop (points)", "semantic_drop", 100.0),
    ("answer fidelity", "answer_fidelity", 1.0),
)
validation = head["validation"]
span = relabel["ranges"]
lines = [
    "# WISV: measured results",
    f"Model pair: {provenance.get('description', provenance.get('preset'))}. Compute times: "
    f"{profile.source} profile (prompt prefill and the head's time per round included). Greedy "
    "decoding; gains and reductions are relative to vanilla SD on the same channel and gamma, "
    "seed by seed and prompt by prompt.",
    precision_paragraph(precision, quantization),
    f"**Common fading.** Every variant, at every channel and gamma, sees the same fading draw "
    f"for round r of prompt p under fading seed s (Gauss-Markov blocks, correlation "
    f"{params.wisv['correlation']} unless a channel sets its own). The channel-blind variants "
    f"are decoded once without a channel and priced under {seeds} seeds; the CSI-reading "
    f"wisv_fh/wisv_sh (one decode) are decoded under seeds {params.wisv['csi_decode_seeds']} "
    "of the same draws, per channel and gamma.",
    "**Intervals.** `x [a, b] (c, d)`: x the median over fading seeds, [a, b] the "
    f"{params.evaluation['seed_interval']:.0%} interval over seeds (only where a variant was "
    f"priced under several), (c, d) the {params.evaluation['bootstrap_interval']:.0%} "
    "percentile bootstrap over prompts. Accuracy-type figures: the mean over prompts and its "
    "bootstrap interval.",
    "## Against the paper's numbers (best setting, same definitions)",
    "WISV (arXiv 2604.17701) used Llama-3.2-1B / Llama-3.1-8B; `ours` is the median, "
    "`ours_lo`/`ours_hi` the bootstrap interval over prompts.",
    markdown_table(top),
    "## Labels",
    f"{labels['mismatches']} mismatches mined from {labels['prompts']} calibration prompts "
    f"({labels['answer_task_prompts']} with a gold answer), {labels['important']} important. "
    f"Label budget {labels['label_max_new_tokens']} tokens, each branch run to its stated "
    f"answer or EOS: {crit['answer']} labels from the stated answers, {crit['similarity']} from "
    f"the similarity ({crit['answer_task_fallback']} of them answer tasks where a branch never "
    "stated an answer).",
    "## Relabeling",
    f"{relabel['csi_samples']} CSI samples spanning the evaluation channels (bandwidth "
    f"{span['bandwidth_hz'][0] / 1e6:g}-{span['bandwidth_hz'][1] / 1e6:g} MHz, SNR "
    f"{span['snr_db'][0]:g}-{span['snr_db'][1]:g} dB, RTT {span['rtt_s'][0] * 1e3:g}-"
    f"{span['rtt_s'][1] * 1e3:g} ms). A repair "
    f"costs {relabel['repair_cost_rounds'][0]:.3f}-{relabel['repair_cost_rounds'][1]:.3f} rounds "
    f"of T_0 = {relabel['round_compute_s']:.3f} s, priced at the expected rate of the next "
    f"block given the CSI; lambda = {relabel['lam_rounds_per_risk']:g} rounds per unit risk, "
    f"risk budget {relabel['risk_budget']}. Safe fraction: {relabel['safe_before']:.3f} before "
    f"relabeling, {relabel['safe_best_channel']:.3f} at the best CSI sample, "
    f"{relabel['safe_worst_channel']:.3f} at the worst.",
    "## Decision heads",
    f"Every tau is chosen on the same {validation['mismatches']} original validation mismatches "
    f"({validation['important']} important) of {len(validation['prompts'])} held-out prompts, "
    f"under the same budget ({validation['max_accuracy_drop']:g} accepted important risk per "
    f"mismatch; the CSI head averaged over the {validation['csi_states']} CSI samples). Head "
    f"time: {head_times['head_time_source']}, gamma = {head_times['head_time_gamma']}.",
    markdown_table(heads),
    "Accept rate of the WISV head on the same mined mismatches at each channel's mean state: "
    + ", ".join(f"{k} {v:.3f}" for k, v in head["accept_rate_by_channel"].items())
    + ".",
    "## What reading the CSI adds (same protocol FH, same tau budget)",
    markdown_table(display_table(ablation, ablation_cols)),
    "## Every variant, channel and gamma",
    markdown_table(display_table(summary)),
]
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text("\n\n".join(lines) + "\n")

# FH against SH over channel quality: the WISV rounds priced at a sweep of average SNRs.
curves = {}
if snakemake.input.wisv_rounds:
    rounds = pd.read_parquet(snakemake.input.wisv_rounds[0])
    gamma = int(rounds["num_drafted"].iloc[0])
    protocol = {
        "vocab_size": provenance["models"]["target"]["logits_size"],
        "hidden_size": provenance["models"]["draft"]["hidden_size"],
        "bits_per_value": params.wisv["hidden_bits"],
    }
    snrs = np.arange(-20, 41, 2.5)
    # Each channel's bandwidth and RTT, swept over SNR: FH wins at long RTT or fast uplinks,
    # SH at short RTT and slow uplinks.
    for spec in params.channels.values():
        base = ChannelCondition.from_dict(spec)
        fields = {
            k: v for k, v in base.to_dict().items() if k not in ("tx_power_dbm", "distance_m")
        }
        for variant in ("wisv_fh", "wisv_sh"):
            lat = []
            for snr in snrs:
                cond = ChannelCondition.from_dict({**fields, "snr_db": float(snr)})
                priced = rounds.assign(rate_bps=np.asarray(uplink_rate_bps(cond, rounds["gain"])))
                per_round = round_latencies(priced, variant, protocol, profile, cond.rtt_s, gamma)
                lat.append(per_round.sum() / rounds["prompt_id"].nunique())
            label = (
                f"{variant[5:].upper()}, W {base.bandwidth_hz / 1e6:g} MHz, "
                f"RTT {base.rtt_s * 1e3:g} ms"
            )
            curves[label] = (snrs, np.asarray(lat))
    curve_note = f"WISV rounds at gamma={gamma} priced at each SNR (one fading seed)"
else:
    curve_note = "no WISV variant configured"
plots.latency_vs_channel(curves, snakemake.output.latency, subtitle=f"{subtitle}\n{curve_note}")
plots.aal_vs_gamma(summary, snakemake.output.aal, subtitle=subtitle)
plots.accuracy_vs_tau(
    {head_names[k]: pd.DataFrame(head[f"tau_table_{k}"]) for k in head_names},
    {head_names[k]: head[k]["tau"] for k in head_names},
    snakemake.output.tau,
    subtitle=subtitle,
)
