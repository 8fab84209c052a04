"""CSI samples for channel-aware relabeling, and what a repair costs under each (methods §4.2).

The relabeling asks, for each mined mismatch and each channel state c the head may meet, whether
a repair is worth its latency. The samples must cover the states the evaluation meets, so they
span the evaluation channels' range (:func:`csi_ranges`): bandwidth (log-uniform), average SNR
and RTT (uniform) between the smallest and largest configured values, unless configured
otherwise, and the current block's fading gain |h|^2 ~ Exp(1) (Rayleigh). A Latin hypercube
(:func:`latin_hypercube`) spreads a few samples over all four dimensions.

A repair commits the target's token and ends the round, so the answer needs about one more
round. That round happens in a later fading block, which the current CSI predicts only through
the Gauss-Markov correlation of the channel model the evaluation uses (``ChannelCondition
.correlation``): its upload is priced at the expected rate given the current gain,
``edgespec.wireless.channel.expected_rate_given_gain`` (:func:`repair_cost_rounds`). The cost is
stated in rounds of compute, C_rep / T_0 with T_0 = gamma tau_SLM + tau_LLM(gamma), so that
lambda (rounds per unit risk) means the same on a slow and a fast machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.wireless.arq import ArqSettings, expected_retransmission_s
from edgespec.wireless.channel import (
    ChannelCondition,
    block_packet_error_rate,
    csi_features,
    expected_rate_given_gain,
    uplink_rate_bps,
)
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.protocols import draft_forwards_per_round

RANGE_KEYS = {
    "bandwidth_hz": "bandwidth_hz_range",
    "snr_db": "snr_db_range",
    "rtt_s": "rtt_s_range",
}
"""Channel field -> the ``wisv.relabel`` key that may override its sampled range."""


class CsiError(ValueError):
    """Invalid CSI sampling settings."""


@dataclass(frozen=True)
class CsiSample:
    """One sampled channel state: the average condition and the current block's |h|^2."""

    condition: ChannelCondition
    gain: float

    def features(self, names: Sequence[str]) -> dict[str, float]:
        """The CSI features phi(c) the head reads (``csi_features``), by name."""
        feats = csi_features(self.condition, self.gain)
        missing = [n for n in names if n not in feats]
        if missing:
            raise CsiError(f"unknown CSI feature(s) {missing}; known: {sorted(feats)}")
        return {n: float(feats[n]) for n in names}

    def describe(self) -> dict[str, float]:
        """The sample's parameters for tables: mean SNR [dB], W [MHz], RTT [s], gain, rates."""
        return {
            "snr_db_mean": self.condition.mean_snr_db(),
            "bandwidth_mhz": self.condition.bandwidth_hz / 1e6,
            "rtt_s": self.condition.rtt_s,
            "gain": self.gain,
            "rate_mbps": float(uplink_rate_bps(self.condition, self.gain)) / 1e6,
            "expected_next_rate_mbps": float(expected_rate_given_gain(self.condition, self.gain))
            / 1e6,
            "per": float(block_packet_error_rate(self.condition, self.gain)),
        }


def csi_ranges(
    channels: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any] | None = None
) -> dict[str, tuple[float, float]]:
    """(low, high) of bandwidth [Hz], average SNR [dB] and RTT [s] the samples span.

    The default is the span of the evaluation ``channels`` (ChannelCondition fields); an entry
    of ``overrides`` (``wisv.relabel.<field>_range``, not None) replaces it.
    """
    if not channels:
        raise CsiError("no evaluation channel to span (config key wisv.channels)")
    conditions = [ChannelCondition.from_dict({"name": k, **v}) for k, v in channels.items()]
    spans = {
        "bandwidth_hz": [c.bandwidth_hz for c in conditions],
        "snr_db": [c.mean_snr_db() for c in conditions],
        "rtt_s": [c.rtt_s for c in conditions],
    }
    out = {}
    for name, values in spans.items():
        key = RANGE_KEYS[name]
        given = (overrides or {}).get(key)
        low, high = (
            (min(values), max(values)) if given is None else (float(given[0]), float(given[1]))
        )
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise CsiError(f"config key 'wisv.relabel.{key}': need low <= high, got {given}")
        if (name != "snr_db" and low < 0) or (name == "bandwidth_hz" and low <= 0):
            raise CsiError(f"config key 'wisv.relabel.{key}': values must be positive, got {given}")
        out[name] = (low, high)
    return out


def latin_hypercube(num: int, dims: int, rng: np.random.Generator) -> np.ndarray:
    """[num, dims] points in [0, 1)^dims, one in each of the num equal strata of every
    dimension (a Latin hypercube), drawn from ``rng``."""
    if num < 1 or dims < 1:
        raise CsiError(f"need num >= 1 and dims >= 1, got {num}, {dims}")
    strata = np.stack([rng.permutation(num) for _ in range(dims)], axis=1)
    return (strata + rng.random((num, dims))) / num


def per_fit(channels: Mapping[str, Mapping[str, Any]]) -> tuple[float, float]:
    """The packet-error fit (per_a, per_g) the evaluation ``channels`` share (one radio, so
    one fit; ``arq.packet_error_rate``), for the CSI samples; CsiError where they differ."""
    fits = {
        name: (float(spec.get("per_a", 0.0)), float(spec.get("per_g", 0.0)))
        for name, spec in channels.items()
    }
    if len(set(fits.values())) > 1:
        raise CsiError(
            f"config key wisv.channels: the channels give different packet-error fits "
            f"(per_a, per_g) {fits}; the relabeling's CSI samples need one"
        )
    return next(iter(fits.values()), (0.0, 0.0))


def sample_csi(
    ranges: Mapping[str, tuple[float, float]],
    num: int,
    rng: np.random.Generator,
    correlation: float,
    per: tuple[float, float] = (0.0, 0.0),
) -> list[CsiSample]:
    """``num`` Rayleigh channel states over ``ranges`` (:func:`csi_ranges`), Latin-hypercube
    spread: bandwidth log-uniform, SNR and RTT uniform, gain |h|^2 = -ln(1 - u) (Exp(1)), all
    with the Gauss-Markov ``correlation`` of the evaluation's channel model and its
    packet-error fit ``per`` = (per_a, per_g) (:func:`per_fit`)."""
    points = latin_hypercube(num, 4, rng)
    (w_lo, w_hi), (s_lo, s_hi), (r_lo, r_hi) = (
        ranges["bandwidth_hz"],
        ranges["snr_db"],
        ranges["rtt_s"],
    )
    out = []
    for i, (u_w, u_s, u_r, u_g) in enumerate(points):
        bandwidth = math.exp(math.log(w_lo) + u_w * (math.log(w_hi) - math.log(w_lo)))
        condition = ChannelCondition(
            name=f"csi{i}",
            fading="rayleigh",
            bandwidth_hz=bandwidth,
            snr_db=s_lo + u_s * (s_hi - s_lo),
            rtt_s=r_lo + u_r * (r_hi - r_lo),
            correlation=correlation,
            per_a=per[0],
            per_g=per[1],
        )
        out.append(CsiSample(condition, float(-math.log1p(-u_g))))
    return out


def round_compute_s(profile: LatencyProfile, gamma: int, head_s: float = 0.0) -> float:
    """T_0 = n_d * tau_SLM + tau_LLM(gamma) + t_head [s]: one round's compute on a perfect link
    for the decision head's decodes, n_d = gamma + 1 draft forwards (they keep the hidden
    states, ``protocols.draft_forwards_per_round``) and ``head_s`` the head's time [s]."""
    forwards = draft_forwards_per_round(gamma, keep_hidden=True)
    return forwards * profile.draft_token_s + profile.target_verify(gamma) + head_s


def expected_next_gain(sample: CsiSample) -> float:
    """E[|h_next|^2 | |h|^2 = g] = c^2 g + 1 - c^2 under the Gauss-Markov correlation c of the
    sample's channel (Rayleigh; the next block's mean power given this one's)."""
    memory = sample.condition.correlation**2
    return memory * sample.gain + 1.0 - memory


def repair_cost_rounds(
    sample: CsiSample, uplink_bits: float, round_compute: float, arq: ArqSettings | None = None
) -> float:
    """C_rep(c) / T_0 [rounds]: the latency of the extra round a repair causes, in rounds of
    compute T_0 = ``round_compute`` [s],

        C_rep(c) = T_0 + uplink_bits / E[R_next | |h|^2] + RTT + E[T_retx]   [s],

    with ``uplink_bits`` [bit] the round's upload under the protocol in use (FH), the expected
    rate of the next block given the sample's gain (``expected_rate_given_gain``) and the
    expected ARQ retransmissions (``arq.expected_retransmission_s``, settings ``arq``) at the
    packet error rate of the next block's expected power gain (:func:`expected_next_gain`).
    """
    if not (math.isfinite(round_compute) and round_compute > 0):
        raise CsiError(f"round_compute must be > 0 s, got {round_compute}")
    if not (math.isfinite(uplink_bits) and uplink_bits >= 0):
        raise CsiError(f"uplink_bits must be finite and >= 0, got {uplink_bits}")
    rate = float(expected_rate_given_gain(sample.condition, sample.gain))
    per = float(block_packet_error_rate(sample.condition, expected_next_gain(sample)))
    rtt = sample.condition.rtt_s
    retx = expected_retransmission_s(uplink_bits, rate, per, rtt, arq or ArqSettings())
    seconds = round_compute + uplink_bits / rate + rtt + retx
    return seconds / round_compute
