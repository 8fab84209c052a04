"""The WISV report (rule report_wisv): the Markdown summary; torch-free.

The tables themselves (medians over fading seeds with their intervals, the headline against
the paper's numbers) are ``edgespec.wisv.summary``'s, the figures' data ``edgespec.wisv.figures``'
and the policy analysis ``edgespec.wisv.policy``'s. This module reads the per-decode text scores
(:func:`read_scores`) and writes the prose around the tables from the other stages' summaries
(:func:`report_markdown`): the two pricing regimes side by side (``edgespec.wisv.regimes``),
whether the policy moves with the channel in each, the good and poor channel, the latency
breakdown, the labels, relabeling and decision heads, and the ablation that isolates what
reading the CSI adds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgespec.report import markdown_table, precision_paragraph
from edgespec.wisv.evaluate import CSI_VARIANTS
from edgespec.wisv.policy import (
    PART_TITLES,
    POLICY_VARIANTS,
    label_mobility,
    policy_verdict,
    trend,
)
from edgespec.wisv.regimes import REGIME_TITLES, REGIMES, Pricing
from edgespec.wisv.summary import ANY, display_table

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

POLICY_COLUMNS = (
    ("AAL", "aal", 1.0),
    ("rounds per answer", "rounds_per_answer", 1.0),
    ("e2e latency (s)", "e2e_latency_s", 1.0),
    ("latency vs vanilla (%)", "latency_reduction", -100.0),
    ("acceptance rate", "acceptance_rate", 1.0),
)
"""(header, summary column, scale) of the good-against-poor channel table."""


def parse_stem(stem: str) -> dict[str, Any]:
    """A decode stem's keys: ``<variant>/g<gamma>/any`` (a shared channel-free decode),
    ``<regime>/<variant>/g<gamma>/any`` (a regime's channel-free decode) or
    ``<regime>/wisv/g<gamma>/<channel>/s<seed>`` (a regime's CSI decode). Regime and channel
    are ``ANY`` where the decode serves every one, the fading seed index -1."""
    parts = stem.strip("/").split("/")
    regime = parts.pop(0) if parts[0] in REGIMES else ANY
    variant, gamma = parts[0], int(parts[1][1:])
    if parts[2] == ANY:
        return {"regime": regime, "variant": variant, "gamma": gamma, "channel": ANY, "seed": -1}
    return {
        "regime": regime,
        "variant": variant,
        "gamma": gamma,
        "channel": parts[2],
        "seed": int(parts[3][1:]),
    }


def scores_of(path: str | Path) -> list[pd.DataFrame]:
    """A score file's rows (rule score_wisv, ``.../scores/<decode stem>.parquet``), keyed by
    the regime, variants, channel, gamma and fading seed index its decode serves
    (:func:`parse_stem`): a CSI decode serves every CSI-reading variant."""
    parts = Path(path).with_suffix("").parts
    key = parse_stem("/".join(parts[parts.index("scores") + 1 :]))
    frame = pd.read_parquet(path)
    variants = CSI_VARIANTS if key["variant"] == "wisv" else (key["variant"],)
    return [
        frame.assign(
            regime=key["regime"],
            variant=v,
            channel=key["channel"],
            gamma=key["gamma"],
            fading_index=key["seed"],
        )
        for v in variants
    ]


def read_scores(paths: Sequence[str | Path], variants: Sequence[str]) -> pd.DataFrame:
    """Every score file's keyed rows (:func:`scores_of`), of the configured ``variants``."""
    scores = pd.concat([f for p in paths for f in scores_of(p)], ignore_index=True)
    return scores[scores["variant"].isin(variants)]


@dataclass(frozen=True)
class RegimeInputs:
    """One regime's stages: its pricing (rule wisv_pricing), train_head's metrics
    (``head``), relabel_csi's summary and safe fraction per CSI sample."""

    pricing: Pricing
    head: Mapping[str, Any]
    relabel: Mapping[str, Any]
    safe: pd.DataFrame


@dataclass(frozen=True)
class ReportInputs:
    """What the prose reads: join_labels' summary (``labels``) and the mined risks, the
    models' provenance, the run's precision (and quantisation, None where none) and each
    regime's stages (``regimes``, in ``REGIMES`` order)."""

    labels: Mapping[str, Any]
    risks: np.ndarray
    provenance: Mapping[str, Any]
    precision: Mapping[str, Any]
    quantization: Mapping[str, Any] | None
    regimes: Mapping[str, RegimeInputs]

    @property
    def subtitle(self) -> str:
        """The figures' subtitle: the model pair and the regimes priced."""
        return f"{self.provenance.get('preset')} pair; regimes: {', '.join(self.regimes)}"


def heads_table(head: Mapping[str, Any], head_times: Mapping[str, Any]) -> pd.DataFrame:
    """One row per decision head (``HEAD_NAMES`` order): validation AUC on its own labels,
    the held-out AUC on the original labels with its bootstrap interval, tau, validation
    accept and unsafe accept rates, and its time per round [s]."""
    rows = []
    for key, label in HEAD_NAMES.items():
        auc = head.get("heldout_auc", {}).get(key, {})
        rows.append(
            {
                "head": label,
                "val AUC (own labels)": head[key]["val_auc"],
                "held-out AUC (original labels)": _interval(auc, "auc"),
                "tau": head[key]["tau"],
                "val accept rate": head[key]["val_accept_rate"],
                "val unsafe accept rate": head[key]["val_unsafe_accept_rate"],
                "time per round (s)": head_times["head_round_s"][key],
            }
        )
    return pd.DataFrame(rows)


def _interval(values: Mapping[str, float], name: str, spec: str = ".3f") -> str:
    point = values.get(name, math.nan)
    if point is None or not np.isfinite(point):
        return "n/a"
    lo, hi = values.get(f"{name}_lo", math.nan), values.get(f"{name}_hi", math.nan)
    text = format(point, spec)
    if np.isfinite(lo) and np.isfinite(hi):
        text += f" ({format(lo, spec)}, {format(hi, spec)})"
    return text


def labels_paragraph(labels: Mapping[str, Any], risks: np.ndarray) -> str:
    """The mined labels: counts, the label budget, how each label was decided, how graded the
    risks are, and whether the head is a demonstration (fewer than 1,000 mismatches)."""
    crit = labels["criterion"]
    r = np.asarray(risks, dtype=np.float64)
    graded = int(((r > 0) & (r < 1)).sum())
    size = (
        "A calibration pool this small makes the head a demonstration (issue: >= 1,000 labeled "
        "mismatches for a head that can learn; config/study.yaml)."
        if labels["mismatches"] < 1000
        else "The pool is large enough for the held-out AUC to mean something."
    )
    return (
        f"{labels['mismatches']} mismatches mined from {labels['prompts']} calibration prompts "
        f"({labels['answer_task_prompts']} with a gold answer), {labels['important']} important. "
        f"Label budget {labels['label_max_new_tokens']} tokens, each branch run to its stated "
        f"answer or EOS: {crit['answer']} labels from the stated answers, {crit['similarity']} "
        f"from the similarity ({crit['answer_task_fallback']} of them answer tasks where a branch "
        f"never stated an answer). Risks: {int((r == 0).sum())} at 0, {int((r == 1).sum())} at "
        f"1, {graded} graded (mean {r.mean() if r.size else math.nan:.3f}; "
        f"{labels.get('continuations', 1)} continuation(s) per mismatch). {size}"
    )


def relabel_paragraph(relabel: Mapping[str, Any]) -> str:
    """The relabeling: the CSI samples' span, what a repair costs, the trade-off and the safe
    fractions."""
    span = relabel["ranges"]
    return (
        f"{relabel['csi_samples']} CSI samples (bandwidth "
        f"{span['bandwidth_hz'][0] / 1e6:g}-{span['bandwidth_hz'][1] / 1e6:g} MHz, SNR "
        f"{span['snr_db'][0]:g}-{span['snr_db'][1]:g} dB, RTT {span['rtt_s'][0] * 1e3:g}-"
        f"{span['rtt_s'][1] * 1e3:g} ms). A repair "
        f"costs {relabel['repair_cost_rounds'][0]:.3f}-{relabel['repair_cost_rounds'][1]:.3f} "
        f"rounds of T_0 = {relabel['round_compute_s']:.3f} s, priced at the expected rate of the "
        f"next block given the CSI, with its expected retransmissions; lambda = "
        f"{relabel['lam_rounds_per_risk']:g} rounds per unit risk, risk budget "
        f"{relabel['risk_budget']}. Safe fraction: {relabel['safe_before']:.3f} before "
        f"relabeling, {relabel['safe_best_channel']:.3f} at the best CSI sample, "
        f"{relabel['safe_worst_channel']:.3f} at the worst."
    )


def regimes_table(inputs: ReportInputs) -> pd.DataFrame:
    """The two regimes side by side: one row per figure, one column per regime."""
    rows: dict[str, dict[str, str]] = {}
    for regime, r in inputs.regimes.items():
        p = r.pricing.profile
        gamma = r.head.get("validation", {}).get("gamma", None)
        mobility = label_mobility(
            inputs.risks, r.safe["repair_cost"], r.relabel["lam_rounds_per_risk"]
        )
        safe = trend(r.safe["repair_cost"], r.safe["safe_fraction"])
        accept = r.head.get("accept_by_state")
        a = trend(accept["repair_cost"], accept["accept_rate"]) if accept else None
        col = {
            "tau_SLM, tau_LLM(gamma) (ms)": (
                f"{p.draft_token_s * 1e3:.1f}, "
                + ", ".join(f"{s * 1e3:.1f}" for s in p.target_verify_s.values())
            ),
            "T_0 of a head round (s)": f"{r.relabel['round_compute_s']:.4f}",
            "uplink sizes (hidden, vocab)": (
                f"{r.pricing.protocol['hidden_size']}, {r.pricing.protocol['vocab_size']}"
            ),
            "repair cost C_rep (rounds)": "{:.3f}-{:.3f}".format(*mobility["repair_cost_rounds"]),
            "risks the channel can flip": f"{mobility['movable']} of {mobility['mismatches']}",
            "safe fraction best / worst channel": f"{safe['at_best']:.3f} / {safe['at_worst']:.3f}",
            "safe fraction vs C_rep (Spearman)": f"{safe['spearman']:.2f}",
            "head accept rate best / worst channel": (
                f"{a['at_best']:.3f} / {a['at_worst']:.3f}" if a else "n/a"
            ),
            "head accept rate vs C_rep (Spearman)": f"{a['spearman']:.2f}" if a else "n/a",
            **{f"tau {key}": f"{r.head[key]['tau']:.4f}" for key in HEAD_NAMES if key in r.head},
            "held-out AUC, CSI head": _interval(
                r.head.get("heldout_auc", {}).get("wisv_head", {}), "auc"
            ),
        }
        del gamma
        for name, value in col.items():
            rows.setdefault(name, {})[REGIME_TITLES.get(regime, regime)] = value
    return pd.DataFrame([{"figure": k, **v} for k, v in rows.items()])


def channel_table(summary: pd.DataFrame, regime: str) -> pd.DataFrame:
    """AAL, rounds, latency and acceptance of ``POLICY_VARIANTS`` on every channel and gamma
    of one regime."""
    rows = summary[(summary["regime"] == regime) & summary["variant"].isin(POLICY_VARIANTS)]
    rows = rows.sort_values(["gamma", "variant", "channel"], kind="stable")
    return display_table(rows, POLICY_COLUMNS)


def breakdown_markdown(breakdown: pd.DataFrame, regime: str) -> str:
    """One regime's latency breakdown as a table: seconds per answer by part."""
    rows = breakdown[breakdown["regime"] == regime]
    out = rows[["variant", "channel", "gamma"]].copy()
    for column, title in PART_TITLES.items():
        out[title] = rows[column].map(lambda v: f"{v:.3f}")
    out["total"] = rows["latency_s"].map(lambda v: f"{v:.3f}")
    return markdown_table(out)


def heads_section(r: RegimeInputs) -> list[str]:
    """One regime's decision heads: the shared validation budget, the heads' table and the
    WISV head's accept rate at each channel's mean state."""
    validation, times = r.head["validation"], r.pricing.head_times
    return [
        f"Every tau is chosen by one rule on the same {validation['mismatches']} original "
        f"validation mismatches ({validation['important']} important) of "
        f"{len(validation['prompts'])} held-out prompts, each mismatch scored once (the CSI "
        f"head's q averaged over the {validation['csi_states']} CSI samples), under the same "
        f"budget ({validation['max_accuracy_drop']:g} accepted important risk per mismatch). "
        f"Head time: {times['head_time_source']}, gamma = {times['head_time_gamma']}.",
        markdown_table(heads_table(r.head, times)),
        "Accept rate of the WISV head on the mined mismatches at each channel's mean state: "
        + ", ".join(f"{k} {v:.3f}" for k, v in r.head["accept_rate_by_channel"].items())
        + ".",
    ]


def report_markdown(
    summary: pd.DataFrame,
    top: pd.DataFrame,
    breakdown: pd.DataFrame,
    inputs: ReportInputs,
    wisv: Mapping[str, Any],
    evaluation: Mapping[str, Any],
) -> str:
    """The WISV report (``results/report/wisv_summary.md``): ``summary`` (``summarise``), its
    headline ``top`` (``headline``) and ``breakdown`` (``policy.breakdown_table``) with the
    prose of ``inputs``; ``wisv`` config keys wisv.correlation and wisv.csi_decode_seeds,
    ``evaluation`` evaluation.fading_seeds, seed_interval and bootstrap_interval."""
    provenance = inputs.provenance
    lines = [
        "# WISV: measured results",
        f"Model pair: {provenance.get('description', provenance.get('preset'))}. Greedy "
        "decoding; gains and reductions are relative to vanilla SD on the same regime, channel "
        "and gamma, seed by seed and prompt by prompt. Every round is charged every draft "
        "forward it runs (gamma + 1 where the head needs the last token's hidden state), its "
        "uplink, RTT, target verification, the head's time and the expected ARQ "
        "retransmissions; every answer its prompt's prefill.",
        "**Two pricing regimes**, each with its own relabeled labels, head, tau, CSI-reading "
        "decodes and evaluation: "
        + "; ".join(r.pricing.description for r in inputs.regimes.values())
        + ". The paper's figures belong to the testbed regime (its hardware class); the "
        "measured regime is this machine, where a round's compute dwarfs its communication.",
        precision_paragraph(inputs.precision, inputs.quantization),
        f"**Common fading.** Every variant, at every regime, channel and gamma, sees the same "
        f"fading draw for round r of prompt p under fading seed s (Gauss-Markov blocks, "
        f"correlation {wisv['correlation']} unless a channel sets its own). The channel-blind "
        f"variants are decoded once without a channel and priced under "
        f"{evaluation['fading_seeds']} seeds; the CSI-reading wisv_fh/wisv_sh (one decode per "
        f"regime) are decoded under seeds {wisv['csi_decode_seeds']} of the same draws, per "
        "channel and gamma.",
        "**Intervals.** `x [a, b] (c, d)`: x the median over fading seeds, [a, b] the "
        f"{evaluation['seed_interval']:.0%} interval over seeds (only where a variant was "
        f"priced under several), (c, d) the {evaluation['bootstrap_interval']:.0%} "
        "percentile bootstrap over prompts. Accuracy-type figures: the mean over prompts and its "
        "bootstrap interval.",
        "## Against the paper's numbers (best setting, same definitions)",
        "WISV (arXiv 2604.17701) used Llama-3.2-1B / Llama-3.1-8B; `ours` is the median, "
        "`ours_lo`/`ours_hi` the bootstrap interval over prompts; `where` names the regime.",
        markdown_table(top),
        "## The two regimes side by side",
        markdown_table(regimes_table(inputs)),
        "## Does the policy move with the channel?",
        *[
            policy_verdict(
                REGIME_TITLES.get(regime, regime),
                r.safe,
                r.head.get("accept_by_state"),
                label_mobility(
                    inputs.risks, r.safe["repair_cost"], r.relabel["lam_rounds_per_risk"]
                ),
                r.relabel,
            )
            for regime, r in inputs.regimes.items()
        ],
        "## Labels",
        labels_paragraph(inputs.labels, inputs.risks),
    ]
    for regime, r in inputs.regimes.items():
        title = REGIME_TITLES.get(regime, regime)
        ablation = summary[
            (summary["regime"] == regime) & summary["variant"].isin(ABLATION_VARIANTS)
        ]
        lines += [
            f"## {title}",
            "### Good and poor channel",
            markdown_table(channel_table(summary, regime)),
            "### Latency breakdown (seconds per answer, mean over prompts and fading seeds)",
            breakdown_markdown(breakdown, regime),
            "### Relabeling",
            relabel_paragraph(r.relabel),
            "### Decision heads",
            *heads_section(r),
            "### What reading the CSI adds (same protocol FH, same tau rule)",
            markdown_table(display_table(ablation, ABLATION_COLUMNS)),
        ]
    lines += [
        "## Every regime, variant, channel and gamma",
        markdown_table(display_table(summary)),
    ]
    return "\n\n".join(lines) + "\n"
