"""Report tables: per-condition summaries and the papers' reference numbers beside ours
(methods §8)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class PaperNumber:
    """One headline number of a paper, and where this workflow measures the same quantity."""

    paper: str
    metric: str
    value: float
    unit: str  # "x" (ratio), "%" (percentage)
    condition: str
    variant: str
    channel: str | None
    column: str


CUHLM_REFERENCES = (
    PaperNumber(
        "CU-HLM",
        "token throughput vs standard HLM",
        206,
        "x",
        "10 dB Rayleigh, online",
        "cuhlm_online",
        "rayleigh_snr10",
        "throughput_gain",
    ),
    PaperNumber(
        "CU-HLM",
        "token throughput vs standard HLM",
        1014,
        "x",
        "-20 dB, offline",
        "cuhlm_offline",
        "rayleigh_snr-20",
        "throughput_gain",
    ),
    PaperNumber(
        "CU-HLM",
        "uploads skipped",
        74.8,
        "%",
        "headline setting",
        "cuhlm_online",
        "rayleigh_snr10",
        "skip_rate",
    ),
    PaperNumber(
        "CU-HLM",
        "vocabulary compression",
        97.4,
        "%",
        "headline setting",
        "cuhlm_online",
        "rayleigh_snr10",
        "vocab_compression",
    ),
    PaperNumber(
        "CU-HLM",
        "accuracy relative to HLM",
        97.4,
        "%",
        "headline setting",
        "cuhlm_online",
        "rayleigh_snr10",
        "relative_semantic_accuracy",
    ),
    PaperNumber(
        "U-HLM",
        "fewer uplink transmissions than HLM",
        45.93,
        "%",
        "",
        "uhlm_risk_prone",
        "rayleigh_snr10",
        "skip_rate",
    ),
    PaperNumber(
        "U-HLM",
        "accuracy relative to LLM-only",
        97.54,
        "%",
        "cosine similarity",
        "uhlm_risk_prone",
        "rayleigh_snr10",
        "similarity_to_llm",
    ),
    PaperNumber(
        "U-HLM",
        "token throughput vs HLM",
        2.54,
        "x",
        "up to",
        "uhlm_risk_prone",
        "rayleigh_snr10",
        "throughput_gain",
    ),
)


def _fmt(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.3g}x" if unit == "x" else f"{100 * value:.1f}%"


def paper_comparison(summary: pd.DataFrame, references=CUHLM_REFERENCES) -> pd.DataFrame:
    """One row per reference number: the paper's value and ours on the same definition.

    ``summary`` has one row per (variant, channel) with the referenced columns. Where the
    paper's condition is not in the sweep, the nearest is not substituted: the row says n/a.
    """
    rows = []
    for ref in references:
        match = summary[(summary["variant"] == ref.variant) & (summary["channel"] == ref.channel)]
        ours = float(match[ref.column].iloc[0]) if len(match) and ref.column in match else math.nan
        paper = f"{ref.value:g}x" if ref.unit == "x" else f"{ref.value:g}%"
        rows.append(
            {
                "paper": ref.paper,
                "metric": ref.metric,
                "paper_value": paper,
                "paper_condition": ref.condition,
                "ours": _fmt(ours, ref.unit),
                "our_variant": ref.variant,
                "our_channel": ref.channel,
            }
        )
    return pd.DataFrame(rows)


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub Markdown table without extra dependencies."""

    def cell(v):
        if isinstance(v, float):
            return "n/a" if math.isnan(v) else format(v, floatfmt)
        return str(v)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])
