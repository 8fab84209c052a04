"""CU-HLM figures with their spread: gains per fading seed, seed intervals, prompt bootstraps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edgespec.cuhlm.summary import (
    quality_statistics,
    seed_relative,
    seed_summary,
    summary_table,
    token_statistics,
)
from edgespec.intervals import seed_interval
from edgespec.wireless.payload import upload_bits

VOCAB = 61


def _metrics():
    """Two variants, one channel, one profile, five seeds: HLM's throughput swings with the
    fading draw and the other variant's follows it at exactly 3x (common random numbers)."""
    hlm = np.array([1.0, 2.0, 0.5, 4.0, 1.5])
    rows = []
    for seed, t in enumerate(hlm):
        for variant, factor in (("hlm", 1.0), ("cuhlm_offline", 3.0)):
            rows.append(
                {
                    "variant": variant,
                    "channel": "rayleigh_snr10",
                    "fading": "rayleigh",
                    "snr_db": 10.0,
                    "profile": "primary",
                    "seed": seed,
                    "throughput_tps": factor * t,
                    "mean_token_latency_s": 1 / (factor * t),
                    "end_to_end_latency_s": 10 / (factor * t),
                }
            )
    return pd.DataFrame(rows)


def test_gain_is_taken_per_seed_then_summarised():
    """With common random numbers the per-seed gain is exactly 3 whatever the draw; a ratio of
    medians (or of independent draws) would not be."""
    relative = seed_relative(_metrics())
    offline = relative[relative["variant"] == "cuhlm_offline"]
    assert np.allclose(offline["throughput_gain"], 3.0)
    assert np.allclose(offline["latency_ratio"], 1 / 3)
    summary = seed_summary(relative, 0.9).set_index("variant")
    row = summary.loc["cuhlm_offline"]
    assert (row["throughput_gain"], row["throughput_gain_lo"], row["throughput_gain_hi"]) == (
        pytest.approx(3.0),
        pytest.approx(3.0),
        pytest.approx(3.0),
    )
    expected = seed_interval(3 * np.array([1.0, 2.0, 0.5, 4.0, 1.5]), 0.9)
    assert row["throughput_tps"] == pytest.approx(expected.point)
    assert row["throughput_tps_lo"] == pytest.approx(expected.low)
    assert row["throughput_tps_hi"] == pytest.approx(expected.high)
    assert row["fading_seeds"] == 5 and row["throughput_tps_lo"] < row["throughput_tps_hi"]
    with pytest.raises(KeyError, match="reference"):
        seed_relative(_metrics(), reference="llm_only")


def _tokens():
    """Prompt a: 3 tokens (1 skipped, 2 uploaded k = 4 and |V|), prompt b: 2 tokens uploaded."""
    return pd.DataFrame(
        {
            "prompt_id": ["a", "a", "a", "b", "b"],
            "position": [0, 1, 2, 0, 1],
            "uploaded": [False, True, True, True, True],
            "skipped": [True, False, False, False, False],
            "k": [0, 4, VOCAB, 4, 4],
            "accepted": [True, True, False, True, True],
            "accept_prob": [0.8, 0.9, 0.1, 1.0, 1.0],
            "measured_tvd": [0.0, 0.2, 0.0, 0.1, 0.3],
            "output_tvd": [0.0, 0.1, 0.0, 0.05, 0.05],
        }
    )


def test_token_statistics_point_estimates_and_bootstrap():
    stats = token_statistics(
        _tokens(), VOCAB, 8, lambda m: np.random.default_rng(len(m)), 0.95, 500
    )
    assert stats["skip_rate"] == pytest.approx(1 / 5)
    assert stats["transmission_rate"] == pytest.approx(4 / 5)
    assert stats["true_skip_rate"] == pytest.approx(0.8)
    assert stats["mean_k"] == pytest.approx((4 + VOCAB + 4 + 4) / 4)
    assert stats["vocab_compression"] == pytest.approx(1 - stats["mean_k"] / VOCAB)
    assert stats["measured_tvd_mean"] == pytest.approx(0.6 / 4)
    assert stats["output_tvd_mean"] == pytest.approx(0.2 / 4)
    assert stats["acceptance_rate"] == pytest.approx(3 / 4)
    bits = upload_bits(np.array([4, VOCAB, 4, 4]), VOCAB, 8).sum()
    assert stats["uplink_bytes_per_token"] == pytest.approx(bits / 8 / 5)
    # Two prompts: the bootstrap resamples {a, b}; its interval spans the two prompts' values.
    assert stats["skip_rate_lo"] == pytest.approx(0.0)
    assert stats["skip_rate_hi"] == pytest.approx(1 / 3)
    assert (
        stats["vocab_compression_lo"] <= stats["vocab_compression"] <= stats["vocab_compression_hi"]
    )


def test_quality_ratios_are_paired_by_prompt():
    scores = pd.DataFrame(
        {
            "variant": ["hlm"] * 4 + ["cuhlm_online"] * 4,
            "prompt_id": ["p1", "p2", "p3", "p4"] * 2,
            "exact_match": [1.0, 0.0, 1.0, np.nan, 1.0, 0.0, 0.0, np.nan],
            "semantic_accuracy": [0.8, 0.6, 0.7, 0.9, 0.8, 0.3, 0.7, 0.9],
        }
    )
    table = quality_statistics(scores, lambda v, m: np.random.default_rng(0), 0.95, 400).set_index(
        "variant"
    )
    online = table.loc["cuhlm_online"]
    assert online["exact_match"] == pytest.approx(1 / 3)
    assert online["relative_exact_match"] == pytest.approx(0.5)
    assert online["relative_semantic_accuracy"] == pytest.approx(2.7 / 3.0)
    assert online["relative_semantic_accuracy_lo"] < 2.7 / 3.0 < 1.0
    assert online["relative_semantic_accuracy_hi"] == pytest.approx(1.0)
    assert table.loc["hlm", "relative_semantic_accuracy"] == pytest.approx(1.0)


def test_summary_table_joins_every_source():
    metrics = _metrics()
    tokens = {
        "hlm": _tokens().assign(k=np.where(_tokens()["uploaded"], VOCAB, 0)),
        "cuhlm_offline": _tokens(),
    }
    scores = pd.DataFrame(
        {
            "variant": ["hlm", "hlm", "cuhlm_offline", "cuhlm_offline"],
            "prompt_id": ["a", "b", "a", "b"],
            "semantic_accuracy": [0.5, 0.7, 0.4, 0.7],
        }
    )
    table = summary_table(metrics, tokens, scores, VOCAB, 8, 3, 0.9, 0.95, 300)
    assert set(table["variant"]) == {"hlm", "cuhlm_offline"} and len(table) == 2
    for column in ("throughput_gain", "skip_rate", "relative_semantic_accuracy"):
        assert {column, f"{column}_lo", f"{column}_hi"} <= set(table.columns)
    again = summary_table(metrics, tokens, scores, VOCAB, 8, 3, 0.9, 0.95, 300)
    pd.testing.assert_frame_equal(table, again)  # seeded bootstraps
