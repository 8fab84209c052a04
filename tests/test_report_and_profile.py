"""Report tables on hand-built inputs, the latency profiler on tiny models, config helpers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from edgespec.config import ConfigError, channel_conditions, validate_config, wisv_channels
from edgespec.profiling import measure_latency_profile
from edgespec.report import markdown_table, paper_comparison, wisv_comparison, wisv_relative
from edgespec.wireless.delay import LatencyProfile


def test_paper_comparison_reads_the_named_condition():
    summary = pd.DataFrame(
        [
            {
                "variant": "cuhlm_online",
                "channel": "rayleigh_snr10",
                "throughput_gain": 12.5,
                "skip_rate": 0.5,
                "vocab_compression": 0.99,
                "relative_semantic_accuracy": 0.97,
            },
        ]
    )
    table = paper_comparison(summary)
    row = table[
        (table["metric"] == "token throughput vs standard HLM")
        & (table["our_channel"] == "rayleigh_snr10")
    ].iloc[0]
    assert row["ours"] == "12.5x" and row["paper_value"] == "206x"
    assert table[table["metric"] == "uploads skipped"].iloc[0]["ours"] == "50.0%"
    missing = table[table["our_channel"] == "rayleigh_snr-20"].iloc[0]
    assert missing["ours"] == "n/a"


def test_wisv_relative_and_comparison_hand_case():
    metrics = pd.DataFrame(
        [
            {
                "variant": "vanilla_sd",
                "channel": "poor",
                "gamma": 4,
                "aal": 2.0,
                "rounds_per_answer": 10.0,
                "e2e_latency_s": 5.0,
                "task_accuracy": 0.5,
                "semantic_accuracy": 0.8,
            },
            {
                "variant": "wisv_fh",
                "channel": "poor",
                "gamma": 4,
                "aal": 3.0,
                "rounds_per_answer": 6.0,
                "e2e_latency_s": 4.0,
                "task_accuracy": 0.5,
                "semantic_accuracy": 0.7,
            },
        ]
    )
    rel = wisv_relative(metrics).set_index("variant")
    assert rel.loc["wisv_fh", "aal_gain"] == pytest.approx(0.5)
    assert rel.loc["wisv_fh", "round_reduction"] == pytest.approx(0.4)
    assert rel.loc["wisv_fh", "latency_reduction"] == pytest.approx(0.2)
    assert rel.loc["wisv_fh", "accuracy_drop"] == pytest.approx(0.0)
    comp = wisv_comparison(rel.reset_index()).set_index("metric")
    assert comp.loc["interaction rounds vs vanilla SD", "ours"] == "-40.0%"
    assert comp.loc["accepted length (AAL) vs vanilla SD", "ours"] == "+50.0%"


def test_markdown_table_formats_nan():
    text = markdown_table(pd.DataFrame({"a": [1.0, math.nan], "b": ["x", "y"]}))
    assert text.splitlines()[0] == "| a | b |" and "n/a" in text


def test_channel_conditions_are_named_and_checked():
    cfg = validate_config({})
    names = channel_conditions(cfg)
    assert "rayleigh_snr-20" in names and names["rician_snr10"]["k_factor"] == 5.0
    bad = validate_config({"cuhlm": {"kstar_channel": "awgn_snr3"}})
    with pytest.raises(ConfigError, match="cuhlm.kstar_channel"):
        channel_conditions(bad)
    with pytest.raises(ConfigError, match="wisv.channels.odd"):
        wisv_channels(validate_config({"wisv": {"channels": {"odd": {"fading": "rayleigh"}}}}))


def test_latency_profile_is_measured_on_tiny_models(tiny_target, tiny_draft_close):
    profile = measure_latency_profile(
        tiny_draft_close,
        tiny_target,
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        gammas=[1, 4],
        repeats=3,
        uncertainty_samples=8,
        theta_max=2.0,
        seed=0,
    )
    parsed = LatencyProfile.from_dict(profile)
    assert parsed.draft_token_s > 0 and parsed.target_token_s > 0 and parsed.uncertainty_s > 0
    assert parsed.target_verify(4) > 0 and profile["machine"]["repeats"] == 3
