"""The CU-HLM report's quality figures against their noise floor, and the token budget
(methods §6); torch-free.

HLM is lossless (its output law is the target's), so what it scores on the evaluation prompts
is the floor of every quality figure: the value sampling noise alone gives. Each figure stands
beside it, relative to it paired by prompt, with its minimum detectable difference
(``edgespec.cuhlm.summary.quality_statistics``). :func:`budget_rows` says how often the token
budget ran out, and how often before the answer was stated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from edgespec.intervals import POWER, Interval


def interval_cell(row: Mapping, column: str, scale: float = 1.0, unit: str = "") -> str:
    """``row[column]`` as ``"point [lo, hi]"`` (3 significant digits, each times ``scale``,
    ``unit`` after the point), the point alone where the row has no interval, ``"n/a"`` where
    the point is NaN."""
    point, low, high = row[column], row.get(f"{column}_lo"), row.get(f"{column}_hi")
    if pd.isna(point):
        return "n/a"
    if low is None or pd.isna(low) or pd.isna(high):
        return f"{point * scale:.3g}{unit}"
    # The level does not enter the text.
    return Interval(point, low, high, level=math.nan).format(".3g", scale, unit)


QUALITY_TEXT = (
    "Every quality figure stands beside its noise floor, what a lossless method scores on the "
    "same prompts: HLM (its output law is the target's), so two samples at temperature 1 "
    "differ by sampling alone. Relative figures are taken against it, paired by prompt, with "
    "the minimum detectable difference (MDD: two-sided at the bootstrap level, power "
    f"{100 * POWER:g}%) at the prompts paired. A claim is reproduced where the whole interval "
    "keeps it, refuted where the whole interval breaks it, and undecided at this n where the "
    "interval holds the paper's value."
)


QUALITY_ROWS = (
    ("semantic accuracy", "semantic_accuracy"),
    ("similarity to LLM-only", "similarity_to_llm"),
    ("HumanEval pass@1", "pass_at_1"),
    ("exact match", "exact_match"),
    ("answer fidelity", "answer_fidelity"),
)
"""The quality figures of :func:`quality_rows`, as labelled in the report."""


def quality_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, quality figure) measured in this run: the figure [interval], the
    floor (HLM's, lossless, on the same prompts), the figure relative to it [interval], paired
    by prompt, and its minimum detectable difference at the n prompts paired (percent points
    of the floor). Quality does not depend on the channel or the profile: the first row of
    each variant is used."""
    first = summary[summary["profile"] == "primary"].drop_duplicates("variant")
    out = []
    for label, metric in QUALITY_ROWS:
        if f"relative_{metric}" not in first:
            continue
        for _, row in first.iterrows():
            if pd.isna(row.get(f"relative_{metric}")):
                continue
            mdd = row.get(f"relative_{metric}_mdd")
            out.append(
                {
                    "figure": label,
                    "variant": row["variant"],
                    "ours": interval_cell(row, metric),
                    "floor (HLM)": f"{row[f'floor_{metric}']:.3g}",
                    "relative to floor": interval_cell(row, f"relative_{metric}", 100, "%"),
                    "MDD (points)": "n/a" if pd.isna(mdd) else f"{100 * mdd:.1f}",
                    "n": int(row[f"relative_{metric}_n"]),
                }
            )
    return pd.DataFrame(out)


def budget_rows(scores: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and variant: mean new tokens, how often the token budget ran out (no end of
    sequence before it) and how often it ran out before the answer was stated
    (``edgespec.cuhlm.scores.budget_columns``), in percent."""
    needed = {"dataset", "new_tokens", "budget_exhausted", "answer_cut"}
    if not needed <= set(scores.columns):
        return pd.DataFrame()
    table = (
        scores.groupby(["dataset", "variant"], sort=False)
        .agg(
            prompts=("prompt_id", "size"),
            mean_new_tokens=("new_tokens", "mean"),
            budget_ran_out=("budget_exhausted", "mean"),
            cut_before_answer=("answer_cut", "mean"),
        )
        .reset_index()
    )
    table["mean_new_tokens"] = table["mean_new_tokens"].round(1)
    for column in ("budget_ran_out", "cut_before_answer"):
        table[column] = (100 * table[column]).round(1).astype(str) + "%"
    return table
