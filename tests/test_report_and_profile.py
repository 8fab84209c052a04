"""Report tables on hand-built inputs, the latency profiler on tiny models, config helpers
(the WISV summary with intervals: test_wisv_summary.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from edgespec.config import (
    ConfigError,
    channel_conditions,
    check_wisv_settings,
    validate_config,
    wisv_channels,
)
from edgespec.profiling import (
    measure_head_round_s,
    measure_latency_profile,
    measure_prefill_token_s,
)
from edgespec.report import markdown_table, paper_comparison
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


def test_wisv_channels_share_the_configured_correlation_and_settings_are_checked():
    cfg = validate_config({})
    channels = wisv_channels(cfg)
    assert {c["correlation"] for c in channels.values()} == {cfg["wisv"]["correlation"]}
    own = {"fading": "rayleigh", "bandwidth_hz": 1e6, "snr_db": 0.0, "correlation": 0.3}
    assert (
        wisv_channels(validate_config({"wisv": {"channels": {"own": own}}}))["own"]["correlation"]
        == 0.3
    )
    check_wisv_settings(cfg)
    with pytest.raises(ConfigError, match="wisv.label_max_new_tokens"):
        check_wisv_settings(validate_config({"wisv": {"label_max_new_tokens": 8}}))
    with pytest.raises(ConfigError, match="wisv.csi_decode_seeds"):
        check_wisv_settings(
            validate_config(
                {"wisv": {"csi_decode_seeds": [0, 5]}, "evaluation": {"fading_seeds": 5}}
            )
        )
    with pytest.raises(ConfigError, match="wisv.relabel.snr_db_range"):
        check_wisv_settings(validate_config({"wisv": {"relabel": {"snr_db_range": [10, 0]}}}))
    with pytest.raises(ConfigError, match="wisv.variants"):
        validate_config({"wisv": {"variants": ["head_magic"]}})


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


def test_wisv_prefill_and_head_time_are_measured_on_tiny_models(tiny_target):
    from edgespec.wisv.head import DecisionHead

    per_token = measure_prefill_token_s(tiny_target, list(range(1, 21)), repeats=3)
    assert 0 < per_token < 1
    head = DecisionHead(8, 6, 2)
    assert measure_head_round_s(head, 4, [1.0, 2.0], repeats=3) > 0
    assert measure_head_round_s(DecisionHead(8, 6, 0), 4, None, repeats=3) > 0
    with pytest.raises(ValueError):
        measure_prefill_token_s(tiny_target, [], repeats=1)
    profile = LatencyProfile(
        draft_token_s=0.1,
        target_token_s=0.2,
        draft_prefill_token_s=0.01,
        target_prefill_token_s=0.03,
    )
    assert profile.prefill_s(10) == pytest.approx(0.4)
    assert LatencyProfile.from_dict(profile.to_dict()) == profile
