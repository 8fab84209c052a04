"""Rule report_wisv (WISV wing, edgespec.report): WISV against vanilla SD beside the paper's
numbers, and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import numpy as np
import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.report import markdown_table, wisv_comparison, wisv_relative
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import round_latencies

params = snakemake.params
metrics = pd.DataFrame([read_json(p) for p in snakemake.input.metrics]).drop(columns="condition")
summary = wisv_relative(metrics)
write_csv(summary, snakemake.output.summary)
head = read_json(snakemake.input.head)
provenance = read_json(snakemake.input.provenance)
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
subtitle = f"{provenance.get('preset')} pair; latency profile: {profile.source}"
cols = [
    "variant",
    "channel",
    "gamma",
    "aal",
    "aal_gain",
    "rounds_per_answer",
    "round_reduction",
    "e2e_latency_s",
    "latency_reduction",
    "uplink_bytes_per_token",
    "task_accuracy",
    "accuracy_drop",
    "semantic_accuracy",
    "answer_fidelity",
]
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text(
        "\n\n".join(
            [
                "# WISV: measured results",
                f"Model pair: {provenance.get('description', provenance.get('preset'))}. "
                f"Compute times: {profile.source} profile. Greedy decoding; gains and "
                "reductions are relative to vanilla SD on the same channel and gamma.",
                "## Against the paper's numbers (best setting, same definitions)",
                markdown_table(wisv_comparison(summary)),
                "## Decision heads",
                f"WISV head: validation AUC {head['wisv_head']['val_auc']:.3f}, tau "
                f"{head['wisv_head']['tau']:.3f}; no-CSI head: validation AUC "
                f"{head['no_csi_head']['val_auc']:.3f}, tau {head['no_csi_head']['tau']:.3f}.",
                "Accept rate of the WISV head on the same mined mismatches at each channel's "
                "mean state: "
                + ", ".join(f"{k} {v:.3f}" for k, v in head["accept_rate_by_channel"].items())
                + ".",
                "## Every variant, channel and gamma",
                markdown_table(summary[cols]),
            ]
        )
        + "\n"
    )

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
    curve_note = f"WISV rounds at gamma={gamma} priced at each SNR"
else:
    curve_note = "no WISV variant configured"
plots.latency_vs_channel(curves, snakemake.output.latency, subtitle=f"{subtitle}\n{curve_note}")
plots.aal_vs_gamma(summary, snakemake.output.aal, subtitle=subtitle)
plots.accuracy_vs_tau(
    {
        "WISV head": pd.DataFrame(head["tau_table_wisv"]),
        "no-CSI head": pd.DataFrame(head["tau_table_no_csi"]),
    },
    {"WISV head": head["wisv_head"]["tau"], "no-CSI head": head["no_csi_head"]["tau"]},
    snakemake.output.tau,
    subtitle=subtitle,
)
