"""The WISV report builder (rule report_wisv, edgespec.wisv.report) on small constructed tables:
score files keyed by the decode they score, the prose from the stages' summaries, the heads'
table, the ablation, the FH-against-SH curves."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from wisv_tables import costs, scores

from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.report import (
    HEAD_NAMES,
    ReportInputs,
    heads_table,
    latency_curves,
    read_scores,
    report_markdown,
    tau_curves,
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
def summary():
    blind = ("vanilla_sd", "head_no_csi", "head_relabel_no_csi")
    latency = {k: {s: (1.0 + 0.1 * (k + s), 2.0 + 0.1 * s) for s in range(3)} for k in range(3)}
    frames = [costs(v, range(3), latency[k]) for k, v in enumerate(blind)]
    frames.append(costs("wisv_fh", [0], {0: (0.6, 1.5)}))
    texts = [scores(v, "any", [1.0, 0.0]) for v in blind] + [scores("wisv_fh", "poor", [1.0, 0.0])]
    return summarise(pd.concat(frames), pd.concat(texts), seed=3, evaluation=EVALUATION)


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
INPUTS = ReportInputs(HEAD, HEAD_TIMES, LABELS, RELABEL, PROVENANCE, PRECISION, None, PROFILE)


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_the_report_states_each_stages_numbers(summary):
    text = report_markdown(summary, headline(summary), INPUTS, WISV, EVALUATION)
    titles = [line for line in text.splitlines() if line.startswith("#")]
    assert titles == [
        "# WISV: measured results",
        "## Against the paper's numbers (best setting, same definitions)",
        "## Labels",
        "## Relabeling",
        "## Decision heads",
        "## What reading the CSI adds (same protocol FH, same tau budget)",
        "## Every variant, channel and gamma",
    ]
    assert text.startswith(
        "# WISV: measured results\n\nModel pair: a tiny pair. Compute times: given"
    )
    assert "priced under 3 seeds" in text and "decoded under seeds [0] of the same draws" in text
    assert "the 90% interval over seeds" in text and "the 95% percentile bootstrap" in text
    assert "Decoding precision: **float32** (configured" in text
    labels = _section(text, "Labels")
    assert (
        "12 mismatches mined from 8 calibration prompts (5 with a gold answer), 3 important"
        in labels
    )
    assert "Label budget 16 tokens" in labels
    assert "4 labels from the stated answers, 8 from the similarity (2 of them" in labels
    relabel = _section(text, "Relabeling")
    assert "bandwidth 1-20 MHz, SNR 0-20 dB, RTT 10-50 ms" in relabel
    assert "costs 1.171-1.687 rounds of T_0 = 0.064 s" in relabel
    assert "lambda = 2 rounds per unit risk, risk budget None" in relabel
    assert "0.250 before relabeling, 0.333 at the best CSI sample, 0.375 at the worst" in relabel
    heads = _section(text, "Decision heads")
    assert "the same 9 original validation mismatches (4 important) of 3 held-out prompts" in heads
    assert "(0.05 accepted important risk per mismatch; the CSI head averaged over the 6" in heads
    assert "Head time: given, gamma = 4." in heads
    assert (
        "| wisv_fh / wisv_sh (CSI, relabeled labels) | 0.71 | 0.62 | 0.4 | 0.03 | 0.0003 |" in heads
    )
    assert "at each channel's mean state: good 0.250, poor 0.500." in heads
    ablation = _section(text, "What reading the CSI adds")
    rows = [line.split(" | ")[0] for line in ablation.splitlines() if line.startswith("| ")][1:]
    assert rows == ["| head_no_csi", "| head_relabel_no_csi", "| wisv_fh"]
    assert "| semantic drop (points) |" in ablation and "| AAL |" not in ablation
    every = _section(text, "Every variant, channel and gamma")
    assert "| vanilla_sd | poor | 4 | 3 |" in every and "| AAL |" in every
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_heads_table_and_tau_curves():
    table = heads_table(HEAD, HEAD_TIMES)
    assert list(table["head"]) == list(HEAD_NAMES.values())
    assert list(table["tau"]) == [0.62, 0.8, 0.9]
    assert list(table["time per round (s)"]) == [3e-4, 2e-4, 1e-4]
    tables, chosen = tau_curves(HEAD)
    assert chosen == {HEAD_NAMES[k]: HEAD[k]["tau"] for k in HEAD_NAMES}
    assert list(tables[HEAD_NAMES["no_csi_head"]]["tau"]) == [0.3, 1.0]


def test_score_files_are_keyed_by_the_decode_they_score(tmp_path):
    paths = []
    for stem in ("wisv/g4/poor/s1", "vanilla_sd/g4/any", "topk_accept/g8/any"):
        path = tmp_path / "results" / "wisv" / "scores" / f"{stem}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"prompt_id": ["a", "b"], "exact_match": [1.0, 0.0]}).to_parquet(path)
        paths.append(str(path))
    scores = read_scores(paths, ["vanilla_sd", "wisv_sh", "topk_accept"])
    keys = scores[["variant", "channel", "gamma", "fading_index"]].drop_duplicates()
    assert sorted(map(tuple, keys.to_numpy().tolist())) == [
        ("topk_accept", "any", 8, -1),
        ("vanilla_sd", "any", 4, -1),
        ("wisv_sh", "poor", 4, 1),
    ]
    assert len(scores) == 6


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
    inputs = dataclasses.replace(INPUTS, profile=profile)
    curves, note = latency_curves(rounds, channels, inputs, 16, snrs)
    assert note == "WISV rounds at gamma=4 priced at each SNR (one fading seed)"
    assert list(curves) == ["FH, W 1 MHz, RTT 30 ms", "SH, W 1 MHz, RTT 30 ms"]
    # Five draft forwards a round; the WISV head's 0.3 ms in the two rounds with a mismatch;
    # the prefill of 10 and 4 prompt tokens at 3 ms each, once per answer.
    compute, rtt, hidden, ids = 5 * 0.01 + 0.05, 0.03, 32 * 16, 4 * 6
    fixed = 2 * 3e-4 + 14 * 0.003
    for k, snr in enumerate(snrs):
        rate = 1e6 * math.log2(1 + 10 ** (snr / 10))
        fh = 3 * (compute + (ids + 4 * hidden) / rate + rtt) + fixed
        sh = 3 * (compute + ids / rate + rtt) + 3 * hidden / rate + 2 * rtt + fixed
        assert curves["FH, W 1 MHz, RTT 30 ms"][1][k] == pytest.approx(fh / 2)
        assert curves["SH, W 1 MHz, RTT 30 ms"][1][k] == pytest.approx(sh / 2)
    assert latency_curves(None, channels, INPUTS, 16) == ({}, "no WISV variant configured")
