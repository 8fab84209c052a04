"""The WISV report (rule report_wisv): the Markdown summary and the figures' data; torch-free.

The tables themselves (medians over fading seeds with their intervals, the headline against
the paper's numbers) are ``edgespec.wisv.summary``'s. This module reads the per-decode text
scores (:func:`read_scores`), writes the prose around the tables from the other stages'
summaries (:func:`report_markdown`: labels, relabeling, decision heads, the ablation that
isolates what reading the CSI adds) and prices the WISV rounds over a sweep of SNRs for the
FH-against-SH figure (:func:`latency_curves`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgespec.report import markdown_table, precision_paragraph
from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import ChannelCondition, block_packet_error_rate, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import CSI_VARIANTS, head_round_s, protocol_params, round_latencies
from edgespec.wisv.summary import ANY_CHANNEL, display_table

HEAD_NAMES = {
    "wisv_head": "wisv_fh / wisv_sh (CSI, relabeled labels)",
    "relabel_no_csi_head": "head_relabel_no_csi (no CSI, relabeled labels)",
    "no_csi_head": "head_no_csi (no CSI, original labels)",
}
"""Each decision head (rule train_head's key) by the variants that run it, in report order."""

ABLATION_VARIANTS = ("head_no_csi", "head_relabel_no_csi", "wisv_fh")
"""The variants that share protocol FH and the tau budget: what reading the CSI adds."""

ABLATION_COLUMNS = (
    ("latency vs vanilla (%)", "latency_reduction", -100.0),
    ("AAL vs vanilla (%)", "aal_gain", 100.0),
    ("accuracy drop (points)", "accuracy_drop", 100.0),
    ("semantic drop (points)", "semantic_drop", 100.0),
    ("answer fidelity", "answer_fidelity", 1.0),
)
"""(header, summary column, scale) of the ablation table (``summary.display_table``)."""

SNR_SWEEP_DB = np.arange(-20, 41, 2.5)
"""Average SNRs [dB] the FH-against-SH figure prices the WISV rounds at."""


def scores_of(path: str | Path) -> list[pd.DataFrame]:
    """A score file's rows (rule score_wisv, ``.../scores/<decode stem>.parquet``), keyed by
    the variants, channel, gamma and fading seed index its decode serves: a CSI decode
    (``wisv/g<gamma>/<channel>/s<seed>``) serves every CSI-reading variant, a channel-free one
    (``<variant>/g<gamma>/any``) its variant under every channel (``ANY_CHANNEL``, index -1)."""
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


def read_scores(paths: Sequence[str | Path], variants: Sequence[str]) -> pd.DataFrame:
    """Every score file's keyed rows (:func:`scores_of`), of the configured ``variants``."""
    scores = pd.concat([f for p in paths for f in scores_of(p)], ignore_index=True)
    return scores[scores["variant"].isin(variants)]


@dataclass(frozen=True)
class ReportInputs:
    """What the prose reads: rule train_head's metrics (``head``), profile_head's times
    (``head_times``), join_labels' and relabel_csi's summaries (``labels``, ``relabel``), the
    models' provenance, the run's precision (and quantisation, None where none) and the
    latency profile."""

    head: Mapping[str, Any]
    head_times: Mapping[str, Any]
    labels: Mapping[str, Any]
    relabel: Mapping[str, Any]
    provenance: Mapping[str, Any]
    precision: Mapping[str, Any]
    quantization: Mapping[str, Any] | None
    profile: LatencyProfile

    @property
    def subtitle(self) -> str:
        """The figures' subtitle: the model pair and where the compute times come from."""
        return f"{self.provenance.get('preset')} pair; latency profile: {self.profile.source}"


def heads_table(head: Mapping[str, Any], head_times: Mapping[str, Any]) -> pd.DataFrame:
    """One row per decision head (``HEAD_NAMES`` order): validation AUC on its own labels,
    tau, validation accept and unsafe accept rates, and its time per round [s]."""
    return pd.DataFrame(
        [
            {
                "head": label,
                "val AUC (own labels)": head[key]["val_auc"],
                "tau": head[key]["tau"],
                "val accept rate": head[key]["val_accept_rate"],
                "val unsafe accept rate": head[key]["val_unsafe_accept_rate"],
                "time per round (s)": head_times["head_round_s"][key],
            }
            for key, label in HEAD_NAMES.items()
        ]
    )


def labels_paragraph(labels: Mapping[str, Any]) -> str:
    """The mined labels: counts, the label budget and how each label was decided."""
    crit = labels["criterion"]
    return (
        f"{labels['mismatches']} mismatches mined from {labels['prompts']} calibration prompts "
        f"({labels['answer_task_prompts']} with a gold answer), {labels['important']} important. "
        f"Label budget {labels['label_max_new_tokens']} tokens, each branch run to its stated "
        f"answer or EOS: {crit['answer']} labels from the stated answers, {crit['similarity']} "
        f"from the similarity ({crit['answer_task_fallback']} of them answer tasks where a branch "
        "never stated an answer)."
    )


def relabel_paragraph(relabel: Mapping[str, Any]) -> str:
    """The relabeling: the CSI samples' span, what a repair costs, the trade-off and the safe
    fractions."""
    span = relabel["ranges"]
    return (
        f"{relabel['csi_samples']} CSI samples spanning the evaluation channels (bandwidth "
        f"{span['bandwidth_hz'][0] / 1e6:g}-{span['bandwidth_hz'][1] / 1e6:g} MHz, SNR "
        f"{span['snr_db'][0]:g}-{span['snr_db'][1]:g} dB, RTT {span['rtt_s'][0] * 1e3:g}-"
        f"{span['rtt_s'][1] * 1e3:g} ms). A repair "
        f"costs {relabel['repair_cost_rounds'][0]:.3f}-{relabel['repair_cost_rounds'][1]:.3f} "
        f"rounds of T_0 = {relabel['round_compute_s']:.3f} s, priced at the expected rate of the "
        f"next block given the CSI; lambda = {relabel['lam_rounds_per_risk']:g} rounds per unit "
        f"risk, risk budget {relabel['risk_budget']}. Safe fraction: "
        f"{relabel['safe_before']:.3f} before relabeling, {relabel['safe_best_channel']:.3f} at "
        f"the best CSI sample, {relabel['safe_worst_channel']:.3f} at the worst."
    )


def heads_section(inputs: ReportInputs) -> list[str]:
    """The decision heads: the shared validation budget, the heads' table and the WISV head's
    accept rate at each channel's mean state."""
    validation, times = inputs.head["validation"], inputs.head_times
    return [
        f"Every tau is chosen on the same {validation['mismatches']} original validation "
        f"mismatches ({validation['important']} important) of {len(validation['prompts'])} "
        f"held-out prompts, under the same budget ({validation['max_accuracy_drop']:g} accepted "
        f"important risk per mismatch; the CSI head averaged over the "
        f"{validation['csi_states']} CSI samples). Head time: {times['head_time_source']}, "
        f"gamma = {times['head_time_gamma']}.",
        markdown_table(heads_table(inputs.head, times)),
        "Accept rate of the WISV head on the same mined mismatches at each channel's mean state: "
        + ", ".join(f"{k} {v:.3f}" for k, v in inputs.head["accept_rate_by_channel"].items())
        + ".",
    ]


def report_markdown(
    summary: pd.DataFrame,
    top: pd.DataFrame,
    inputs: ReportInputs,
    wisv: Mapping[str, Any],
    evaluation: Mapping[str, Any],
) -> str:
    """The WISV report (``results/report/wisv_summary.md``): ``summary`` (``summarise``) and
    its headline ``top`` (``headline``) with the prose of ``inputs``; ``wisv`` config keys
    wisv.correlation and wisv.csi_decode_seeds, ``evaluation`` evaluation.fading_seeds,
    seed_interval and bootstrap_interval."""
    provenance, profile = inputs.provenance, inputs.profile
    ablation = summary[summary["variant"].isin(ABLATION_VARIANTS)].copy()
    lines = [
        "# WISV: measured results",
        f"Model pair: {provenance.get('description', provenance.get('preset'))}. Compute times: "
        f"{profile.source} profile (prompt prefill and the head's time per round included). "
        "Greedy decoding; gains and reductions are relative to vanilla SD on the same channel "
        "and gamma, seed by seed and prompt by prompt.",
        precision_paragraph(inputs.precision, inputs.quantization),
        f"**Common fading.** Every variant, at every channel and gamma, sees the same fading draw "
        f"for round r of prompt p under fading seed s (Gauss-Markov blocks, correlation "
        f"{wisv['correlation']} unless a channel sets its own). The channel-blind variants "
        f"are decoded once without a channel and priced under {evaluation['fading_seeds']} "
        f"seeds; the CSI-reading wisv_fh/wisv_sh (one decode) are decoded under seeds "
        f"{wisv['csi_decode_seeds']} of the same draws, per channel and gamma.",
        "**Intervals.** `x [a, b] (c, d)`: x the median over fading seeds, [a, b] the "
        f"{evaluation['seed_interval']:.0%} interval over seeds (only where a variant was "
        f"priced under several), (c, d) the {evaluation['bootstrap_interval']:.0%} "
        "percentile bootstrap over prompts. Accuracy-type figures: the mean over prompts and its "
        "bootstrap interval.",
        "## Against the paper's numbers (best setting, same definitions)",
        "WISV (arXiv 2604.17701) used Llama-3.2-1B / Llama-3.1-8B; `ours` is the median, "
        "`ours_lo`/`ours_hi` the bootstrap interval over prompts.",
        markdown_table(top),
        "## Labels",
        labels_paragraph(inputs.labels),
        "## Relabeling",
        relabel_paragraph(inputs.relabel),
        "## Decision heads",
        *heads_section(inputs),
        "## What reading the CSI adds (same protocol FH, same tau budget)",
        markdown_table(display_table(ablation, ABLATION_COLUMNS)),
        "## Every variant, channel and gamma",
        markdown_table(display_table(summary)),
    ]
    return "\n\n".join(lines) + "\n"


def latency_curves(
    rounds: pd.DataFrame | None,
    channels: Mapping[str, Mapping[str, Any]],
    inputs: ReportInputs,
    hidden_bits: int,
    snrs: np.ndarray = SNR_SWEEP_DB,
    arq: ArqSettings | None = None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """FH against SH over channel quality: the WISV ``rounds`` (one CSI decode, its gains;
    None where no WISV variant is configured) priced under each channel's bandwidth, RTT and
    packet-error fit at every average SNR of ``snrs`` [dB], as the mean latency per answer [s]
    of each protocol, charged as the main evaluation charges them (every draft forward, the
    head's time per round, retransmissions under ``arq``, each prompt's prefill). FH wins at
    long RTT or fast uplinks, SH at short RTT and slow uplinks. Returns the curves by label and
    a note on what they price."""
    if rounds is None:
        return {}, "no WISV variant configured"
    gamma = int(rounds["num_drafted"].iloc[0])
    protocol = protocol_params(inputs.provenance, hidden_bits)
    prompts = rounds.groupby("prompt_id", sort=False)["prompt_tokens"].first().to_numpy()
    prefill = float(np.sum(inputs.profile.prefill_s(prompts)))
    curves = {}
    for spec in channels.values():
        base = ChannelCondition.from_dict(spec)
        fields = {
            k: v for k, v in base.to_dict().items() if k not in ("tx_power_dbm", "distance_m")
        }
        for variant in ("wisv_fh", "wisv_sh"):
            head_s = head_round_s(variant, inputs.head_times)
            lat = []
            for snr in snrs:
                cond = ChannelCondition.from_dict({**fields, "snr_db": float(snr)})
                priced = rounds.assign(
                    rate_bps=np.asarray(uplink_rate_bps(cond, rounds["gain"])),
                    per=np.asarray(block_packet_error_rate(cond, rounds["gain"])),
                )
                per_round = round_latencies(
                    priced, variant, protocol, inputs.profile, cond.rtt_s, gamma, head_s, arq=arq
                )
                lat.append((per_round.sum() + prefill) / len(prompts))
            label = (
                f"{variant[5:].upper()}, W {base.bandwidth_hz / 1e6:g} MHz, "
                f"RTT {base.rtt_s * 1e3:g} ms"
            )
            curves[label] = (snrs, np.asarray(lat))
    return curves, f"WISV rounds at gamma={gamma} priced at each SNR (one fading seed)"


def tau_curves(
    head: Mapping[str, Any],
) -> tuple[dict[str, pd.DataFrame], dict[str, float]]:
    """Each head's tau table and chosen tau (rule train_head's metrics), by ``HEAD_NAMES``
    name, for ``plots.accuracy_vs_tau``."""
    return (
        {HEAD_NAMES[k]: pd.DataFrame(head[f"tau_table_{k}"]) for k in HEAD_NAMES},
        {HEAD_NAMES[k]: head[k]["tau"] for k in HEAD_NAMES},
    )
