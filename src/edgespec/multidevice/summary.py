"""Report tables of the multi-device simulation: medians and intervals over fading seeds,
where each method saturates the edge or the band, and the headline (methods §10); torch-free.

Every figure of a run (``edgespec.multidevice.sweep.run_metrics``) is computed per fading seed
(the same draws for every method at each seed: common random numbers) and reported as the
median over seeds with the central ``evaluation.seed_interval`` interval
(``edgespec.intervals.seed_interval``). Two ratios are taken seed by seed before summarising:
``scaling`` = aggregate tokens/s at N over the single device's, and ``efficiency`` = per-device
tokens/s at N over the single device's (1 until devices slow each other down).

**Saturation** (:func:`saturation_table`), per method, channel, uplink scheme and seed: the
smallest listed N at which the edge is busy at least ``utilisation`` of the time
(``edge_saturation_n``), the same for the band (``band_saturation_n``), their minimum
(``saturation_n``, with ``bottleneck`` the resource that saturates first), and the smallest N at
which the per-device throughput falls below ``efficiency`` of the single device's
(``scaling_limit_n``). A seed that never crosses within the sweep counts as infinity; the
median and interval over seeds are order statistics (no interpolation between device counts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import SEED_LEVEL, format_interval, seed_interval
from edgespec.report import HEADLINE_COLUMNS

KEY = ("method", "channel", "uplink")
METRICS = (
    "aggregate_tps",
    "per_device_tps",
    "scaling",
    "efficiency",
    "latency_p50_s",
    "latency_p95_s",
    "latency_mean_s",
    "edge_utilisation",
    "mean_batch",
    "edge_wait_mean_s",
    "uplink_utilisation",
)
"""Per-run figures summarised over fading seeds (``scaling`` and ``efficiency`` are added by
:func:`with_ratios`)."""

SATURATION = ("edge_saturation_n", "band_saturation_n", "saturation_n", "scaling_limit_n")


def with_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``scaling`` and ``efficiency`` against the same method, channel, scheme
    and seed with one device (NaN where N = 1 was not simulated)."""
    single = runs[runs["devices"] == 1].set_index([*KEY, "seed"])
    keys = pd.MultiIndex.from_frame(runs[[*KEY, "seed"]])
    base_agg = single["aggregate_tps"].reindex(keys).to_numpy()
    base_dev = single["per_device_tps"].reindex(keys).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return runs.assign(
            scaling=runs["aggregate_tps"].to_numpy() / base_agg,
            efficiency=runs["per_device_tps"].to_numpy() / base_dev,
        )


def summary_table(runs: pd.DataFrame, level: float = SEED_LEVEL) -> pd.DataFrame:
    """One row per (method, channel, uplink, N): ``seeds``, and for every figure of
    :data:`METRICS` its median over seeds with ``_lo``/``_hi``."""
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
                "seeds": int(group["seed"].nunique()),
                "prompts": int(first["prompts"]),
            }
        )
        for metric in METRICS:
            row.update(seed_interval(group[metric], level).as_dict(metric))
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values([*KEY, "devices"], kind="stable").reset_index(drop=True)


def _first_crossing(devices: np.ndarray, values: np.ndarray, crossed) -> float:
    """The smallest device count whose value satisfies ``crossed``; inf if none does."""
    hits = devices[crossed(values)]
    return float(hits.min()) if hits.size else math.inf


def discrete_interval(values: Sequence[float], level: float = SEED_LEVEL) -> tuple:
    """(median, low, high) of device counts over seeds as order statistics (inf allowed)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0:
        return math.nan, math.nan, math.nan
    tail = (1.0 - level) / 2.0
    q = np.quantile(x, [0.5, tail, 1.0 - tail], method="inverted_cdf")
    return float(q[0]), float(q[1]), float(q[2])


def saturation_table(
    runs: pd.DataFrame,
    utilisation: float,
    efficiency: float,
    level: float = SEED_LEVEL,
) -> pd.DataFrame:
    """One row per (method, channel, uplink): the saturation device counts (module docstring),
    each as median with ``_lo``/``_hi`` over seeds, and ``bottleneck`` (edge, band or none)."""
    runs = with_ratios(runs)
    rows = []
    for key, group in runs.groupby(list(KEY), sort=False):
        per_seed = []
        for _, seed_rows in group.groupby("seed"):
            seed_rows = seed_rows.sort_values("devices")
            n = seed_rows["devices"].to_numpy(dtype=float)
            edge = _first_crossing(
                n, seed_rows["edge_utilisation"].to_numpy(), lambda v: v >= utilisation
            )
            band = _first_crossing(
                n, seed_rows["uplink_utilisation"].to_numpy(), lambda v: v >= utilisation
            )
            limit = _first_crossing(n, seed_rows["efficiency"].to_numpy(), lambda v: v < efficiency)
            per_seed.append((edge, band, min(edge, band), limit))
        values = np.array(per_seed)
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["seeds"] = len(per_seed)
        for i, name in enumerate(SATURATION):
            point, low, high = discrete_interval(values[:, i], level)
            row.update({name: point, f"{name}_lo": low, f"{name}_hi": high})
        edge_n, band_n = row["edge_saturation_n"], row["band_saturation_n"]
        if math.isinf(edge_n) and math.isinf(band_n):
            row["bottleneck"] = "none"
        elif edge_n < band_n:
            row["bottleneck"] = "edge"
        elif band_n < edge_n:
            row["bottleneck"] = "band"
        else:
            row["bottleneck"] = "edge and band"
        rows.append(row)
    return pd.DataFrame(rows)


def headline(
    summary: pd.DataFrame,
    saturation: pd.DataFrame,
    uplink: str,
    channel: str,
) -> pd.DataFrame:
    """The headline rows (``metric, paper, ours, ours_lo, ours_hi, unit, where``) of each
    method at ``channel`` under ``uplink``: aggregate tokens/s and p95 latency at the largest N,
    the throughput scaling from one device to it, the device count at which the edge or the
    band saturates and the one at which per-device throughput falls below the saturation
    efficiency (``scaling_limit_n``; inf: not within the sweep). Neither paper has this
    experiment, so ``paper`` is "-"."""
    rows = []
    part = summary[(summary["uplink"] == uplink) & (summary["channel"] == channel)]
    sat = saturation[(saturation["uplink"] == uplink) & (saturation["channel"] == channel)]
    for method, group in part.groupby("method", sort=False):
        top = group.sort_values("devices").iloc[-1]
        n = int(top["devices"])
        where = f"{method}, {channel}, {uplink}"
        step = top.get("step", "step")
        for metric, column, unit in (
            (f"aggregate throughput, {n} devices", "aggregate_tps", "tokens/s"),
            (f"throughput scaling, 1 to {n} devices", "scaling", "x"),
            (f"p95 latency per {step}, {n} devices", "latency_p95_s", "s"),
        ):
            rows.append(
                {
                    "metric": f"multi-device: {metric}",
                    "paper": "-",
                    "ours": top[column],
                    "ours_lo": top[f"{column}_lo"],
                    "ours_hi": top[f"{column}_hi"],
                    "unit": unit,
                    "where": where,
                }
            )
        s = sat[sat["method"] == method]
        if len(s):
            s = s.iloc[0]
            for metric, column, note in (
                (
                    "devices until the edge or the band saturates",
                    "saturation_n",
                    f", first: {s['bottleneck']}",
                ),
                (
                    "devices until per-device throughput falls below the limit",
                    "scaling_limit_n",
                    "",
                ),
            ):
                if math.isinf(s[f"{column}_hi"]):
                    note += f" (inf: not reached with up to {n} devices)"
                rows.append(
                    {
                        "metric": f"multi-device: {metric}",
                        "paper": "-",
                        "ours": s[column],
                        "ours_lo": s[f"{column}_lo"],
                        "ours_hi": s[f"{column}_hi"],
                        "unit": "devices",
                        "where": f"{where}{note}",
                    }
                )
    return pd.DataFrame(rows, columns=list(HEADLINE_COLUMNS))


def display_table(summary: pd.DataFrame, columns: Mapping[str, tuple[str, str]]) -> pd.DataFrame:
    """A readable table: key columns and, per ``columns`` (label -> (metric, format)),
    ``median [lo, hi]`` strings."""
    out = summary[[*KEY, "devices", "seeds"]].copy()
    for label, (metric, fmt) in columns.items():
        out[label] = [
            format_interval(p, lo, hi, fmt, collapse_equal=True)
            for p, lo, hi in zip(
                summary[metric], summary[f"{metric}_lo"], summary[f"{metric}_hi"], strict=True
            )
        ]
    return out
