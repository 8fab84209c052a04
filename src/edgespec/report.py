"""Report tables: per-condition summaries and the papers' reference numbers beside ours
(methods §8)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from edgespec.intervals import format_interval

HEADLINE_COLUMNS = (
    "metric",
    "paper",
    "ours",
    "ours_lo",
    "ours_hi",
    "unit",
    "where",
    "floor",
    "mdd",
    "n",
    "verdict",
)
"""The columns of every ``<wing>_headline.csv`` (CU-HLM, WISV, many devices), which
:mod:`edgespec.readme_results` renders into the README. Quality claims also carry ``floor``
(what a lossless method scores on the same figure), ``mdd`` (the minimum detectable difference
against it at the run's ``n`` prompts, in the figure's unit) and ``verdict``
(:func:`claim_verdict`); the other rows leave them empty."""

CLAIMS = ("at_least", "at_most")
"""How a paper's quality number is read: the figure is at least it (an accuracy relative to a
lossless reference), or at most it (an accuracy drop)."""

UNDECIDED = "undecided at this n"


def claim_verdict(low: float, high: float, paper: float, claim: str) -> str:
    """Whether an interval [low, high] decides a paper's quality claim (methods §6):
    ``reproduced`` where the whole interval keeps the claim (at least ``paper`` for
    ``at_least``, at most it for ``at_most``), ``refuted`` where the whole interval breaks it,
    :data:`UNDECIDED` where it holds ``paper`` (so a figure whose interval covers both the
    paper's value and the floor is always undecided), ``n/a`` without an interval."""
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
    if not (math.isfinite(low) and math.isfinite(high)):
        return "n/a"
    low, high = min(low, high), max(low, high)
    keeps, breaks = (
        (low >= paper, high < paper)
        if claim == "at_least"
        else (
            high <= paper,
            low > paper,
        )
    )
    return "reproduced" if keeps else "refuted" if breaks else UNDECIDED


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
    claim: str | None = None
    """Quality claims only (:data:`CLAIMS`): the row gets a floor, an MDD and a verdict."""


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
        "accuracy relative to HLM (semantic accuracy)",
        97.4,
        "%",
        "headline setting",
        "cuhlm_online",
        "rayleigh_snr10",
        "relative_semantic_accuracy",
        "at_least",
    ),
    PaperNumber(
        "CU-HLM",
        "accuracy relative to HLM (HumanEval pass@1)",
        97.4,
        "%",
        "headline setting; the paper's task differs",
        "cuhlm_online",
        "rayleigh_snr10",
        "relative_pass_at_1",
        "at_least",
    ),
    PaperNumber(
        "CU-HLM",
        "accuracy relative to HLM (arithmetic exact match)",
        97.4,
        "%",
        "headline setting; the paper's task differs",
        "cuhlm_online",
        "rayleigh_snr10",
        "relative_exact_match",
        "at_least",
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
        "cosine similarity, against its floor",
        "uhlm_risk_prone",
        "rayleigh_snr10",
        "relative_similarity_to_llm",
        "at_least",
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


PROFILE_DEPENDENT = ("throughput_gain", "latency_ratio", "end_to_end_latency_ratio")
"""Summary columns that change with the latency profile (the others come from the decoded
tables and the text scores alone)."""


def format_figure(value: float | None, unit: str, scale: float = 1.0) -> str:
    """A headline figure in its unit, as the reports and the README print it: ``"0.903x"``,
    ``"1014x"``, ``"74.8%"``, ``"12 devices"``.

    ``scale`` multiplies the value first (100 for a fraction shown in percent). None or NaN is
    ``"n/a"``. A percentage gets one decimal; any other figure three significant digits below
    1000 and whole numbers from 1000 on (no exponent notation), followed by ``x`` directly or by
    another unit after a space.
    """
    if value is None or math.isnan(value):
        return "n/a"
    value = value * scale
    if unit == "%":
        return f"{value:.1f}%"
    text = f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if unit == "x":
        return f"{text}x"
    return f"{text}{' ' + unit if unit else ''}"


def _fmt_interval(point: float, low: float, high: float, unit: str) -> str:
    """``"12.5x [10, 20]"``, ``"50.0% [40, 60]"``: the point by :func:`format_figure`, the
    bounds (same scale) with three significant digits; a fraction's unit is ``%``."""
    scale = 1.0 if unit == "x" else 100.0
    figure = format_figure(point, unit, scale)
    return format_interval(point, low, high, ".3g", scale, point_text=figure)


def _reference_rows(summary: pd.DataFrame, ref: PaperNumber, profile: str) -> pd.DataFrame:
    return summary[
        (summary["variant"] == ref.variant)
        & (summary["channel"] == ref.channel)
        & (summary["profile"] == profile)
    ]


def _value(match: pd.DataFrame, column: str) -> tuple[float, float, float]:
    if not len(match) or column not in match:
        return math.nan, math.nan, math.nan
    row = match.iloc[0]
    low = row.get(f"{column}_lo", math.nan)
    high = row.get(f"{column}_hi", math.nan)
    return float(row[column]), float(low), float(high)


def _field(match: pd.DataFrame, column: str) -> float:
    if not len(match) or column not in match:
        return math.nan
    return float(match.iloc[0][column])


def verdict_at_n(low: float, high: float, paper: float, claim: str, n: float) -> str:
    """:func:`claim_verdict`, an undecided one naming the prompts it was undecided at. An
    interval of zero width from ``n`` prompts (a bootstrap whose paired differences never
    varied, e.g. the same exact-match outcome on each of 8 prompts) says nothing of the spread
    a larger sample would show (with no discordant pair in n, a 95% bound on their rate is still
    3/n): it decides nothing, undecided."""
    verdict = claim_verdict(low, high, paper, claim)
    if math.isfinite(n) and math.isfinite(low) and low == high:
        verdict = UNDECIDED
    if verdict == UNDECIDED and math.isfinite(n):
        verdict = f"undecided at n={n:.0f}"
    return verdict


@dataclass(frozen=True)
class ClaimCheck:
    """A quality claim against our figure: the floor (1 = a lossless method's value of a
    figure relative to its lossless reference; ``raw_floor`` the reference's own figure), the
    minimum detectable difference at ``n`` prompts (fractions), and the verdict."""

    floor: float
    raw_floor: float
    mdd: float
    n: float
    verdict: str


def check_claim(match: pd.DataFrame, ref: PaperNumber) -> ClaimCheck:
    """:func:`claim_verdict` of ``ref`` on its summary row ``match`` (``relative_<m>``,
    ``floor_<m>``, ``relative_<m>_mdd``, ``relative_<m>_n`` of
    ``edgespec.cuhlm.summary.quality_statistics``)."""
    _, low, high = _value(match, ref.column)
    n = _field(match, f"{ref.column}_n")
    verdict = verdict_at_n(low, high, ref.value / 100.0, ref.claim, n)
    return ClaimCheck(
        floor=1.0,
        raw_floor=_field(match, "floor_" + ref.column.removeprefix("relative_")),
        mdd=_field(match, f"{ref.column}_mdd"),
        n=n,
        verdict=verdict,
    )


def paper_comparison(
    summary: pd.DataFrame, profiles: dict[str, str], references=CUHLM_REFERENCES
) -> pd.DataFrame:
    """One row per reference number: the paper's value and ours on the same definition, with
    its interval, in one column per latency profile (``profiles``: id -> column label).

    ``summary`` has one row per (variant, channel, profile) with ``<column>``,
    ``<column>_lo`` and ``<column>_hi`` (``edgespec.cuhlm.summary.summary_table``). Where the
    paper's condition is not in the sweep, the nearest is not substituted: the row says n/a.
    Figures that do not depend on the profile read the same in every column.
    """
    rows = []
    for ref in references:
        paper = f"{ref.value:g}x" if ref.unit == "x" else f"{ref.value:g}%"
        row = {
            "paper": ref.paper,
            "metric": ref.metric,
            "paper_value": paper,
            "paper_condition": ref.condition,
        }
        for profile, label in profiles.items():
            match = _reference_rows(summary, ref, profile)
            row[f"ours ({label})"] = _fmt_interval(*_value(match, ref.column), ref.unit)
        row.update({"floor": "", "MDD": "", "verdict": ""})
        if ref.claim:
            check = check_claim(_reference_rows(summary, ref, next(iter(profiles))), ref)
            row["floor"] = f"100% (HLM's own: {check.raw_floor:.3g})"
            row["MDD"] = "n/a" if math.isnan(check.mdd) else f"{100 * check.mdd:.1f} points"
            row["verdict"] = check.verdict
        row.update({"our_variant": ref.variant, "our_channel": ref.channel})
        rows.append(row)
    return pd.DataFrame(rows)


def headline_table(
    summary: pd.DataFrame, profiles: dict[str, str], references=CUHLM_REFERENCES
) -> pd.DataFrame:
    """The README's headline numbers: ``metric, paper, ours, ours_lo, ours_hi, unit, where``,
    one row per reference number, and per latency profile for the profile-dependent ones.
    ``ours`` is the median over fading seeds (delay figures) or the point estimate over the
    evaluation prompts, ``ours_lo``/``ours_hi`` its interval; percentages are in percent.
    Quality claims add ``floor``, ``mdd`` (percent points), ``n`` and ``verdict``
    (:func:`check_claim`)."""
    rows = []
    for ref in references:
        dependent = ref.column in PROFILE_DEPENDENT
        for profile, label in profiles.items() if dependent else list(profiles.items())[:1]:
            match = _reference_rows(summary, ref, profile)
            point, low, high = _value(match, ref.column)
            scale = 1.0 if ref.unit == "x" else 100.0
            where = f"{ref.variant}, {ref.channel}"
            if dependent:
                where += f", {label}"
            row = {
                "metric": f"{ref.paper}: {ref.metric}",
                "paper": ref.value,
                "ours": point * scale,
                "ours_lo": low * scale,
                "ours_hi": high * scale,
                "unit": ref.unit,
                "where": where,
            }
            if ref.claim:
                check = check_claim(match, ref)
                row.update(
                    floor=check.floor * scale,
                    mdd=check.mdd * scale,
                    n=check.n,
                    verdict=check.verdict,
                )
            rows.append(row)
    return pd.DataFrame(rows, columns=list(HEADLINE_COLUMNS))


def decidable_line(headline: pd.DataFrame, study: str = "config/study.yaml") -> str:
    """One line: which of the papers' quality claims this run decides, at which minimum
    detectable differences the others are undecided, and where the study sized to decide
    them is."""
    claims = headline[headline["verdict"].notna() & (headline["verdict"] != "")]
    if claims.empty:
        return ""
    decided = claims[claims["verdict"].isin(["reproduced", "refuted"])]
    open_ = claims[~claims.index.isin(decided.index)]
    parts = [f"{row.metric}: {row.verdict}" for row in decided.itertuples(index=False)] or ["none"]
    mdds = open_["mdd"].to_numpy(float)
    mdds = mdds[np.isfinite(mdds)]
    spread = (
        f" (their detectable differences {mdds.min():.1f}-{mdds.max():.1f} points)"
        if mdds.size
        else ""
    )
    return (
        f"**Which quality claims this run decides:** {'; '.join(parts)}. Undecided or not "
        f"measured: {len(open_)} of {len(claims)}{spread}. `{study}` is sized by a power "
        "calculation to resolve 3-5 points of the similarity figures against their floor "
        "(docs/methods.md §6)."
    )


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


def precision_paragraph(precision: dict, quantization: dict | None = None) -> str:
    """The run's decoding precision and why it was chosen (``results/machine/precision.json``),
    and, when a model was quantised, how much that changed it
    (``results/machine/quantization.json``): a report should say what produced its numbers."""
    machine = precision.get("machine", {})
    simd = machine.get("simd") or []
    native = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in simd]
    features = ", ".join(native) if native else "no native bf16"
    text = (
        f"Decoding precision: **{precision['dtype']}** ({precision['reason']}; "
        f"{machine.get('device', 'cpu')}, {machine.get('cpu_count', '?')} cores, {features})."
    )
    if quantization:
        role = quantization.get("model", "target")
        carried = (
            "every figure below carries that change"
            if role == "target"
            else "the target is not quantised, so the decoded text is still the target's, but "
            "the draft's proposals, acceptance and uncertainty in every figure below carry "
            "that change"
        )
        text += (
            f" The {role} ran **{quantization['quantize']}**-quantised: against the unquantised "
            f"{role} on its own greedy continuations, top-1 agreement "
            f"{100 * quantization['top1_agreement']:.1f}% and mean total variation "
            f"{quantization['mean_tv']:.3f} over {quantization['positions']} positions; "
            f"{carried}."
        )
    return text
