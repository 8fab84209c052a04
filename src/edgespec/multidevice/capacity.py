"""How many devices one edge carries, as a deployment asks it (methods §10); torch-free.

Every definition is applied replicate by replicate (``devices.Replicate``: fading seeds, a
bootstrap over prompts and over the batch profile's timings, paired across methods), then
summarised over replicates: a device count by order statistics (:func:`discrete_interval`), a
throughput by the median and central interval (``edgespec.intervals.seed_interval``). Per
method, channel, uplink scheme and edge policy (:func:`capacity_table`):

- **knee**: the largest simulated N whose aggregate throughput is still at least ``knee_gain``
  (10%) above that at N / 2 (read linearly between simulated counts); the smallest N when no
  doubling gains that much. A knee at the largest N means "not reached within the sweep";
- **peak**: the largest aggregate throughput over N, and the N it is reached at;
- **service**: the largest simulated N at which every device still gets at least
  ``min_device_tokens_per_s`` and the p95 latency per generated token is at most
  ``max_token_latency_p95_s`` (0: not even one device);
- **falls**: each step N_i -> N_i+1 at which the median aggregate throughput falls by more than
  the replicates' spread (the wider of the two intervals), a warning the report prints;
- edge busy time stays a column (``edge_utilisation`` of the summary), not a definition: a
  batching edge is always busy and may still have capacity.

:func:`ranking` orders the methods of each channel, scheme and policy by peak throughput and
marks neighbours whose paired difference (replicate by replicate) has an interval containing
0 as undecided; :func:`crossovers` gives the N from which one method's aggregate throughput
stays above another's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import SEED_LEVEL, seed_interval

KEY = ("method", "channel", "uplink", "policy")
GROUP = ("channel", "uplink", "policy")


def discrete_interval(values: Sequence[float], level: float = SEED_LEVEL) -> tuple:
    """(median, low, high) of device counts over replicates as order statistics (inf
    allowed)."""
    x = np.sort(np.asarray(values, dtype=float))
    if x.size == 0:
        return math.nan, math.nan, math.nan
    tail = (1.0 - level) / 2.0
    q = np.quantile(x, [0.5, tail, 1.0 - tail], method="inverted_cdf")
    return float(q[0]), float(q[1]), float(q[2])


def knee(devices: Sequence[int], throughput: Sequence[float], gain: float = 0.1) -> int:
    """The largest N of ``devices`` whose ``throughput`` is at least (1 + ``gain``) times the
    throughput at N / 2 (linear between simulated counts, only where N / 2 lies within them);
    the smallest N when none is."""
    n = np.asarray(devices, dtype=float)
    t = np.asarray(throughput, dtype=float)
    order = np.argsort(n)
    n, t = n[order], t[order]
    best = int(n[0])
    for count, value in zip(n, t, strict=True):
        half = count / 2.0
        if half < n[0]:
            continue
        if value >= (1.0 + gain) * float(np.interp(half, n, t)):
            best = int(count)
    return best


def service_limit(
    devices: Sequence[int],
    min_device_tps: Sequence[float],
    token_p95_s: Sequence[float],
    floor_tps: float,
    ceiling_s: float,
) -> int:
    """The largest N at which the slowest device has at least ``floor_tps`` tokens/s and the
    p95 latency per token is at most ``ceiling_s`` [s]; 0 when no N does."""
    ok = (np.asarray(min_device_tps, dtype=float) >= floor_tps) & (
        np.asarray(token_p95_s, dtype=float) <= ceiling_s
    )
    hits = np.asarray(devices)[ok]
    return int(hits.max()) if hits.size else 0


def per_replicate(runs: pd.DataFrame, settings: Mapping[str, float]) -> pd.DataFrame:
    """One row per (method, channel, uplink, policy, replicate): ``knee_n``, ``peak_tps``,
    ``peak_n`` and ``service_n`` (module docstring; ``settings``: ``knee_gain``,
    ``min_device_tokens_per_s``, ``max_token_latency_p95_s``)."""
    rows = []
    for key, group in runs.groupby([*KEY, "replicate"], sort=False):
        group = group.sort_values("devices")
        n = group["devices"].to_numpy()
        agg = group["aggregate_tps"].to_numpy(dtype=float)
        top = int(np.argmax(agg))
        rows.append(
            {
                **dict(zip([*KEY, "replicate"], key, strict=True)),
                "knee_n": knee(n, agg, settings["knee_gain"]),
                "peak_tps": float(agg[top]),
                "peak_n": int(n[top]),
                "service_n": service_limit(
                    n,
                    group["min_device_tps"],
                    group["token_latency_p95_s"],
                    settings["min_device_tokens_per_s"],
                    settings["max_token_latency_p95_s"],
                ),
            }
        )
    return pd.DataFrame(rows)


def throughput_falls(summary_rows: pd.DataFrame) -> list[tuple[int, int, float, float]]:
    """(N_i, N_i+1, median at N_i, median at N_i+1) of each step where the median aggregate
    throughput falls by more than the wider of the two intervals (module docstring)."""
    rows = summary_rows.sort_values("devices")
    out = []
    prev = None
    for _, row in rows.iterrows():
        if prev is not None:
            fall = prev["aggregate_tps"] - row["aggregate_tps"]
            spread = max(
                prev["aggregate_tps_hi"] - prev["aggregate_tps_lo"],
                row["aggregate_tps_hi"] - row["aggregate_tps_lo"],
            )
            if fall > 0 and fall > spread:
                out.append(
                    (
                        int(prev["devices"]),
                        int(row["devices"]),
                        float(prev["aggregate_tps"]),
                        float(row["aggregate_tps"]),
                    )
                )
        prev = row
    return out


def capacity_table(
    runs: pd.DataFrame,
    summary: pd.DataFrame,
    settings: Mapping[str, float],
    level: float = SEED_LEVEL,
) -> pd.DataFrame:
    """One row per (method, channel, uplink, policy): ``replicates``, ``fading_seeds``, and
    ``knee_n``, ``peak_tps``, ``peak_n``, ``service_n`` each with ``_lo``/``_hi``, the largest
    N, and ``falls`` (the steps of :func:`throughput_falls`, as text; empty if none)."""
    reps = per_replicate(runs, settings)
    rows = []
    for key, group in reps.groupby(list(KEY), sort=False):
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        part = runs
        for name, value in row.items():
            part = part[part[name] == value]
        row["replicates"] = int(group["replicate"].nunique())
        row["fading_seeds"] = int(part["fading_seeds"].max())
        row["max_devices"] = int(part["devices"].max())
        for name in ("knee_n", "peak_n", "service_n"):
            point, low, high = discrete_interval(group[name], level)
            row.update({name: point, f"{name}_lo": low, f"{name}_hi": high})
        row.update(seed_interval(group["peak_tps"], level).as_dict("peak_tps"))
        mine = summary
        for name in KEY:
            mine = mine[mine[name] == row[name]]
        falls = throughput_falls(mine)
        row["falls"] = "; ".join(
            f"N {a} -> {b}: {ta:.3g} -> {tb:.3g} tokens/s" for a, b, ta, tb in falls
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _paired(reps: pd.DataFrame, method: str, other: str, column: str) -> np.ndarray:
    a = reps[reps["method"] == method].set_index("replicate")[column]
    b = reps[reps["method"] == other].set_index("replicate")[column]
    common = a.index.intersection(b.index)
    return (a.loc[common] - b.loc[common]).to_numpy(dtype=float)


def ranking(
    runs: pd.DataFrame, settings: Mapping[str, float], level: float = SEED_LEVEL
) -> pd.DataFrame:
    """Per (channel, uplink, policy) the methods by median peak throughput, best first:
    ``rank``, ``method``, ``peak_tps`` with ``_lo``/``_hi``, ``knee_n`` with ``_lo``/``_hi``,
    and ``ahead_of_next``: "yes" where the paired difference to the next method has an
    interval above 0, "undecided" where it contains 0 (empty for the last)."""
    reps = per_replicate(runs, settings)
    rows = []
    for key, group in reps.groupby(list(GROUP), sort=False):
        stats = []
        for method, mine in group.groupby("method", sort=False):
            peak = seed_interval(mine["peak_tps"], level)
            knee_n = discrete_interval(mine["knee_n"], level)
            stats.append((peak.point, method, peak, knee_n))
        stats.sort(key=lambda s: (-s[0], s[1]))
        for rank, (_, method, peak, knee_n) in enumerate(stats, start=1):
            ahead = ""
            if rank < len(stats):
                diff = seed_interval(_paired(group, method, stats[rank][1], "peak_tps"), level)
                ahead = "yes" if diff.low > 0 else "undecided"
            rows.append(
                {
                    **dict(zip(GROUP, key, strict=True)),
                    "rank": rank,
                    "method": method,
                    **peak.as_dict("peak_tps"),
                    "knee_n": knee_n[0],
                    "knee_n_lo": knee_n[1],
                    "knee_n_hi": knee_n[2],
                    "ahead_of_next": ahead,
                }
            )
    return pd.DataFrame(rows)


def overtakes_from(devices: Sequence[int], difference: Sequence[float]) -> float:
    """The smallest N from which ``difference`` (one method's aggregate throughput minus
    another's) stays above 0 up to the largest N; inf when it is not above 0 there."""
    n = np.asarray(devices, dtype=float)
    d = np.asarray(difference, dtype=float)
    order = np.argsort(n)
    n, d = n[order], d[order]
    if not d.size or d[-1] <= 0:
        return math.inf
    below = np.flatnonzero(d <= 0)
    return float(n[below[-1] + 1]) if below.size else float(n[0])


def crossovers(runs: pd.DataFrame, level: float = SEED_LEVEL) -> pd.DataFrame:
    """Per (channel, uplink, policy) and ordered pair (method, other) where the method's median
    aggregate throughput trails the other's at the smallest N: ``overtakes_from_n`` with
    ``_lo``/``_hi`` over replicates (paired; inf: not within the sweep)."""
    rows = []
    for key, group in runs.groupby(list(GROUP), sort=False):
        curves = {
            m: part.pivot_table(index="replicate", columns="devices", values="aggregate_tps")
            for m, part in group.groupby("method", sort=False)
        }
        for method, mine in curves.items():
            for other, theirs in curves.items():
                if other == method:
                    continue
                common = mine.index.intersection(theirs.index)
                diff = mine.loc[common] - theirs.loc[common]
                counts = list(diff.columns)
                if float(diff[counts[0]].median()) > 0:
                    continue  # ahead from the start: not an overtaking
                values = [overtakes_from(counts, diff.loc[r].to_numpy()) for r in diff.index]
                point, low, high = discrete_interval(values, level)
                rows.append(
                    {
                        **dict(zip(GROUP, key, strict=True)),
                        "method": method,
                        "other": other,
                        "overtakes_from_n": point,
                        "overtakes_from_n_lo": low,
                        "overtakes_from_n_hi": high,
                        "max_devices": int(max(counts)),
                    }
                )
    return pd.DataFrame(rows)
