"""WISV FH / SH / vanilla payloads and round latencies on hand-computed cases (methods §4.3, 5)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.wireless.delay import LatencyProfile
from edgespec.wireless.payload import index_bits
from edgespec.wisv.protocols import (
    RoundPayload,
    crossover_rtt,
    fh_payload,
    hidden_state_bits,
    round_latency,
    sh_payload,
    token_id_bits,
    vanilla_payload,
)

V, H, GAMMA = 32_000, 2048, 4  # 15-bit ids, 32,768-bit fp16 hidden states
DRAFT_S, VERIFY_S = 0.02, 0.1


def latency(payload, rate, rtt):
    return round_latency(payload, rate, rtt, GAMMA, DRAFT_S, VERIFY_S)


def test_bit_sizes():
    assert token_id_bits(32_000) == 15 == index_bits(32_000)
    assert token_id_bits(128_256) == 17
    assert token_id_bits(2) == 1
    assert hidden_state_bits(2048) == 32_768
    assert hidden_state_bits(2048, bits_per_value=8) == 16_384
    with pytest.raises(ValueError):
        token_id_bits(1)


def test_payloads_hand_computed():
    # Downlink: count in 0..4 (3 bits) + one 15-bit token id = 18 bits.
    assert vanilla_payload(GAMMA, V) == RoundPayload(60, 0, 18, False)
    assert fh_payload(GAMMA, V, H) == RoundPayload(4 * (15 + 32_768), 0, 18, False)
    assert fh_payload(GAMMA, V, H).total_uplink_bits == 131_132
    assert sh_payload(GAMMA, 0, V, H) == RoundPayload(60, 0, 18, False)
    # One mismatch: the edge sends a 4-bit request mask, the device one hidden state.
    assert sh_payload(GAMMA, 1, V, H) == RoundPayload(60, 32_768, 22, True)
    assert sh_payload(GAMMA, 3, V, H).extra_uplink_bits == 3 * 32_768
    with pytest.raises(ValueError, match="exceeds gamma"):
        sh_payload(GAMMA, 5, V, H)
    with pytest.raises(ValueError, match="extra_round_trip"):
        RoundPayload(1, 1, 0, False)


def test_fh_wins_at_long_rtt():
    rate, rtt = 10e6, 0.05
    fh = latency(fh_payload(GAMMA, V, H), rate, rtt)
    sh = latency(sh_payload(GAMMA, 1, V, H), rate, rtt)
    # FH: 0.08 + 131,132 / 1e7 + 0.05 + 0.1; SH: 0.08 + 60 / 1e7 + 0.05 + 0.1 + 32,768 / 1e7 + 0.05.
    assert fh == pytest.approx(0.2431132, rel=1e-12)
    assert sh == pytest.approx(0.2832828, rel=1e-12)
    assert fh < sh
    assert rtt > crossover_rtt(GAMMA, 1, rate, H)


def test_sh_wins_at_short_rtt_slow_uplink():
    rate, rtt = 1e6, 0.005
    fh = latency(fh_payload(GAMMA, V, H), rate, rtt)
    sh = latency(sh_payload(GAMMA, 1, V, H), rate, rtt)
    # FH: 0.08 + 0.131132 + 0.005 + 0.1; SH: 0.08 + 0.00006 + 0.005 + 0.1 + 0.032768 + 0.005.
    assert fh == pytest.approx(0.316132, rel=1e-12)
    assert sh == pytest.approx(0.222828, rel=1e-12)
    assert sh < fh
    assert rtt < crossover_rtt(GAMMA, 1, rate, H)
    # Vanilla SD pays neither the hidden states nor the extra trip.
    assert latency(vanilla_payload(GAMMA, V), rate, rtt) == pytest.approx(0.18506)


def test_crossover_point():
    rate = 1e6
    # (gamma - m) b_h / R = 3 * 32,768 / 1e6 = 98.304 ms.
    rtt_star = crossover_rtt(GAMMA, 1, rate, H)
    assert rtt_star == pytest.approx(0.098304)
    fh, sh = fh_payload(GAMMA, V, H), sh_payload(GAMMA, 1, V, H)
    assert latency(fh, rate, rtt_star) == pytest.approx(latency(sh, rate, rtt_star), rel=1e-12)
    assert latency(sh, rate, 0.9 * rtt_star) < latency(fh, rate, 0.9 * rtt_star)
    assert latency(sh, rate, 1.1 * rtt_star) > latency(fh, rate, 1.1 * rtt_star)
    # Faster uplink shrinks SH's advantage: FH wins at more RTTs.
    assert crossover_rtt(GAMMA, 1, 10e6, H) == pytest.approx(0.0098304)
    # No mismatch: SH never takes the extra trip; all mismatched: SH never strictly wins.
    assert crossover_rtt(GAMMA, 0, rate, H) == np.inf
    assert crossover_rtt(GAMMA, GAMMA, rate, H) == 0.0
    # In expectation: E|M| = 1, P(M != {}) = 0.5 -> 3 * 32,768 / (1e6 * 0.5).
    assert crossover_rtt(GAMMA, 1.0, rate, H, p_any_mismatch=0.5) == pytest.approx(0.196608)
    # Vectorised over rates.
    np.testing.assert_allclose(
        crossover_rtt(GAMMA, 1, np.array([1e6, 1e7]), H), [0.098304, 0.0098304]
    )


def test_crossover_with_downlink_mask():
    rate, dl = 1e6, 1e3
    # The 4-bit request mask at 1 kb/s costs SH 4 ms: RTT* = 98.304 - 4 ms.
    rtt_star = crossover_rtt(GAMMA, 1, rate, H, downlink_rate_bps=dl)
    assert rtt_star == pytest.approx(0.094304)
    fh, sh = fh_payload(GAMMA, V, H), sh_payload(GAMMA, 1, V, H)
    args = (GAMMA, DRAFT_S, VERIFY_S)
    assert round_latency(fh, rate, rtt_star, *args, downlink_rate_bps=dl) == pytest.approx(
        round_latency(sh, rate, rtt_star, *args, downlink_rate_bps=dl), rel=1e-12
    )


def test_round_latency_options():
    fh = fh_payload(GAMMA, V, H)
    base = latency(fh, 10e6, 0.01)
    with_head = round_latency(fh, 10e6, 0.01, GAMMA, DRAFT_S, VERIFY_S, extra_verify_s=0.003)
    assert with_head - base == pytest.approx(0.003)
    with_dl = round_latency(fh, 10e6, 0.01, GAMMA, DRAFT_S, VERIFY_S, downlink_rate_bps=18e3)
    assert with_dl - base == pytest.approx(1e-3)  # 18 bits at 18 kb/s
    # One call prices many fading blocks.
    rates = np.array([1e6, 10e6])
    np.testing.assert_allclose(
        latency(fh, rates, 0.05), [latency(fh, 1e6, 0.05), latency(fh, 10e6, 0.05)]
    )
    # Verification time from a profile.
    profile = LatencyProfile(DRAFT_S, 0.05, {4: VERIFY_S})
    assert round_latency(
        fh, 10e6, 0.05, GAMMA, profile.draft_token_s, profile.target_verify(GAMMA)
    ) == pytest.approx(base + 0.04)
    with pytest.raises(ValueError, match="rate_bps must be > 0"):
        latency(fh, 0.0, 0.01)
    with pytest.raises(ValueError, match="rtt_s"):
        latency(fh, 1e6, -0.01)
