"""Report tables of the multi-device simulation: medians and intervals over replicates and the
headline (methods §10); torch-free.

Every figure of a run (``edgespec.multidevice.sweep.run_metrics``) is computed per replicate
(``edgespec.multidevice.devices``: fading seeds, prompts resampled, the batch profile's timings
resampled; the same for every method: common random numbers) and reported as the median over
replicates with the central ``evaluation.seed_interval`` interval
(``edgespec.intervals.seed_interval``). Two ratios are taken replicate by replicate before
summarising: ``scaling`` = aggregate tokens/s at N over the single device's, and
``efficiency`` = per-device tokens/s at N over the single device's. A method priced on one
fading realisation (a CSI-reading variant with one decoded seed) has intervals over prompts and
timings only; its rows say so (``fading_seeds`` 1). The capacity definitions (knee, peak,
service level) are in ``edgespec.multidevice.capacity``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import SEED_LEVEL, format_interval, seed_interval
from edgespec.report import HEADLINE_COLUMNS

KEY = ("method", "channel", "uplink", "policy")
METRICS = (
    "aggregate_tps",
    "per_device_tps",
    "min_device_tps",
    "scaling",
    "efficiency",
    "token_latency_p50_s",
    "token_latency_p95_s",
    "token_latency_mean_s",
    "step_latency_p95_s",
    "edge_utilisation",
    "prefill_share",
    "mean_batch",
    "edge_wait_mean_s",
    "extrapolated_batches",
    "uplink_utilisation",
)
"""Per-run figures summarised over replicates (``scaling`` and ``efficiency`` are added by
:func:`with_ratios`)."""


def with_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``scaling`` and ``efficiency`` against the same method, channel, scheme,
    policy and replicate with one device (NaN where N = 1 was not simulated)."""
    single = runs[runs["devices"] == 1].set_index([*KEY, "replicate"])
    keys = pd.MultiIndex.from_frame(runs[[*KEY, "replicate"]])
    base_agg = single["aggregate_tps"].reindex(keys).to_numpy()
    base_dev = single["per_device_tps"].reindex(keys).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return runs.assign(
            scaling=runs["aggregate_tps"].to_numpy() / base_agg,
            efficiency=runs["per_device_tps"].to_numpy() / base_dev,
        )


def summary_table(runs: pd.DataFrame, level: float = SEED_LEVEL) -> pd.DataFrame:
    """One row per (method, channel, uplink, policy, N): ``replicates``, ``fading_seeds``, and
    for every figure of :data:`METRICS` its median over replicates with ``_lo``/``_hi``."""
    runs = with_ratios(runs)
    rows = []
    group_keys = [*KEY, "devices"]
    for key, group in runs.groupby(group_keys, sort=False):
        first = group.iloc[0]
        row: dict[str, Any] = dict(zip(group_keys, key, strict=True))
        row.update(
            {
                "family": first.get("family", ""),
                "step": first.get("step", ""),
                "replicates": int(group["replicate"].nunique()),
                "fading_seeds": int(group["fading_seeds"].max()),
                "prompts": int(first["prompts"]),
                "max_batch_cap": int(first["max_batch_cap"]),
                "window_s": float(first["window_s"]),
            }
        )
        for metric in METRICS:
            row.update(seed_interval(group[metric], level).as_dict(metric))
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values([*KEY, "devices"], kind="stable").reset_index(drop=True)


def _headline_row(metric, interval, unit, where) -> dict[str, Any]:
    point, low, high = interval
    return {
        "metric": f"multi-device: {metric}",
        "paper": "-",
        "ours": point,
        "ours_lo": low,
        "ours_hi": high,
        "unit": unit,
        "where": where,
    }


def headline(
    summary: pd.DataFrame,
    capacity: pd.DataFrame,
    uplink: str,
    channel: str,
    service: Mapping[str, float],
) -> pd.DataFrame:
    """The headline rows (``metric, paper, ours, ours_lo, ours_hi, unit, where``) of each
    method at ``channel`` under ``uplink`` and the base policy: peak aggregate throughput (and
    where), the knee, the largest N meeting the ``service`` level, and aggregate throughput and
    p95 latency per generated token at the largest N. Neither paper has this experiment, so
    ``paper`` is "-"."""
    rows = []
    sel = (summary["uplink"] == uplink) & (summary["channel"] == channel)
    part = summary[sel & (summary["policy"] == "base")]
    cap = capacity[
        (capacity["uplink"] == uplink)
        & (capacity["channel"] == channel)
        & (capacity["policy"] == "base")
    ]
    floor, ceiling = service["min_device_tokens_per_s"], service["max_token_latency_p95_s"]
    for method, group in part.groupby("method", sort=False):
        top = group.sort_values("devices").iloc[-1]
        n = int(top["devices"])
        where = f"{method}, {channel}, {uplink}"
        if int(top["fading_seeds"]) == 1:
            where += " (one fading realisation: interval over prompts and timings only)"
        c = cap[cap["method"] == method]
        if len(c):
            c = c.iloc[0]
            peak_at = f"at N = {c['peak_n']:g} [{c['peak_n_lo']:g}, {c['peak_n_hi']:g}]"
            knee_note = " (the largest N: not reached)" if c["knee_n_hi"] >= n else ""
            rows += [
                _headline_row(
                    "peak aggregate throughput",
                    (c["peak_tps"], c["peak_tps_lo"], c["peak_tps_hi"]),
                    "tokens/s",
                    f"{where}, {peak_at}",
                ),
                _headline_row(
                    "knee (largest N still 10% above N/2)",
                    (c["knee_n"], c["knee_n_lo"], c["knee_n_hi"]),
                    "devices",
                    where + knee_note,
                ),
                _headline_row(
                    f"devices served at >= {floor:g} tokens/s each, p95 <= {ceiling:g} s/token",
                    (c["service_n"], c["service_n_lo"], c["service_n_hi"]),
                    "devices",
                    where,
                ),
            ]
        for metric, column, unit in (
            (f"aggregate throughput, {n} devices", "aggregate_tps", "tokens/s"),
            (f"p95 latency per generated token, {n} devices", "token_latency_p95_s", "s"),
        ):
            interval = (top[column], top[f"{column}_lo"], top[f"{column}_hi"])
            rows.append(_headline_row(metric, interval, unit, where))
    return pd.DataFrame(rows, columns=list(HEADLINE_COLUMNS))


def display_table(summary: pd.DataFrame, columns: Mapping[str, tuple[str, str]]) -> pd.DataFrame:
    """A readable table: key columns and, per ``columns`` (label -> (metric, format)),
    ``median [lo, hi]`` strings."""
    out = summary[[*KEY, "devices", "replicates"]].copy()
    for label, (metric, fmt) in columns.items():
        out[label] = [
            format_interval(p, lo, hi, fmt, collapse_equal=True)
            for p, lo, hi in zip(
                summary[metric], summary[f"{metric}_lo"], summary[f"{metric}_hi"], strict=True
            )
        ]
    return out
