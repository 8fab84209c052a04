"""The many-device report's text: the knee and ranking lines with their warnings, and the
markdown tables (methods §10); torch-free.

The lines a re-run must reproduce (:func:`verdict_lines`): per channel, uplink scheme and the
base policy, every method's peak aggregate throughput and knee with their intervals, in rank
order, ``>`` where the paired difference to the next method is above 0 and ``≈`` where its
interval contains 0 ("undecided"). :func:`warnings` lists what makes an answer uncertain: an
undecided ranking or knee, aggregate throughput that falls as N grows, a profile cell still an
outlier after re-timing, batches priced beyond the timed tokens per row, a method priced on one
fading realisation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import Interval
from edgespec.multidevice.batchprofile import BatchProfile
from edgespec.report import markdown_table


def interval_text(row: Mapping[str, Any], name: str, spec: str = ".3g") -> str:
    """``point [lo, hi]`` of ``row[name]`` (``edgespec.intervals.Interval.format``)."""
    return Interval(row[name], row[f"{name}_lo"], row[f"{name}_hi"], math.nan).format(spec)


def devices_text(row: Mapping[str, Any], name: str, top: int | None = None) -> str:
    """A device count over replicates: ``point [lo, hi]`` (one number when all agree); inf is
    "> top" (not within the sweep), 0 "none"."""

    def one(v: float) -> str:
        if math.isinf(v):
            return f"> {top}" if top else "inf"
        return "none" if v == 0 else f"{v:g}"

    point, low, high = row[name], row[f"{name}_lo"], row[f"{name}_hi"]
    if not np.isfinite(point) and not math.isinf(point):
        return "n/a"
    return one(point) if low == high == point else f"{one(point)} [{one(low)}, {one(high)}]"


def verdict_lines(ranking: pd.DataFrame) -> list[str]:
    """One line per (channel, uplink) under the base policy (module docstring)."""
    lines = []
    base = ranking[ranking["policy"] == "base"]
    for (channel, uplink), group in base.groupby(["channel", "uplink"], sort=False):
        parts = []
        for _, row in group.sort_values("rank").iterrows():
            text = (
                f"{row['method']} {interval_text(row, 'peak_tps')} tokens/s "
                f"(knee {devices_text(row, 'knee_n')})"
            )
            link = {"yes": " > ", "undecided": " ≈ "}.get(row["ahead_of_next"], "")
            parts.append(text + link)
        lines.append(f"- **{channel}, {uplink}**: " + "".join(parts))
    return lines


def warnings(
    ranking: pd.DataFrame,
    capacity: pd.DataFrame,
    summary: pd.DataFrame,
    profile: BatchProfile,
) -> list[str]:
    """Every reason to doubt an answer (module docstring), one line each."""
    out = [f"batch profile: {w}" for w in profile.warnings]
    base = ranking[ranking["policy"] == "base"]
    for _, row in base[base["ahead_of_next"] == "undecided"].iterrows():
        nxt = base[
            (base["channel"] == row["channel"])
            & (base["uplink"] == row["uplink"])
            & (base["rank"] == row["rank"] + 1)
        ].iloc[0]
        out.append(
            f"{row['channel']}, {row['uplink']}: the ranking of {row['method']} above "
            f"{nxt['method']} is undecided (their paired peak-throughput difference's interval "
            "contains 0)"
        )
    for _, row in capacity[capacity["policy"] == "base"].iterrows():
        where = f"{row['method']}, {row['channel']}, {row['uplink']}"
        if row["knee_n_lo"] != row["knee_n_hi"]:
            out.append(f"{where}: the knee is undecided, {devices_text(row, 'knee_n')}")
        if row["falls"]:
            out.append(f"{where}: aggregate throughput falls beyond the spread: {row['falls']}")
        if row["fading_seeds"] == 1:
            out.append(
                f"{where}: priced on one fading realisation (as decoded): its intervals cover "
                "prompts and timings only"
            )
    extrapolated = summary[summary["extrapolated_batches"] > 0]
    if len(extrapolated):
        worst = extrapolated.sort_values("extrapolated_batches").iloc[-1]
        out.append(
            f"{len(extrapolated)} summary rows price some batches above the largest timed tokens "
            f"per row (extrapolated; at most {worst['extrapolated_batches']:.0%} of a run's "
            f"batches, {worst['method']} at N = {worst['devices']:g})"
        )
    return out


def profile_table(profile: BatchProfile) -> pd.DataFrame:
    """Per tokens per row and batch size: each context's median and interquartile range [ms],
    and the charged time and factor t(b) / t(1) of the fit."""
    times = profile.times()
    medians, spread = profile.medians(), profile.spread()
    rows = []
    for tokens, row in times.table.items():
        for batch in row:
            out: dict[str, Any] = {"tokens per row": tokens, "batch": batch}
            for context in profile.contexts:
                m = medians[context][tokens][batch]
                lo, hi = spread[context][tokens][batch]
                label = f"context {context}" if context else "given"
                out[label] = f"{m * 1e3:.1f} ms" + (
                    f" ({lo * 1e3:.1f}-{hi * 1e3:.1f})" if hi > lo else ""
                )
            charged = times.seconds(tokens, batch)
            out["charged"] = f"{charged * 1e3:.1f} ms (x{times.factor(tokens, batch):.2f})"
            rows.append(out)
    return pd.DataFrame(rows)


def capacity_rows(capacity: pd.DataFrame) -> pd.DataFrame:
    """The capacity table in words."""
    out = capacity[["method", "channel", "uplink", "policy", "replicates", "fading_seeds"]].copy()
    out["knee (N)"] = [devices_text(r, "knee_n") for _, r in capacity.iterrows()]
    out["peak tokens/s"] = [interval_text(r, "peak_tps") for _, r in capacity.iterrows()]
    out["peak at N"] = [devices_text(r, "peak_n") for _, r in capacity.iterrows()]
    out["service level met up to N"] = [
        devices_text(r, "service_n") for _, r in capacity.iterrows()
    ]
    out["throughput falls"] = [r["falls"] or "-" for _, r in capacity.iterrows()]
    return out


def crossover_rows(crossovers: pd.DataFrame) -> pd.DataFrame:
    """The crossover table in words."""
    if crossovers.empty:
        return pd.DataFrame(columns=["channel", "uplink", "method", "overtakes", "from N"])
    out = crossovers[["channel", "uplink", "policy", "method", "other"]].copy()
    out["from N"] = [
        devices_text(r, "overtakes_from_n", int(r["max_devices"])) for _, r in crossovers.iterrows()
    ]
    return out.rename(columns={"other": "overtakes"})


def document(
    intro: Sequence[str],
    ranking: pd.DataFrame,
    notes: Sequence[str],
    tables: Mapping[str, tuple[str, pd.DataFrame]],
) -> str:
    """The markdown report: ``intro`` paragraphs, the verdict lines, the warnings (``notes``),
    then each titled table (title -> (paragraph, frame))."""
    parts = [*intro, "## Knee and ranking (base policy)", "\n".join(verdict_lines(ranking))]
    parts += ["## Warnings", "\n".join(f"- {n}" for n in notes) if notes else "None."]
    for title, (text, frame) in tables.items():
        parts += [f"## {title}", text, markdown_table(frame)]
    return "\n\n".join(p for p in parts if p) + "\n"


def intro(
    pair: str,
    prompts: int,
    settings: Mapping[str, Any],
    compute_source: str,
    profile: BatchProfile,
    level: float,
) -> list[str]:
    """The report's opening paragraphs: what is shared, queued and charged, and how the
    intervals are made. ``settings``: the report's config keys (``batching``, ``tdma_slot_s``,
    ``prefill``, ``capacity``)."""
    policy = settings["batching"]
    cap = settings["capacity"]
    prefill = (
        "Every method's answer starts with its prompt's prefill, the draft's on the device and "
        "the target's on the edge as a job served alone (the same policy for every method)"
        if settings["prefill"] == "alone"
        else "No method pays a prompt prefill (policy `none`, the same for every method)"
    )
    shape = (
        "the configured table (multidevice.target_batch_s), made isotonic in the batch size"
        if profile.source == "given"
        else f"the measured batch profile at {len(profile.contexts)} context lengths (medians "
        "of interleaved repeats, isotonic in the batch size, averaged over contexts)"
    )
    return [
        "# Many devices, one edge: measured results",
        f"Model pair: {pair}. N devices share one uplink band and one edge; each decodes the "
        f"evaluation split ({prompts} prompts) from its own starting prompt, on its own fading "
        "stream (device by device, the same for every method: common random numbers). With one "
        "device the simulation is the single-device evaluation plus the edge work it leaves out "
        "(checked by the stage).",
        f"**Equal work on the edge.** {prefill}. A CU-HLM upload after s skipped tokens is "
        "verified as a forward over s + 1 tokens (the target catches up); a WISV round over "
        "gamma + 1. A batch is one flattened forward, as a continuous-batching server runs it "
        f"(max batch {policy['max_batch'] or 'N'}, window {policy['window_s'] * 1e3:g} ms; "
        f"TDMA slot {settings['tdma_slot_s'] * 1e3:g} ms). Single-request times: the "
        f"{compute_source} latency profile; batch shape: {shape} (below).",
        f"**Capacity.** Knee: the largest N whose aggregate throughput is at least "
        f"{cap['knee_gain']:.0%} above N/2's. Service level: every device >= "
        f"{cap['min_device_tokens_per_s']:g} tokens/s and p95 latency per generated token <= "
        f"{cap['max_token_latency_p95_s']:g} s. Latency is per generated token for every method "
        "(a WISV round's time over its tokens), prefills excluded. Every figure: the median over "
        f"replicates with its {level:.0%} interval; a replicate draws a fading seed, a bootstrap "
        "resample of the prompts and of the batch timings, paired across methods.",
    ]


COLUMNS = {
    "aggregate tokens/s": ("aggregate_tps", ".3g"),
    "per-device tokens/s": ("per_device_tps", ".3g"),
    "slowest device tokens/s": ("min_device_tps", ".3g"),
    "p50 s/token": ("token_latency_p50_s", ".3g"),
    "p95 s/token": ("token_latency_p95_s", ".3g"),
    "edge busy": ("edge_utilisation", ".2f"),
    "of it prefill": ("prefill_share", ".2f"),
    "mean batch": ("mean_batch", ".3g"),
    "queue wait (s)": ("edge_wait_mean_s", ".3g"),
    "band busy": ("uplink_utilisation", ".2f"),
}
"""The per-N table's columns: label -> (summary figure, format)."""


def report_tables(
    summary: pd.DataFrame,
    capacity: pd.DataFrame,
    crossovers: pd.DataFrame,
    profile: BatchProfile,
) -> dict[str, tuple[str, pd.DataFrame]]:
    """The report's titled tables (``document``'s ``tables``)."""
    from edgespec.multidevice.summary import display_table

    base = summary[summary["policy"] == "base"]
    swept = summary[summary["uplink"].isin(summary.loc[summary["policy"] != "base", "uplink"])]
    return {
        "Capacity": (
            "Per method, channel, uplink scheme and edge policy (base: the configured one; the "
            "others vary max_batch or the batching window at the first scheme).",
            capacity_rows(capacity),
        ),
        "Which protocol overtakes which": (
            "The N from which the first method's aggregate throughput stays above the second's "
            "(paired replicates; listed where the first trails at the smallest N).",
            crossover_rows(crossovers),
        ),
        "Target forward batch times": (
            "Median of the repeats per context (interquartile range), and the charged time: the "
            "isotonic fit in the batch size, averaged over contexts, with its factor t(b) / t(1).",
            profile_table(profile),
        ),
        "Every method, channel, uplink scheme and device count (base policy)": (
            "",
            display_table(base, COLUMNS),
        ),
        "Edge policy sweep": ("", display_table(swept[swept["policy"] != "base"], COLUMNS)),
    }


def prompt_count(runs: pd.DataFrame) -> int:
    """The evaluation split's size, which every method must share (ValueError otherwise)."""
    counts = runs.groupby("method")["prompts"].first()
    if counts.nunique() != 1:
        raise ValueError(f"the methods were decoded on different prompt sets: {counts.to_dict()}")
    return int(counts.iloc[0])
