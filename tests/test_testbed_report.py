"""Testbed against simulator, the torch-free half: the simulator's prediction for the testbed's
own tables term by term (against hand-computed delays), the bytes the wire must carry, the
measured terms, the per-method summary, and the testbed's config checks."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest

from edgespec.config import ConfigError, check_testbed_settings, validate_config
from edgespec.testbed.messages import WireSpec
from edgespec.testbed.predict import (
    expected_wire_rounds,
    expected_wire_tokens,
    predict_rounds,
    predict_tokens,
)
from edgespec.testbed.summary import measured_terms, reason, summarise
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

VOCAB, HIDDEN, GAMMA = 1000, 8, 4  # ids of 10 bits
AWGN = ChannelCondition("flat", "awgn", bandwidth_hz=1e6, snr_db=0.0, rtt_s=0.05)  # 1 Mbit/s
PROFILE = LatencyProfile(
    draft_token_s=0.01,
    target_token_s=0.1,
    target_verify_s={4: 0.2},
    uncertainty_s=0.002,
    online_k_s=0.003,
    topk_s={1: 0.004},
)


def _tokens():
    return pd.DataFrame(
        {
            "method": "cuhlm_online",
            "channel": "flat",
            "prompt_id": ["a", "a", "a", "b"],
            "position": [0, 1, 2, 0],
            "uploaded": [True, False, True, True],
            "skipped": [False, True, False, False],
            "k": [4, 0, 2, 1],
            "resync": [0, 0, 1, 0],
        }
    )


def test_the_tokenwise_prediction_is_the_delay_model_term_by_term():
    """cuhlm_online, |V| = 1000 (10-bit ids), 8-bit probabilities, 1 Mbit/s: an upload of k
    entries takes 18 k us; each token pays tau_SLM + tau_unc, each upload online k(t), the
    top-k (4 ms, constant) and tau_LLM + RTT."""
    got = predict_tokens(_tokens(), "cuhlm_online", AWGN, PROFILE, VOCAB, 8, 7, 0)
    a = got.set_index("prompt_id").loc["a"]
    assert a["model_device_s"] == pytest.approx(3 * 0.012 + 2 * (0.003 + 0.004))
    assert a["model_edge_s"] == pytest.approx(2 * 0.1)
    assert a["model_rtt_s"] == pytest.approx(2 * 0.05)
    assert a["model_uplink_s"] == pytest.approx((4 + 2) * 18 / 1e6)
    parts = ["model_device_s", "model_edge_s", "model_rtt_s", "model_uplink_s"]
    assert a["model_e2e_s"] == pytest.approx(a[parts].sum())
    assert list(got["prompt_id"]) == ["a", "b"]


def _rounds():
    return pd.DataFrame(
        {
            "variant": "wisv_sh",
            "method": "wisv_sh",
            "channel": "flat",
            "condition": "flat",
            "prompt_id": ["a", "a", "b"],
            "prompt_tokens": [5, 5, 7],
            "round": [0, 1, 0],
            "num_drafted": GAMMA,
            "num_accepted": [4, 1, 2],
            "num_committed": [5, 2, 3],
            "num_mismatches": [0, 2, 1],
            "num_semantic_accepts": 0,
            "gain": 1.0,
            "rate_bps": 1e6,
        }
    )


def test_the_round_prediction_charges_shs_extra_trip_and_the_head_where_it_runs():
    params = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "bits_per_value": 16}
    got = predict_rounds(_rounds(), "wisv_sh", AWGN, PROFILE, params, GAMMA, 0.03, 7, 0)
    a = got.set_index("prompt_id").loc["a"]
    # SH keeps hidden states: gamma + 1 draft forwards a round (the last token's state)
    assert a["model_device_s"] == pytest.approx(2 * (GAMMA + 1) * 0.01)
    assert a["model_edge_s"] == pytest.approx(2 * 0.2 + 0.03)  # the head: the round with m > 0
    assert a["model_rtt_s"] == pytest.approx(3 * 0.05)  # the second round takes two trips
    assert a["model_uplink_s"] == pytest.approx((2 * 40 + 2 * HIDDEN * 16) / 1e6)
    wrong = _rounds().assign(gain=0.5)
    with pytest.raises(ValueError, match="other gains"):
        predict_rounds(wrong, "wisv_sh", AWGN, PROFILE, params, GAMMA, 0.03, 7, 0)


def test_the_wire_must_carry_the_models_bits_plus_header_control_and_padding():
    spec = WireSpec(VOCAB, 8)
    tokens = expected_wire_tokens(_tokens(), spec).set_index("prompt_id")
    # upload k = 4: 72 model bits + d, k, r (10 + 10 + 16) = 108 bits -> 14 bytes + 16
    # upload k = 2 with one resync id: 36 + 36 + 10 = 82 bits -> 11 bytes + 16
    assert tokens.loc["a", "wire_up_bytes"] == (16 + 14) + (16 + 11)
    assert tokens.loc["a", "model_up_bits"] == 72 + 36
    assert tokens.loc["a", "wire_down_bytes"] == 2 * (16 + 2)
    params = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "bits_per_value": 16}
    rounds = expected_wire_rounds(_rounds(), "wisv_sh", params).set_index("prompt_id")
    # ids 40 bits -> 5 bytes; 2 hidden states 256 bits -> 32 bytes; verdict 3 + 10 bits -> 2
    # bytes; the mask 4 bits -> 1 byte
    assert rounds.loc["a", "wire_up_bytes"] == 2 * (16 + 5) + (16 + 32)
    assert rounds.loc["a", "wire_down_bytes"] == 2 * (16 + 2) + (16 + 1)
    assert rounds.loc["a", "units"] == 2


def _answers(method="hlm", e2e=(1.0, 2.0)):
    n = len(e2e)
    return pd.DataFrame(
        {
            "method": method,
            "channel": "flat",
            "prompt_id": [f"p{i}" for i in range(n)],
            "tokens": [[1, 2]] * n,
            "num_tokens": 2,
            "stopped": "answer",
            "e2e_s": list(e2e),
            "device_compute_s": 0.2,
            "device_uncertainty_s": 0.1,
            "device_serialise_s": 0.05,
            "edge_compute_s": 0.3,
            "edge_serialise_s": 0.05,
        }
    )


def _frames(n=2):
    rows = []
    for i in range(n):
        for kind, direction in (("PROMPT", "up"), ("TOKEN_UP", "up"), ("TOKEN_VERDICT", "down")):
            rows.append(
                {
                    "method": "hlm",
                    "channel": "flat",
                    "prompt_id": f"p{i}",
                    "kind": kind,
                    "direction": direction,
                    "bytes": 100,
                    "tx_s": 0.25 if direction == "up" else 0.0,
                    "retx_s": 0.01,
                    "prop_s": 0.02,
                }
            )
    return pd.DataFrame(rows)


def test_measured_terms_add_up_and_leave_out_hlms_analysis_only_uncertainty():
    """HLM's device computes u only to keep the single-process draws; its time leaves the
    latency. The PROMPT frame is before the timed decode."""
    got = measured_terms(_answers(), _frames())
    first = got.iloc[0]
    assert first["e2e_s"] == pytest.approx(0.9)
    assert first["uplink_s"] == 0.25 and first["rtt_s"] == pytest.approx(0.04)
    assert first["retransmit_s"] == pytest.approx(0.02)
    terms = ["device_s", "edge_s", "serialise_s", "uplink_s", "retransmit_s", "rtt_s", "other_s"]
    assert first[terms].sum() == pytest.approx(first["e2e_s"])
    online = measured_terms(_answers("cuhlm_online"), _frames().assign(method="cuhlm_online"))
    assert online.iloc[0]["e2e_s"] == 1.0 and online.iloc[0]["device_s"] == pytest.approx(0.3)
    # every token skipped: the edge's clock never ran and no timed frame crossed the link
    idle = _answers("cuhlm_online").drop(columns="edge_compute_s")
    quiet = measured_terms(idle, _frames().iloc[:0]).iloc[0]
    assert quiet["edge_s"] == 0.0 and quiet["uplink_s"] == 0.0 and quiet["rtt_s"] == 0.0
    assert quiet["other_s"] == pytest.approx(1.0 - 0.3 - 0.1)


def test_the_summary_names_the_term_that_differs_most():
    per = measured_terms(_answers(e2e=(1.1, 1.3, 1.2)), _frames(3))
    model = {"device_s": 0.2, "edge_s": 0.3, "uplink_s": 0.25, "rtt_s": 0.04}
    for term in ("serialise_s", "retransmit_s", "other_s"):
        model[term] = 0.0
    per = per.assign(**{f"model_{k}": v for k, v in model.items()}, model_e2e_s=0.4)
    per["ratio"] = per["e2e_s"] / per["model_e2e_s"]
    per = per.assign(
        units=1, link_up_bytes=100, model_up_bits=640, wire_up_bytes=100, link_down_bytes=100,
        model_down_bits=80, bytes_equal=True, tokens_equal=True,
    )  # fmt: skip
    row = summarise(per, 3).iloc[0]
    assert row["ratio"] == pytest.approx(np.mean([1.0, 1.2, 1.1]) / 0.4)
    assert row["ratio_lo"] <= row["ratio"] <= row["ratio_hi"]
    assert not row["near_one"]
    assert row["main_term"] == "other"  # the unmodelled rest: 1.1 - 0.91 s per answer
    assert row["overhead_bytes_per_unit"] == pytest.approx(100 - 80)
    assert reason(row).startswith("other:") and "modelled" in reason(row)
    assert reason({**row, "near_one": True}) == "near 1"


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config():
    return validate_config({})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["testbed"].update(channels=["good", "marsh"]), "not among wisv.channels"),
        (lambda c: c["testbed"].update(gamma=5), "not among wisv.gammas"),
        (lambda c: c["testbed"].update(fading_seed=20), "not below evaluation.fading_seeds"),
        (lambda c: c["testbed"].update(packet_error_rate={"bad": 0.1}), "not among testbed"),
        (lambda c: c["models"].update(device="cuda"), "one CPU core each"),
    ],
)
def test_testbed_settings_that_cannot_run_fail_before_any_job(config, change, message):
    check_testbed_settings(config)
    bad = copy.deepcopy(config)
    change(bad)
    with pytest.raises(ConfigError, match=message) as err:
        check_testbed_settings(bad)
    assert "config key 'testbed." in str(err.value)
    bad["testbed"]["enabled"] = False
    check_testbed_settings(bad)


def test_the_schema_refuses_wire_widths_without_a_codec():
    with pytest.raises(ConfigError, match="testbed.prob_bits"):
        validate_config({"testbed": {"prob_bits": 8}})
    assert math.isclose(validate_config({})["testbed"]["max_uplink_s"], 10.0)
