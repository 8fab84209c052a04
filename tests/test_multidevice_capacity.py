"""The many-device capacity answer: knee, peak and service level per replicate, throughput that
falls, the ranking and its undecided neighbours, crossovers, the headline and the report's
warnings, on hand-built runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from edgespec.multidevice.batchprofile import BatchProfile
from edgespec.multidevice.capacity import (
    capacity_table,
    crossovers,
    discrete_interval,
    knee,
    overtakes_from,
    ranking,
    service_limit,
    throughput_falls,
)
from edgespec.multidevice.report import verdict_lines, warnings
from edgespec.multidevice.summary import METRICS, headline, summary_table

LIMITS = {"knee_gain": 0.1, "min_device_tokens_per_s": 2.0, "max_token_latency_p95_s": 0.5}
COUNTS = [1, 2, 4, 8, 16, 32]


def test_knee_is_the_largest_n_still_ten_percent_above_half_of_it():
    # 2: 19 >= 11; 4: 30 >= 20.9; 8: 34 >= 33; 16: 36 < 37.4; 32: 36 < 39.6.
    assert knee(COUNTS, [10, 19, 30, 34, 36, 36]) == 8
    # A later doubling that gains again counts: the largest such N.
    assert knee(COUNTS, [10, 19, 30, 31, 36, 36]) == 16
    assert knee(COUNTS, [10, 10, 10, 10, 10, 10]) == 1
    assert knee(COUNTS, [1, 2, 4, 8, 16, 32]) == 32  # not reached within the sweep
    # N / 2 between simulated counts is read linearly: at 3 -> 1.5 -> 15.
    assert knee([1, 3, 6], [10, 20, 21]) == 3
    assert knee([1, 3, 6], [10, 20, 22.5], gain=0.1) == 6


def test_service_level_needs_both_the_floor_and_the_ceiling():
    tps = [5.0, 4.0, 3.0, 2.5, 1.5, 1.0]
    p95 = [0.1, 0.2, 0.3, 0.6, 0.7, 0.9]
    assert service_limit(COUNTS, tps, p95, 2.0, 0.5) == 4
    assert service_limit(COUNTS, tps, p95, 2.0, 1.0) == 8
    assert service_limit(COUNTS, tps, p95, 6.0, 1.0) == 0


def test_overtaking_needs_to_stay_ahead_to_the_end():
    assert overtakes_from(COUNTS, [-1, -0.5, 0.2, -0.1, 0.3, 0.4]) == 16
    assert overtakes_from(COUNTS, [1, 1, 1, 1, 1, 1]) == 1
    assert math.isinf(overtakes_from(COUNTS, [-1, 1, 1, 1, 1, -0.1]))
    assert discrete_interval([2, 4, math.inf], 0.9) == (4.0, 2.0, math.inf)


def runs_frame(curves, seeds_of=None):
    """Runs of hand-given aggregate throughput: method -> list over replicates of a curve over
    COUNTS; the other figures follow from it."""
    rows = []
    for method, reps in curves.items():
        for r, curve in enumerate(reps):
            for n, agg in zip(COUNTS, curve, strict=True):
                row = {m: 0.5 for m in METRICS if m not in ("scaling", "efficiency")}
                row.update(
                    {
                        "method": method,
                        "family": "cuhlm",
                        "step": "token",
                        "channel": "good",
                        "uplink": "equal_split",
                        "policy": "base",
                        "max_batch_cap": 0,
                        "window_s": 0.0,
                        "replicate": r,
                        "fading_seeds": (seeds_of or {}).get(method, len(reps)),
                        "prompts": 4,
                        "devices": n,
                        "aggregate_tps": agg,
                        "per_device_tps": agg / n,
                        "min_device_tps": agg / n,
                        "token_latency_p95_s": 0.05 * n,
                        "extrapolated_batches": 0.0,
                    }
                )
                rows.append(row)
    return pd.DataFrame(rows)


def test_capacity_ranking_crossovers_and_warnings_on_hand_built_runs():
    grow = [10, 19, 30, 34, 36, 36]
    curves = {
        # fast: knee 8, peak 36 at 16; near: the same within 1%, so its rank is undecided.
        "fast": [[v * s for v in grow] for s in (1.0, 1.02, 0.98, 1.01, 0.99)],
        "near": [[v * s for v in grow] for s in (1.01, 0.97, 1.0, 0.99, 1.02)],
        # slow starts ahead, then falls from N = 4 on by far more than its spread.
        "slow": [[12, 20, 24, 12, 10, 9] for _ in range(5)],
    }
    runs = runs_frame(curves, seeds_of={"slow": 1})
    summary = summary_table(runs, 0.9)
    cap = capacity_table(runs, summary, LIMITS, 0.9).set_index("method")
    assert cap.loc["fast", "knee_n"] == 8 and cap.loc["fast", "knee_n_lo"] == 8
    assert cap.loc["fast", "peak_tps"] == pytest.approx(36.0)
    assert cap.loc["fast", "peak_n"] == 16
    # min tps = agg / N >= 2 up to N = 8 (34 / 8), p95 = 0.05 N <= 0.5 up to N = 8.
    assert cap.loc["fast", "service_n"] == 8
    assert cap.loc["fast", "falls"] == ""
    assert "N 4 -> 8" in cap.loc["slow", "falls"]
    rank = ranking(runs, LIMITS, 0.9)
    assert list(rank["method"]) == ["fast", "near", "slow"] or list(rank["method"]) == [
        "near",
        "fast",
        "slow",
    ]
    assert list(rank["ahead_of_next"]) == ["undecided", "yes", ""]
    line = verdict_lines(rank)[0]
    assert line.startswith("- **good, equal_split**: ") and " ≈ " in line and " > " in line
    cross = crossovers(runs, 0.9).set_index(["method", "other"])
    assert cross.loc[("fast", "slow"), "overtakes_from_n"] == 4  # 30 > 24 from N = 4 on
    assert ("slow", "fast") not in cross.index  # slow is ahead at N = 1: no overtaking
    profile = BatchProfile({0: {1: {1: [0.1]}}}, "given", warnings=["cell x: 5.6x"])
    notes = warnings(rank, capacity_table(runs, summary, LIMITS, 0.9), summary, profile)
    text = "\n".join(notes)
    assert "batch profile: cell x: 5.6x" in text
    assert "fast above near is undecided" in text or "near above fast is undecided" in text
    assert "slow, good, equal_split: aggregate throughput falls" in text
    assert "slow, good, equal_split: priced on one fading realisation" in text
    top = headline(
        summary, capacity_table(runs, summary, LIMITS, 0.9), "equal_split", "good", LIMITS
    )
    assert len(top) == 3 * 5 and (top["paper"] == "-").all()
    assert set(top["unit"]) == {"tokens/s", "devices", "s"}
    knee_row = top[(top["metric"].str.contains("knee")) & (top["where"].str.startswith("fast"))]
    assert knee_row["ours"].iloc[0] == 8
    assert top["where"].str.contains("one fading realisation").sum() == 5  # slow's rows


def test_summary_takes_ratios_replicate_by_replicate():
    runs = runs_frame({"m": [[10, 18, 20, 20, 20, 20], [11, 18, 22, 22, 22, 22]]})
    summary = summary_table(runs, 0.9)
    top = summary[summary["devices"] == 4]
    # scaling 2.0 in both replicates (20 / 10, 22 / 11).
    assert top["scaling"].iloc[0] == pytest.approx(2.0)
    assert top["scaling_lo"].iloc[0] == pytest.approx(2.0)
    assert top["replicates"].iloc[0] == 2
    assert np.isclose(summary.loc[summary["devices"] == 1, "efficiency"], 1.0).all()


def test_throughput_falls_only_beyond_the_spread():
    def rows(values, width):
        return pd.DataFrame(
            {
                "devices": [1, 2, 4],
                "aggregate_tps": values,
                "aggregate_tps_lo": [v - width for v in values],
                "aggregate_tps_hi": [v + width for v in values],
            }
        )

    assert throughput_falls(rows([10, 20, 15], 1.0)) == [(2, 4, 20.0, 15.0)]
    assert throughput_falls(rows([10, 20, 15], 3.0)) == []  # within the spread
    assert throughput_falls(rows([10, 20, 19.5], 0.0)) == [(2, 4, 20.0, 19.5)]
