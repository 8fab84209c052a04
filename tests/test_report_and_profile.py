"""Report tables on hand-built inputs, the latency profiler on tiny models, config helpers
(the WISV summary with intervals: test_wisv_summary.py)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from edgespec.config import (
    ConfigError,
    channel_conditions,
    check_wisv_settings,
    validate_config,
    wisv_channels,
)
from edgespec.cuhlm.profile import (
    measure_draft_vocabulary_operations,
    measure_vocabulary_operations,
    topk_ladder,
)
from edgespec.hardware import HardwareSpec, roofline_profile
from edgespec.profiling import (
    measure_head_round_s,
    measure_latency_profile,
    measure_prefill_token_s,
)
from edgespec.report import (
    HEADLINE_COLUMNS,
    format_figure,
    headline_table,
    markdown_table,
    paper_comparison,
    precision_paragraph,
)
from edgespec.wireless.delay import LatencyProfile


def test_format_figure_per_unit():
    assert format_figure(0.9025, "x") == "0.902x"
    assert format_figure(1014.2, "x") == "1014x"  # no exponent notation from 1000 on
    assert format_figure(0.748, "%", scale=100) == "74.8%"
    assert format_figure(12.0, "devices") == "12 devices"
    assert format_figure(0.5, "") == "0.5"
    assert format_figure(None, "x") == format_figure(math.nan, "%") == "n/a"


def test_paper_comparison_reads_the_named_condition():
    def row(profile, gain, lo, hi):
        return {
            "variant": "cuhlm_online",
            "channel": "rayleigh_snr10",
            "profile": profile,
            "throughput_gain": gain,
            "throughput_gain_lo": lo,
            "throughput_gain_hi": hi,
            "skip_rate": 0.5,
            "skip_rate_lo": 0.4,
            "skip_rate_hi": 0.6,
            "vocab_compression": 0.99,
            "relative_semantic_accuracy": 0.97,
        }

    summary = pd.DataFrame([row("primary", 12.5, 10.0, 20.0), row("paper_hw", 150.0, 90.0, 300.0)])
    profiles = {"primary": "measured", "paper_hw": "paper hardware"}
    table = paper_comparison(summary, profiles)
    gain = table[
        (table["metric"] == "token throughput vs standard HLM")
        & (table["our_channel"] == "rayleigh_snr10")
    ].iloc[0]
    assert gain["ours (measured)"] == "12.5x [10, 20]" and gain["paper_value"] == "206x"
    assert gain["ours (paper hardware)"] == "150x [90, 300]"
    skipped = table[table["metric"] == "uploads skipped"].iloc[0]
    assert skipped["ours (measured)"] == skipped["ours (paper hardware)"] == "50.0% [40, 60]"
    missing = table[table["our_channel"] == "rayleigh_snr-20"].iloc[0]
    assert missing["ours (measured)"] == "n/a"
    headline = headline_table(summary, profiles)
    assert list(headline.columns) == list(HEADLINE_COLUMNS)
    assert HEADLINE_COLUMNS[-4:] == ("floor", "mdd", "n", "verdict")
    gains = headline[headline["metric"] == "CU-HLM: token throughput vs standard HLM"]
    assert len(gains) == 4  # two paper numbers, each under both profiles
    online = gains[gains["where"] == "cuhlm_online, rayleigh_snr10, paper hardware"].iloc[0]
    assert (online["ours"], online["ours_lo"], online["ours_hi"]) == (150.0, 90.0, 300.0)
    skip = headline[headline["metric"] == "CU-HLM: uploads skipped"]
    assert len(skip) == 1 and skip.iloc[0]["ours"] == pytest.approx(50.0)
    assert skip.iloc[0]["unit"] == "%" and skip.iloc[0]["paper"] == 74.8


def test_markdown_table_formats_nan():
    text = markdown_table(pd.DataFrame({"a": [1.0, math.nan], "b": ["x", "y"]}))
    assert text.splitlines()[0] == "| a | b |" and "n/a" in text


def test_report_states_the_precision_and_the_quantisation_cost():
    precision = {
        "dtype": "bfloat16",
        "reason": "native bf16 (avx512_bf16)",
        "machine": {"device": "cpu", "cpu_count": 2, "simd": ["avx2", "avx512_bf16"]},
    }
    text = precision_paragraph(precision)
    assert "**bfloat16** (native bf16 (avx512_bf16); cpu, 2 cores, avx512_bf16)" in text
    assert "quantised" not in text
    emulated = {**precision, "machine": {"device": "cpu", "cpu_count": 2, "simd": ["avx2"]}}
    assert "no native bf16" in precision_paragraph(emulated)
    quantization = {
        "quantize": "int8_dynamic",
        "top1_agreement": 0.896,
        "mean_tv": 0.1234,
        "positions": 96,
    }
    text = precision_paragraph(precision, quantization)
    assert "The target ran **int8_dynamic**-quantised" in text
    assert "top-1 agreement 89.6% and mean total variation 0.123 over 96 positions" in text
    draft_only = {**quantization, "quantize": "int8_dynamic_draft", "model": "draft"}
    text = precision_paragraph(precision, draft_only)
    assert "The draft ran **int8_dynamic_draft**-quantised: against the unquantised draft" in text
    assert "the decoded text is still the target's" in text


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
    assert "online_k_s" not in profile and "topk_s" not in profile
    # The device's CU-HLM vocabulary work, timed on the real |V| = 61 distribution and added
    # by rule profile_latency.
    profile.update(
        measure_draft_vocabulary_operations(tiny_draft_close, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3)
    )
    parsed = LatencyProfile.from_dict(profile)
    assert parsed.draft_token_s > 0 and parsed.target_token_s > 0 and parsed.uncertainty_s > 0
    assert parsed.target_verify(4) > 0 and profile["machine"]["repeats"] == 3
    assert parsed.online_k_s > 0
    assert list(parsed.topk_s) == topk_ladder(61) == [1, 4, 16, 60]
    assert all(s > 0 for s in parsed.topk_s.values())


def test_vocabulary_operations_are_timed_on_the_given_distribution():
    probs = torch.softmax(torch.randn(1, 1000, generator=torch.Generator().manual_seed(0)), -1)
    timed = measure_vocabulary_operations(probs, torch.tensor([3]), repeats=2)
    assert set(timed) == {"online_k_s", "topk_s"}
    assert [int(k) for k in timed["topk_s"]] == [1, 4, 16, 64, 256, 999]
    with pytest.raises(ValueError, match="one distribution"):
        measure_vocabulary_operations(probs.expand(2, 1000), torch.tensor([3, 4]), repeats=1)


def test_paper_hardware_profile_is_the_roofline_of_the_stated_figures():
    spec = HardwareSpec.from_dict(validate_config({})["latency"]["paper_hardware"])
    profile, derivation = roofline_profile(
        spec, vocab_size=32000, uncertainty_samples=20, gammas=[4]
    )
    # TinyLlama-1.1B in fp16 over 204.8 GB/s; Llama-2-7B in fp16 over 1555 GB/s.
    assert profile.draft_token_s == pytest.approx(1.1e9 * 2 / 204.8e9)
    assert profile.target_token_s == pytest.approx(6.74e9 * 2 / 1555e9)
    assert 1e3 * profile.draft_token_s == pytest.approx(10.74, abs=0.01)
    assert 1e3 * profile.target_token_s == pytest.approx(8.67, abs=0.01)
    assert profile.target_verify(4) == profile.target_token_s
    one_pass = 32000 * 4 / 204.8e9
    assert profile.uncertainty_s == pytest.approx(20 * one_pass)
    assert profile.online_k_s == pytest.approx((15 + 3) * one_pass)
    assert profile.topk_time(7) == pytest.approx(one_pass)
    assert profile.source == "paper_hardware" and derivation["draft_bytes"] == 2.2e9
    with pytest.raises(ValueError, match="unknown"):
        HardwareSpec.from_dict({**spec.__dict__, "clock_ghz": 1.0})
    with pytest.raises(ValueError, match="device_bandwidth_gb_s"):
        HardwareSpec.from_dict({**spec.__dict__, "device_bandwidth_gb_s": 0})


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
