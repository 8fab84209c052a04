"""Quality figures against their noise floor: the power calculation, paired by prompt, the
floor and minimum detectable difference of each figure, and the claims' verdicts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from edgespec.cuhlm.summary import quality_statistics
from edgespec.intervals import (
    detectable_difference,
    effect_sd,
    paired_effects,
    prompts_needed,
)
from edgespec.report import (
    CUHLM_REFERENCES,
    UNDECIDED,
    claim_verdict,
    decidable_line,
    headline_table,
    verdict_at_n,
)

Z95_80 = 1.959963984540054 + 0.8416212335729143  # z_0.975 + z_0.8


def test_detectable_difference_and_prompts_needed_by_hand():
    # (1.96 + 0.8416) * 0.1 / sqrt(100)
    assert detectable_difference(0.1, 100) == pytest.approx(0.02801585, abs=1e-8)
    # a 95% interval's half-width alone: power 0.5 leaves z_0.975
    assert detectable_difference(0.1, 100, power=0.5) == pytest.approx(0.0195996, abs=1e-7)
    assert detectable_difference(0.2, 25, level=0.9) == pytest.approx(
        (1.6448536 + 0.8416212) * 0.2 / 5, abs=1e-7
    )
    # ((2.8016 * 0.14) / 0.02)^2 = 384.6 -> 385 prompts; and it is the smallest such n
    assert prompts_needed(0.14, 0.02) == 385
    assert detectable_difference(0.14, 385) <= 0.02 < detectable_difference(0.14, 384)
    assert prompts_needed(0.0, 0.02) == 1
    assert math.isnan(detectable_difference(math.nan, 10))
    with pytest.raises(ValueError, match="difference"):
        prompts_needed(0.1, 0.0)
    with pytest.raises(ValueError, match="power"):
        detectable_difference(0.1, 10, power=1.0)


def test_paired_effects_of_a_ratio_and_of_a_difference():
    a = [0.8, 0.3, 0.7, 0.9, np.nan]
    b = [0.8, 0.6, 0.7, 0.9, 0.5]  # the NaN pair is dropped
    # R = 2.7 / 3.0 = 0.9, mean(b) = 0.75: e = (a - 0.9 b) / 0.75
    e = paired_effects(a, b)
    assert e == pytest.approx([0.08 / 0.75, -0.24 / 0.75, 0.07 / 0.75, 0.09 / 0.75])
    assert e.sum() == pytest.approx(0.0, abs=1e-12)
    assert paired_effects(a, b, relative=False) == pytest.approx([0.0, -0.3, 0.0, 0.0])
    # sqrt(sum(e^2) / 3) by hand: e^2 = 0.011378, 0.1024, 0.008711, 0.0144
    assert effect_sd(e) == pytest.approx(math.sqrt(0.136889 / 3), abs=1e-5)
    assert math.isnan(effect_sd([1.0]))
    with pytest.raises(ValueError, match="paired"):
        paired_effects([1.0, 2.0], [1.0])


def test_each_quality_figure_gets_its_floor_and_detectable_difference():
    scores = pd.DataFrame(
        {
            "variant": ["hlm"] * 4 + ["cuhlm_online"] * 4 + ["llm_only"] * 4,
            "prompt_id": ["p1", "p2", "p3", "p4"] * 3,
            "semantic_accuracy": [0.8, 0.6, 0.7, 0.9, 0.8, 0.3, 0.7, 0.9, 0.7, 0.6, 0.7, 0.9],
            "similarity_to_llm": [0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.0, 1.0, 1.0, 1.0, 1.0],
        }
    )
    table = quality_statistics(scores, lambda v, m: np.random.default_rng(0), 0.95, 400)
    online = table.set_index("variant").loc["cuhlm_online"]
    assert online["floor_semantic_accuracy"] == pytest.approx(0.75)  # HLM's mean, same prompts
    assert online["relative_semantic_accuracy"] == pytest.approx(0.9)
    assert online["relative_semantic_accuracy_n"] == 4
    sd = math.sqrt(0.136889 / 3)
    assert online["relative_semantic_accuracy_sd"] == pytest.approx(sd, abs=1e-5)
    assert online["relative_semantic_accuracy_mdd"] == pytest.approx(Z95_80 * sd / 2, abs=1e-5)
    # the similarity to LLM-only is taken against HLM's, the floor: 2.1 / 2.8
    assert online["floor_similarity_to_llm"] == pytest.approx(0.7)
    assert online["relative_similarity_to_llm"] == pytest.approx(2.1 / 2.8)
    # LLM-only's similarity to itself is no figure; the floor of HLM itself is HLM
    llm = table.set_index("variant").loc["llm_only"]
    assert math.isnan(llm["relative_similarity_to_llm"])
    hlm = table.set_index("variant").loc["hlm"]
    assert hlm["relative_semantic_accuracy"] == 1.0 and hlm["relative_semantic_accuracy_mdd"] == 0


@pytest.mark.parametrize(
    ("low", "high", "claim", "verdict"),
    [
        (0.90, 1.05, "at_least", UNDECIDED),  # covers the paper's 0.974 and the floor 1
        (0.975, 1.05, "at_least", "reproduced"),
        (0.80, 0.97, "at_least", "refuted"),
        (0.90, 0.974, "at_least", UNDECIDED),  # the paper's value on the edge
        (0.001, 0.009, "at_most", "reproduced"),  # a drop below 1 point
        (-0.01, 0.02, "at_most", UNDECIDED),
        (0.011, 0.03, "at_most", "refuted"),
        (math.nan, 1.0, "at_least", "n/a"),
    ],
)
def test_claim_verdicts(low, high, claim, verdict):
    paper = 0.974 if claim == "at_least" else 0.01
    assert claim_verdict(low, high, paper, claim) == verdict


def test_a_zero_width_interval_from_a_few_prompts_decides_nothing():
    """WISV's accuracy drop at the default size: the same exact-match outcome on all 8
    prompts gives the bootstrap interval [0, 0], inside "< 1 point", which is not a
    reproduction (3/8 would still be a 95% bound on the discordant rate)."""
    assert claim_verdict(0.0, 0.0, 0.01, "at_most") == "reproduced"
    assert verdict_at_n(0.0, 0.0, 0.01, "at_most", 8.0) == "undecided at n=8"
    assert verdict_at_n(0.001, 0.009, 0.01, "at_most", 400.0) == "reproduced"
    assert verdict_at_n(0.0, 0.0, 0.01, "at_most", math.nan) == "reproduced"  # no n: as given


def test_claim_verdict_rejects_an_unknown_claim():
    with pytest.raises(ValueError, match="claim"):
        claim_verdict(0.9, 1.0, 0.97, "about")


def _summary(relative_sim, sim_lo, sim_hi, relative_sem, sem_lo, sem_hi) -> pd.DataFrame:
    rows = []
    for variant in ("uhlm_risk_prone", "cuhlm_online"):
        rows.append(
            {
                "variant": variant,
                "channel": "rayleigh_snr10",
                "profile": "primary",
                "relative_similarity_to_llm": relative_sim,
                "relative_similarity_to_llm_lo": sim_lo,
                "relative_similarity_to_llm_hi": sim_hi,
                "floor_similarity_to_llm": 0.696,
                "relative_similarity_to_llm_n": 16,
                "relative_similarity_to_llm_mdd": 0.12,
                "relative_semantic_accuracy": relative_sem,
                "relative_semantic_accuracy_lo": sem_lo,
                "relative_semantic_accuracy_hi": sem_hi,
                "floor_semantic_accuracy": 0.6,
                "relative_semantic_accuracy_n": 300,
                "relative_semantic_accuracy_mdd": 0.015,
            }
        )
    return pd.DataFrame(rows)


def test_the_headline_never_prints_an_undecided_figure_without_saying_so():
    """U-HLM at 96% [88, 104] of its floor covers both 97.54% and 100%: undecided at n=16;
    CU-HLM at 99% [98, 100] keeps 97.4%: reproduced."""
    summary = _summary(0.96, 0.88, 1.04, 0.99, 0.98, 1.00)
    headline = headline_table(summary, {"primary": "measured"}).set_index("metric")
    uhlm = headline.loc["U-HLM: accuracy relative to LLM-only"]
    assert uhlm["ours"] == pytest.approx(96.0) and uhlm["floor"] == pytest.approx(100.0)
    assert uhlm["verdict"] == "undecided at n=16"
    assert uhlm["mdd"] == pytest.approx(12.0) and uhlm["n"] == 16
    cuhlm = headline.loc["CU-HLM: accuracy relative to HLM (semantic accuracy)"]
    assert cuhlm["verdict"] == "reproduced" and cuhlm["mdd"] == pytest.approx(1.5)
    # a figure this run did not measure says so
    assert headline.loc["CU-HLM: accuracy relative to HLM (HumanEval pass@1)", "verdict"] == "n/a"
    # delay figures carry no verdict
    assert pd.isna(headline.loc["U-HLM: token throughput vs HLM", "verdict"])
    line = decidable_line(headline.reset_index())
    assert "CU-HLM: accuracy relative to HLM (semantic accuracy): reproduced" in line
    assert "Undecided or not measured: 3 of 4 (their detectable differences 12.0-12.0 points)" in (
        line
    )
    assert "config/study.yaml" in line
    refuted = headline_table(_summary(0.80, 0.70, 0.90, 0.99, 0.98, 1.0), {"primary": "m"})
    assert refuted.set_index("metric").loc["U-HLM: accuracy relative to LLM-only", "verdict"] == (
        "refuted"
    )


def test_every_quality_reference_is_a_claim_on_a_relative_column():
    quality = [r for r in CUHLM_REFERENCES if r.claim]
    assert {r.column for r in quality} == {
        "relative_semantic_accuracy",
        "relative_pass_at_1",
        "relative_exact_match",
        "relative_similarity_to_llm",
    }
    assert all(r.claim == "at_least" and r.unit == "%" for r in quality)
