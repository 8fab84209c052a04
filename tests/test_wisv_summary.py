"""WISV report tables (methods §6): medians over fading seeds, seed and bootstrap intervals,
figures paired with vanilla SD, the headline table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from wisv_tables import costs as _costs
from wisv_tables import scores as _scores

from edgespec.wisv.summary import HEADLINE_COLUMNS, cell, display_table, headline, summarise

EVALUATION = {"seed_interval": 0.9, "bootstrap_interval": 0.95, "bootstrap_samples": 400}


@pytest.fixture(scope="module")
def summary():
    vanilla_latency = {s: (1.0 + s, 3.0 + s) for s in range(5)}  # per-seed means 2, 3, .., 6
    costs = pd.concat(
        [
            _costs("vanilla_sd", range(5), vanilla_latency),
            _costs("wisv_fh", [0], {0: (0.5, 2.5)}, tokens=(6, 6), rounds=(1, 2)),
        ]
    )
    scores = pd.concat(
        [
            _scores("vanilla_sd", "any", [1.0, 0.0]),
            _scores("wisv_fh", "poor", [0.0, 0.0], semantic=(0.7, 0.8)),
        ]
    )
    return summarise(costs, scores, seed=3, evaluation=EVALUATION).set_index("variant")


def test_delay_figures_are_medians_over_seeds_with_intervals(summary):
    vanilla = summary.loc["vanilla_sd"]
    assert vanilla["seeds"] == 5 and vanilla["prompts"] == 2
    assert vanilla["e2e_latency_s"] == pytest.approx(4.0)  # median of 2..6
    assert vanilla["e2e_latency_s_seed_lo"] == pytest.approx(np.quantile([2, 3, 4, 5, 6], 0.05))
    assert vanilla["e2e_latency_s_seed_hi"] == pytest.approx(np.quantile([2, 3, 4, 5, 6], 0.95))
    # Bootstrap over prompts of the seed-averaged latencies (3 and 5): within [3, 5].
    assert 3.0 <= vanilla["e2e_latency_s_lo"] <= 4.0 <= vanilla["e2e_latency_s_hi"] <= 5.0
    assert vanilla["aal"] == pytest.approx(10 / 4)
    assert vanilla["aal_lo"] == pytest.approx(2.0) and vanilla["aal_hi"] == pytest.approx(3.0)
    assert vanilla["uplink_bytes_per_token"] == pytest.approx(160 / 8 / 10)
    ours = summary.loc["wisv_fh"]
    assert ours["seeds"] == 1
    assert math.isnan(ours["e2e_latency_s_seed_lo"])  # one seed: no interval over seeds
    assert ours["e2e_latency_s"] == pytest.approx(1.5)


def test_relative_figures_pair_seeds_and_prompts(summary):
    ours = summary.loc["wisv_fh"]
    # Seed 0 only: vanilla's seed-0 mean is 2.0.
    assert ours["latency_reduction"] == pytest.approx(1 - 1.5 / 2.0)
    assert ours["aal_gain"] == pytest.approx((12 / 3) / (10 / 4) - 1)
    assert ours["round_reduction"] == pytest.approx(1 - 1.5 / 2.0)
    assert ours["latency_reduction_lo"] <= ours["latency_reduction"] <= ours["latency_reduction_hi"]
    # Prompt a alone: 1 - 0.5/1; prompt b alone: 1 - 2.5/3: the bootstrap stays between them.
    assert ours["latency_reduction_lo"] >= 1 - 2.5 / 3.0 - 1e-12
    assert ours["latency_reduction_hi"] <= 0.5 + 1e-12
    assert summary.loc["vanilla_sd", "latency_reduction"] == pytest.approx(0.0)


def test_accuracy_figures_use_prompts_and_channel_blind_scores_hold_everywhere(summary):
    vanilla, ours = summary.loc["vanilla_sd"], summary.loc["wisv_fh"]
    assert vanilla["task_accuracy"] == pytest.approx(0.5)
    assert ours["task_accuracy"] == pytest.approx(0.0)
    assert ours["accuracy_drop"] == pytest.approx(0.5)
    assert ours["semantic_drop"] == pytest.approx(0.1)
    assert 0.0 <= ours["accuracy_drop_lo"] <= 0.5 <= ours["accuracy_drop_hi"] <= 1.0


def test_headline_and_cells(summary):
    top = headline(summary.reset_index())
    assert tuple(top.columns) == HEADLINE_COLUMNS
    rows = top.set_index("metric")
    latency = rows.loc["end-to-end latency vs vanilla SD (simulation)"]
    assert latency["ours"] == pytest.approx(-25.0) and latency["unit"] == "%"
    assert latency["ours_lo"] <= latency["ours"] <= latency["ours_hi"]
    assert latency["where"] == "wisv_fh, poor, gamma=4"
    assert rows.loc["task-accuracy drop vs vanilla SD", "unit"] == "points"
    assert rows.loc["task-accuracy drop vs vanilla SD", "ours"] == pytest.approx(50.0)
    # A quality claim against the floor 0, paired by prompt: drops (1, 0), sd 0.7071 over
    # n = 2, MDD (1.96 + 0.8416) 0.7071 / sqrt(2) = 1.4008; [0, 100] points holds the 1.
    drop = rows.loc["task-accuracy drop vs vanilla SD"]
    assert drop["floor"] == 0.0 and drop["n"] == 2
    assert drop["mdd"] == pytest.approx(140.08, abs=0.01)
    assert drop["verdict"] == "undecided at n=2"
    assert pd.isna(latency["verdict"])
    row = {"x": 0.25, "x_seed_lo": 0.2, "x_seed_hi": 0.3, "x_lo": 0.1, "x_hi": 0.4}
    assert cell(row, "x") == "0.25 [0.2, 0.3] (0.1, 0.4)"
    assert cell(row, "x", scale=-100) == "-25 [-30, -20] (-40, -10)"
    assert cell({"x": math.nan}, "x") == "n/a"
    table = display_table(summary.reset_index())
    assert "e2e latency (s)" in table.columns and len(table) == 2
