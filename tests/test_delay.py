"""CU-HLM per-token delay model and latency profiles (methods §5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.wireless.delay import (
    LatencyProfile,
    throughput_tokens_per_s,
    tokenwise_delays,
    topk_extraction_s,
)
from edgespec.wireless.payload import upload_bits

PROFILE = LatencyProfile(
    draft_token_s=0.01,
    target_token_s=0.1,
    target_verify_s={4: 0.12, 8: 0.16},
    uncertainty_s=0.002,
    source="config",
)


def test_full_vocabulary_payload():
    # 32,000-token vocabulary, b_p = 8: 32,000 * (8 + 15) = 736,000 bits = 92 kB.
    assert upload_bits(32_000, 32_000, prob_bits=8) == 736_000
    assert upload_bits(30, 32_000) == 690


def test_tokenwise_delays_hand_computed():
    uploaded = np.array([True, False, True])
    bits = np.array([736_000.0, 0.0, 1_000.0])
    rates = np.array([10e6, 5e6, 2e6])
    tau = tokenwise_delays(uploaded, bits, rates, PROFILE, rtt_s=0.02, uses_uncertainty=True)
    # t1: 0.01 + 0.002 + 0.0736 + 0.1 + 0.02; t2: 0.01 + 0.002; t3: 0.012 + 0.0005 + 0.12.
    np.testing.assert_allclose(tau, [0.2056, 0.012, 0.1325], rtol=1e-12)
    assert throughput_tokens_per_s(3, tau) == pytest.approx(3 / 0.3501)

    no_unc = tokenwise_delays(uploaded, bits, rates, PROFILE, 0.02, uses_uncertainty=False)
    np.testing.assert_allclose(tau - no_unc, 0.002)


def test_resync_and_downlink():
    uploaded = np.array([False, False, True, False, True, False])
    bits = np.full(6, 100.0)
    rates = np.full(6, 1e3)
    base = tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, uses_uncertainty=False)
    tau = tokenwise_delays(
        uploaded,
        bits,
        rates,
        PROFILE,
        0.0,
        uses_uncertainty=False,
        resync_bits_per_skipped=15,
        downlink_bits=15,
        downlink_rate_bps=1e4,
    )
    # Token 3 carries the two skipped ids before it, token 5 one; the trailing skip is free.
    # Downlink: 15 bits at 10 kb/s = 1.5 ms per upload.
    np.testing.assert_allclose(
        tau - base, [0, 0, 30 / 1e3 + 1.5e-3, 0, 15 / 1e3 + 1.5e-3, 0], atol=1e-15
    )
    with pytest.raises(ValueError, match="needs a downlink_rate_bps"):
        tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, False, downlink_bits=15)


def test_sequences_end_to_end_price_as_separate_calls():
    # Three sequences laid end to end: the skipped ids before an upload count only within its
    # own sequence, so token 5 carries one (token 4), not three, and token 8's carry starts
    # afresh after the sequence boundary at 6.
    uploaded = np.array([False, True, False, False, False, True, True, False, True, False])
    bits = np.arange(10, dtype=float) * 100.0
    rates = np.linspace(1e3, 2e3, 10)
    downlink = np.linspace(1e4, 3e4, 10)
    starts = [0, 4, 6]
    kw = dict(resync_bits_per_skipped=15.0, downlink_bits=15.0, device_s=0.003)

    def joined(**extra):
        return tokenwise_delays(
            uploaded,
            bits,
            rates,
            PROFILE,
            0.02,
            True,
            downlink_rate_bps=downlink,
            segment_starts=starts,
            **{**kw, **extra},
        )

    bounds = [*starts, len(uploaded)]
    separate = np.concatenate(
        [
            tokenwise_delays(
                uploaded[a:b],
                bits[a:b],
                rates[a:b],
                PROFILE,
                0.02,
                True,
                downlink_rate_bps=downlink[a:b],
                **kw,
            )
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
    )
    np.testing.assert_allclose(joined(), separate, rtol=0, atol=1e-15)
    carried = joined() - joined(resync_bits_per_skipped=0.0)
    np.testing.assert_allclose(
        carried[[1, 5, 6, 8]], 15.0 * np.array([1, 1, 0, 1]) / rates[[1, 5, 6, 8]]
    )
    for bad in ([1, 4], [0, 4, 4], [0, 10], []):
        with pytest.raises(ValueError, match="segment_starts"):
            tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, False, segment_starts=bad)


def test_modes():
    n = 4
    none = np.zeros(n, dtype=bool)
    # SLM-only: nothing is uploaded.
    slm = tokenwise_delays(none, 0.0, 1.0, PROFILE, 0.05, uses_uncertainty=False)
    np.testing.assert_allclose(slm, 0.01)
    # Standard HLM: every token uploads the full vocabulary.
    hlm = tokenwise_delays(~none, upload_bits(32_000, 32_000), 34.594e6, PROFILE, 0.0, False)
    np.testing.assert_allclose(hlm, 0.01 + 736_000 / 34.594e6 + 0.1)
    # LLM-only: the edge generates alone; no uplink, no per-token RTT.
    llm = tokenwise_delays(
        none,
        0.0,
        1.0,
        PROFILE,
        0.05,
        uses_uncertainty=False,
        uses_draft=False,
        uses_target_always=True,
    )
    np.testing.assert_allclose(llm, 0.1)
    llm_dl = tokenwise_delays(
        none,
        0.0,
        1.0,
        PROFILE,
        0.05,
        False,
        uses_draft=False,
        uses_target_always=True,
        downlink_bits=16,
        downlink_rate_bps=1e3,
    )
    np.testing.assert_allclose(llm_dl, 0.116)
    with pytest.raises(ValueError, match="LLM-only"):
        tokenwise_delays(none, 0.0, 1.0, PROFILE, 0.0, False, uses_draft=False)
    with pytest.raises(ValueError, match="LLM-only"):
        tokenwise_delays(none, 0.0, 1.0, PROFILE, 0.0, False, uses_target_always=True)
    with pytest.raises(ValueError, match="no uplink"):
        tokenwise_delays(
            ~none, 0.0, 1.0, PROFILE, 0.0, False, uses_draft=False, uses_target_always=True
        )


def test_tokenwise_delays_validation():
    up = np.array([True, False])
    with pytest.raises(ValueError, match="> 0 where a token is uploaded"):
        tokenwise_delays(up, [10.0, 10.0], [0.0, 1.0], PROFILE, 0.0, False)
    # A zero rate on a skipped token is irrelevant.
    tokenwise_delays(up, [10.0, 10.0], [1.0, 0.0], PROFILE, 0.0, False)
    with pytest.raises(ValueError, match="bool"):
        tokenwise_delays(np.array([1, 0]), [10.0, 10.0], [1.0, 1.0], PROFILE, 0.0, False)
    with pytest.raises(ValueError, match="shape"):
        tokenwise_delays(up, [10.0, 10.0, 1.0], [1.0, 1.0], PROFILE, 0.0, False)
    with pytest.raises(ValueError, match="rtt_s"):
        tokenwise_delays(up, [10.0, 10.0], [1.0, 1.0], PROFILE, -1.0, False)
    with pytest.raises(ValueError, match="total delay"):
        throughput_tokens_per_s(3, [0.0, 0.0])


def test_profile_interpolation_and_round_trip():
    assert PROFILE.target_verify(4) == 0.12
    assert PROFILE.target_verify(6) == pytest.approx(0.14)
    with pytest.raises(ValueError, match="outside the profiled gammas"):
        PROFILE.target_verify(16)
    with pytest.raises(ValueError, match="no target_verify_s entries"):
        LatencyProfile(0.01, 0.1).target_verify(4)
    restored = LatencyProfile.from_dict(json.loads(json.dumps(PROFILE.to_dict())))
    assert restored == PROFILE
    assert hash(restored) == hash(PROFILE)
    assert list(restored.target_verify_s) == [4, 8]


def test_profile_errors():
    with pytest.raises(ValueError, match="missing required key 'target_token_s'"):
        LatencyProfile.from_dict({"draft_token_s": 0.01})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['tau_llm'\]"):
        LatencyProfile.from_dict({"draft_token_s": 0.01, "target_token_s": 0.1, "tau_llm": 1})
    with pytest.raises(ValueError, match="draft_token_s must be a finite time"):
        LatencyProfile(-0.01, 0.1)
    with pytest.raises(ValueError, match="integer gamma"):
        LatencyProfile(0.01, 0.1, {"four": 0.1})
    with pytest.raises(ValueError, match="gamma >= 1"):
        LatencyProfile(0.01, 0.1, {0: 0.1})


def test_device_seconds_are_added_per_token():
    """device_s (k selection, top-k extraction) adds to every token it names, skipped or not."""
    uploaded = np.array([True, False, True])
    bits = np.array([1_000.0, 0.0, 1_000.0])
    rates = np.array([1e6, 1e6, 1e6])
    base = tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, True)
    extra = np.array([0.004, 0.001, 0.0])
    got = tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, True, device_s=extra)
    np.testing.assert_allclose(got - base, extra, atol=1e-15)
    scalar = tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, True, device_s=0.003)
    np.testing.assert_allclose(scalar - base, 0.003)
    with pytest.raises(ValueError, match="device_s"):
        tokenwise_delays(uploaded, bits, rates, PROFILE, 0.0, True, device_s=-1.0)
    with pytest.raises(ValueError, match="device"):
        tokenwise_delays(
            np.zeros(3, dtype=bool),
            0.0,
            1.0,
            PROFILE,
            0.0,
            False,
            uses_draft=False,
            uses_target_always=True,
            device_s=0.1,
        )


def test_topk_extraction_time_interpolates_in_log_k_and_never_decreases():
    table = {1: 0.001, 16: 0.003, 256: 0.002, 4096: 0.009}
    # The measured dip at 256 is noise: the table is made non-decreasing first.
    assert topk_extraction_s(table, 1) == 0.001
    assert topk_extraction_s(table, 4) == pytest.approx(0.002)  # halfway in log k
    assert topk_extraction_s(table, 256) == pytest.approx(0.003)
    assert topk_extraction_s(table, 1024) == pytest.approx(0.006)
    assert topk_extraction_s(table, 10**6) == 0.009  # constant beyond the last size
    got = topk_extraction_s(table, np.array([1, 16, 4096]))
    np.testing.assert_allclose(got, [0.001, 0.003, 0.009])
    assert topk_extraction_s({}, 50) == 0.0
    with pytest.raises(ValueError, match=">= 1"):
        topk_extraction_s(table, 0)
    profile = LatencyProfile(0.01, 0.1, online_k_s=0.004, topk_s={"1": 0.001, "16": 0.003})
    assert profile.topk_time(4) == pytest.approx(0.002)
    restored = LatencyProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert restored == profile and restored.online_k_s == 0.004
    with pytest.raises(ValueError, match="integer k"):
        LatencyProfile(0.01, 0.1, topk_s={"four": 0.1})
    with pytest.raises(ValueError, match="online_k_s"):
        LatencyProfile(0.01, 0.1, online_k_s=-1)
