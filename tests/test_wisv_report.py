"""The WISV report builder (rule report_wisv, edgespec.wisv.report) on small constructed tables:
score files keyed by the decode they score, the prose from the stages' summaries, the heads'
table, the ablation, the FH-against-SH curves."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from wisv_tables import costs, scores

from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.figures import HEAD_LABELS, latency_curves, policy_curves, tau_curves
from edgespec.wisv.policy import breakdown_table, label_mobility, policy_verdict, trend
from edgespec.wisv.regimes import Pricing
from edgespec.wisv.report import (
    HEAD_NAMES,
    RegimeInputs,
    ReportInputs,
    heads_table,
    parse_stem,
    read_scores,
    report_markdown,
)
from edgespec.wisv.summary import headline, summarise

EVALUATION = {
    "seed_interval": 0.9,
    "bootstrap_interval": 0.95,
    "bootstrap_samples": 200,
    "fading_seeds": 3,
}
WISV = {"correlation": 0.8, "csi_decode_seeds": [0], "hidden_bits": 16}
PROFILE = LatencyProfile(
    draft_token_s=0.01, target_token_s=0.02, target_verify_s={4: 0.05}, source="given"
)


@pytest.fixture(scope="module")
def costs_table():
    blind = ("vanilla_sd", "head_no_csi", "head_relabel_no_csi")
    latency = {k: {s: (1.0 + 0.1 * (k + s), 2.0 + 0.1 * s) for s in range(3)} for k in range(3)}
    frames = []
    for regime in ("measured", "testbed"):
        frames += [costs(v, range(3), latency[k], regime=regime) for k, v in enumerate(blind)]
        frames.append(costs("wisv_fh", [0], {0: (0.6, 1.5)}, regime=regime))
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def summary(costs_table):
    blind = ("vanilla_sd", "head_no_csi", "head_relabel_no_csi")
    texts = [scores(v, "any", [1.0, 0.0]) for v in blind]
    texts += [scores("wisv_fh", "poor", [1.0, 0.0], regime=r) for r in ("measured", "testbed")]
    return summarise(costs_table, pd.concat(texts), seed=3, evaluation=EVALUATION)


def _tau_table(taus):
    return {"tau": list(taus), "accept_rate": [0.5, 0.0], "unsafe_accept_rate": [0.1, 0.0]}


HEAD = {
    "wisv_head": {
        "val_auc": 0.71,
        "tau": 0.62,
        "val_accept_rate": 0.4,
        "val_unsafe_accept_rate": 0.03,
    },
    "no_csi_head": {
        "val_auc": 0.55,
        "tau": 0.9,
        "val_accept_rate": 0.1,
        "val_unsafe_accept_rate": 0.0,
    },
    "relabel_no_csi_head": {
        "val_auc": 0.6,
        "tau": 0.8,
        "val_accept_rate": 0.2,
        "val_unsafe_accept_rate": 0.01,
    },
    "validation": {
        "prompts": ["a", "b", "c"],
        "mismatches": 9,
        "important": 4,
        "csi_states": 6,
        "max_accuracy_drop": 0.05,
    },
    "accept_rate_by_channel": {"good": 0.25, "poor": 0.5},
    **{f"tau_table_{k}": _tau_table((0.3, 1.0)) for k in HEAD_NAMES},
    "heldout_auc": {"wisv_head": {"auc": 0.7, "auc_lo": 0.55, "auc_hi": 0.85}},
    "accept_by_state": {"repair_cost": [1.2, 1.5, 1.7], "accept_rate": [0.2, 0.3, 0.5]},
    "learning_curve": {
        "no_csi_head": {"share": [0.5, 1.0], "mismatches": [4, 8], "auc": [0.5, 0.6]}
    },
}
HEAD_TIMES = {
    "head_round_s": {"wisv_head": 3e-4, "no_csi_head": 1e-4, "relabel_no_csi_head": 2e-4},
    "head_time_source": "given",
    "head_time_gamma": 4,
}
LABELS = {
    "prompts": 8,
    "answer_task_prompts": 5,
    "mismatches": 12,
    "important": 3,
    "safe": 9,
    "criterion": {"answer": 4, "similarity": 8, "answer_task_fallback": 2},
    "label_max_new_tokens": 16,
}
RELABEL = {
    "csi_samples": 4,
    "ranges": {"bandwidth_hz": [1e6, 2e7], "snr_db": [0.0, 20.0], "rtt_s": [0.01, 0.05]},
    "repair_cost_rounds": [1.1712, 1.6871],
    "round_compute_s": 0.064,
    "lam_rounds_per_risk": 2.0,
    "risk_budget": None,
    "safe_before": 0.25,
    "safe_best_channel": 1 / 3,
    "safe_worst_channel": 0.375,
}
PROVENANCE = {
    "preset": "tiny_random",
    "description": "a tiny pair",
    "models": {"target": {"logits_size": 61}, "draft": {"hidden_size": 32}},
}
PRECISION = {"dtype": "float32", "reason": "configured", "machine": {"cpu_count": 2}}
SAFE = pd.DataFrame({"csi_sample": [0, 1, 2], "repair_cost": [1.2, 1.5, 1.7]})
SAFE = SAFE.assign(safe_fraction=[0.25, 0.25, 0.25])
RISKS = np.array([0.0, 0.0, 1.0, 0.2, 0.7, 0.8, 1.0, 0.0, 0.0, 0.1, 0.0, 0.0])


def _pricing(regime: str, profile: LatencyProfile = PROFILE) -> Pricing:
    protocol = {"vocab_size": 61, "hidden_size": 32, "bits_per_value": 16}
    return Pricing(regime, profile, protocol, HEAD_TIMES, f"{regime} pricing")


REGIME = {
    regime: RegimeInputs(_pricing(regime), HEAD, RELABEL, SAFE)
    for regime in ("measured", "testbed")
}
INPUTS = ReportInputs(LABELS, RISKS, PROVENANCE, PRECISION, None, REGIME)


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_the_report_states_each_stages_numbers(summary, costs_table):
    text = report_markdown(
        summary, headline(summary), breakdown_table(costs_table), INPUTS, WISV, EVALUATION
    )
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    regime_titles = [
        "measured profile (this machine)",
        "emulated testbed (the paper's hardware class)",
    ]
    assert titles == [
        "## Against the paper's numbers (best setting, same definitions)",
        "## The two regimes side by side",
        "## Does the policy move with the channel?",
        "## Labels",
        *[f"## {t}" for t in regime_titles],
        "## Every regime, variant, channel and gamma",
    ]
    assert text.startswith("# WISV: measured results\n\nModel pair: a tiny pair.")
    assert "measured pricing; testbed pricing. The paper's figures belong to the testbed" in text
    assert "priced under 3 seeds" in text and "decoded under seeds [0] of the same draws" in text
    assert "the 90% interval over seeds" in text and "the 95% percentile bootstrap" in text
    assert "Decoding precision: **float32** (configured" in text
    side = _section(text, "The two regimes side by side")
    assert "| repair cost C_rep (rounds) | 1.200-1.700 | 1.200-1.700 |" in side
    # Risks in (1.2 / 2, 1.7 / 2] = (0.6, 0.85]: 0.7 and 0.8.
    assert "| risks the channel can flip | 2 of 12 | 2 of 12 |" in side
    assert "| head accept rate best / worst channel | 0.200 / 0.500 | 0.200 / 0.500 |" in side
    assert "| held-out AUC, CSI head | 0.700 (0.550, 0.850) |" in side
    policy = _section(text, "Does the policy move with the channel?")
    assert (
        "the safe fraction goes from 0.250 at the cheapest sample to 0.250 at the dearest" in policy
    )
    assert "Why the labels do not move" in policy and "2 lie in (0.600, 0.850]" in policy
    labels = _section(text, "Labels")
    assert (
        "12 mismatches mined from 8 calibration prompts (5 with a gold answer), 3 important"
        in labels
    )
    assert "Risks: 6 at 0, 2 at 1, 4 graded" in labels and "a demonstration" in labels
    assert "4 labels from the stated answers, 8 from the similarity (2 of them" in labels
    testbed = _section(text, regime_titles[1])
    assert "costs 1.171-1.687 rounds of T_0 = 0.064 s" in testbed
    assert "lambda = 2 rounds per unit risk, risk budget None" in testbed
    assert (
        "the same 9 original validation mismatches (4 important) of 3 held-out prompts" in testbed
    )
    assert "each mismatch scored once (the CSI head's q averaged over the 6 CSI samples)" in testbed
    assert (
        "| wisv_fh / wisv_sh (CSI, relabeled labels) | 0.71 | 0.700 (0.550, 0.850) | 0.62"
        in testbed
    )
    ablation = testbed.split("### What reading the CSI adds")[1]
    rows = [line.split(" | ")[1] for line in ablation.splitlines() if line.startswith("| ")][1:]
    assert rows == ["head_no_csi", "head_relabel_no_csi", "wisv_fh"]
    breakdown = testbed.split("### Latency breakdown")[1].split("###")[0]
    assert "| prefill | draft | uplink | RTT |" in breakdown
    every = _section(text, "Every regime, variant, channel and gamma")
    assert "| testbed | vanilla_sd | poor | 4 | 3 |" in every and "| AAL |" in every
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_label_mobility_trend_and_verdict_hand_computed():
    m = label_mobility(RISKS, [1.2, 1.7, 1.5], 2.0)
    assert m["movable"] == 2 and m["risk_graded"] == 4 and m["repair_bar"] == [0.6, 0.85]
    t = trend([1.2, 1.7, 1.5], [0.1, 0.4, 0.2])
    assert t == {"spearman": pytest.approx(1.0), "at_best": 0.1, "at_worst": 0.4}
    moving = SAFE.assign(safe_fraction=[0.1, 0.2, 0.4])
    text = policy_verdict("testbed", moving, None, m, RELABEL)
    assert "from 0.100 at the cheapest sample to 0.400 at the dearest (Spearman 1.00" in text
    assert "Why" not in text


def test_breakdown_adds_up_by_part(costs_table):
    table = breakdown_table(costs_table)
    parts = table[["prefill_s", "draft_s", "uplink_s", "rtt_s", "verify_s", "head_s"]]
    parts = parts.join(table[["retransmission_s", "downlink_s"]])
    np.testing.assert_allclose(parts.sum(axis=1), table["latency_s"])
    row = table[(table["regime"] == "testbed") & (table["variant"] == "wisv_fh")].iloc[0]
    assert row["latency_s"] == pytest.approx((0.6 + 1.5) / 2)


def test_heads_table_and_tau_curves():
    table = heads_table(HEAD, HEAD_TIMES)
    assert list(table["head"]) == list(HEAD_NAMES.values())
    assert list(table["tau"]) == [0.62, 0.8, 0.9]
    assert list(table["time per round (s)"]) == [3e-4, 2e-4, 1e-4]
    tables, chosen = tau_curves({"testbed": HEAD})
    label = f"testbed: {HEAD_LABELS['no_csi_head']}"
    assert chosen[label] == 0.9 and list(tables[label]["tau"]) == [0.3, 1.0]
    curves = policy_curves({"testbed": SAFE}, {"testbed": HEAD})
    np.testing.assert_allclose(curves["testbed"]["accept"][1], [0.2, 0.3, 0.5])


def test_score_files_are_keyed_by_the_decode_they_score(tmp_path):
    paths = []
    stems = (
        "testbed/wisv/g4/poor/s1",
        "vanilla_sd/g4/any",
        "topk_accept/g8/any",
        "measured/head_relabel_no_csi/g4/any",
    )
    for stem in stems:
        path = tmp_path / "results" / "wisv" / "scores" / f"{stem}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"prompt_id": ["a", "b"], "exact_match": [1.0, 0.0]}).to_parquet(path)
        paths.append(str(path))
    assert parse_stem("testbed/wisv/g8/good/s2") == {
        "regime": "testbed",
        "variant": "wisv",
        "gamma": 8,
        "channel": "good",
        "seed": 2,
    }
    scores = read_scores(paths, ["vanilla_sd", "wisv_sh", "topk_accept", "head_relabel_no_csi"])
    keys = scores[["regime", "variant", "channel", "gamma", "fading_index"]].drop_duplicates()
    assert sorted(map(tuple, keys.to_numpy().tolist())) == [
        ("any", "topk_accept", "any", 8, -1),
        ("any", "vanilla_sd", "any", 4, -1),
        ("measured", "head_relabel_no_csi", "any", 4, -1),
        ("testbed", "wisv_sh", "poor", 4, 1),
    ]
    assert len(scores) == 8


def test_fh_against_sh_priced_over_the_snr_sweep():
    """Two prompts' rounds (gain 1), priced by hand: FH uploads 4 ids and 4 hidden states,
    SH 4 ids and, in a round with m mismatches, m hidden states after one more round trip."""
    rounds = pd.DataFrame(
        {
            "prompt_id": ["a", "a", "b"],
            "round": [0, 1, 0],
            "num_drafted": 4,
            "num_mismatches": [0, 2, 1],
            "draft_forwards": 5,
            "prompt_tokens": [10, 10, 4],
            "gain": 1.0,
        }
    )
    channels = {
        "poor": {
            "name": "poor",
            "fading": "rayleigh",
            "bandwidth_hz": 1e6,
            "snr_db": 5.0,
            "rtt_s": 0.03,
        }
    }
    snrs = np.array([0.0, 10.0])
    profile = LatencyProfile(
        draft_token_s=0.01,
        target_token_s=0.02,
        target_verify_s={4: 0.05},
        draft_prefill_token_s=0.001,
        target_prefill_token_s=0.002,
    )
    pricing = {"testbed": _pricing("testbed", profile)}
    curves, note = latency_curves({"testbed": rounds}, channels, pricing, snrs)
    assert note == "WISV rounds at gamma=4 priced at each SNR (one fading seed)"
    fh_label, sh_label = "testbed: FH, W 1 MHz, RTT 30 ms", "testbed: SH, W 1 MHz, RTT 30 ms"
    assert list(curves) == [fh_label, sh_label]
    # Five draft forwards a round; the WISV head's 0.3 ms in the two rounds with a mismatch;
    # the prefill of 10 and 4 prompt tokens at 3 ms each, once per answer.
    compute, rtt, hidden, ids = 5 * 0.01 + 0.05, 0.03, 32 * 16, 4 * 6
    fixed = 2 * 3e-4 + 14 * 0.003
    for k, snr in enumerate(snrs):
        rate = 1e6 * math.log2(1 + 10 ** (snr / 10))
        fh = 3 * (compute + (ids + 4 * hidden) / rate + rtt) + fixed
        sh = 3 * (compute + ids / rate + rtt) + 3 * hidden / rate + 2 * rtt + fixed
        assert curves[fh_label][1][k] == pytest.approx(fh / 2)
        assert curves[sh_label][1][k] == pytest.approx(sh / 2)
    assert latency_curves({}, channels, pricing) == ({}, "no WISV variant configured")
