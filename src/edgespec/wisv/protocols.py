"""WISV upload protocols: per-round payloads and latency (methods §4.3 and 5).

One round drafts gamma tokens on the device and verifies them with one target forward on the
edge. Payloads [bit]:

- token id: ceil(log2 |V|) bits; draft hidden state: hidden_size * bits_per_value (fp16: 16);
- **vanilla SD**: gamma ids up;
- **FH** (full-hidden): gamma ids and gamma draft hidden states up, in one message;
- **SH** (mismatch-first selective-hidden): gamma ids up; if the edge finds m > 0 mismatches it
  requests the m hidden states of those positions (a gamma-bit position mask down) and the
  device uploads them (m hidden states up): one extra round trip;
- downlink of every round: the accepted count, ceil(log2(gamma + 1)) bits, and the
  repair/bonus token id.

Round latency (the project's formula; methods §9 lists the protocol latency formulas as an own
choice):

    T = n_d tau_SLM + uplink / R + RTT + tau_LLM(gamma) + t_head + T_retx
        (+ extra_uplink / R + RTT                 if the protocol takes an extra trip)
        (+ downlink / R_dl                        if a downlink rate is given)   [s]

with n_d the draft forwards the round runs (gamma, or gamma + 1 where the decision head needs
the last draft token's after-token state, ``edgespec.decoding.rounds``) and T_retx the expected
ARQ retransmissions of the round's uplink messages under the block's packet error rate
(``edgespec.wireless.arq``).

Compute times cancel between FH and SH, so SH beats FH in a round with m > 0 mismatches iff
RTT + m b_h / R < gamma b_h / R, i.e. RTT < (gamma - m) b_h / R (``crossover_rtt``): SH wins at
short RTT and slow uplink with few mismatches, FH at long RTT or fast uplink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgespec import checks
from edgespec.wireless.arq import ArqSettings, expected_retransmission_s


@dataclass(frozen=True)
class RoundPayload:
    """Bits moved in one round [bit], and whether the protocol needs a second round trip.

    ``uplink_bits``: the first uplink message; ``extra_uplink_bits``: the uplink message of the
    extra trip (SH's requested hidden states); ``downlink_bits``: everything sent down in the
    round (count, repair/bonus token id, SH's request mask); ``extra_round_trip``: SH with at
    least one mismatch.
    """

    uplink_bits: float
    extra_uplink_bits: float
    downlink_bits: float
    extra_round_trip: bool

    def __post_init__(self) -> None:
        for key in ("uplink_bits", "extra_uplink_bits", "downlink_bits"):
            checks.nonneg_number(key, getattr(self, key))
        if self.extra_uplink_bits > 0 and not self.extra_round_trip:
            raise ValueError("extra_uplink_bits > 0 needs extra_round_trip=True")

    @property
    def total_uplink_bits(self) -> float:
        """All uplink bits of the round [bit]."""
        return self.uplink_bits + self.extra_uplink_bits


def token_id_bits(vocab_size: int) -> int:
    """Bits of one token id, ceil(log2 |V|) (as ``edgespec.wireless.payload.index_bits``)."""
    vocab_size = checks.integer("vocab_size", vocab_size, 2)
    return math.ceil(math.log2(vocab_size))


def hidden_state_bits(hidden_size: int, bits_per_value: int = 16) -> int:
    """Bits of one draft hidden state, hidden_size * bits_per_value (fp16 default)."""
    return checks.integer("hidden_size", hidden_size, 1) * checks.integer(
        "bits_per_value", bits_per_value, 1
    )


def _downlink_bits(gamma: int, vocab_size: int) -> int:
    # Accepted count n in 0..gamma, plus the repair or bonus token id.
    return math.ceil(math.log2(gamma + 1)) + token_id_bits(vocab_size)


def vanilla_payload(gamma: int, vocab_size: int) -> RoundPayload:
    """Vanilla SD: gamma token ids up; count and repair/bonus id down."""
    gamma = checks.integer("gamma", gamma, 1)
    return RoundPayload(
        uplink_bits=gamma * token_id_bits(vocab_size),
        extra_uplink_bits=0.0,
        downlink_bits=_downlink_bits(gamma, vocab_size),
        extra_round_trip=False,
    )


def fh_payload(
    gamma: int, vocab_size: int, hidden_size: int, bits_per_value: int = 16
) -> RoundPayload:
    """Full-hidden upload: gamma ids and gamma draft hidden states in one uplink message."""
    gamma = checks.integer("gamma", gamma, 1)
    per_token = token_id_bits(vocab_size) + hidden_state_bits(hidden_size, bits_per_value)
    return RoundPayload(
        uplink_bits=gamma * per_token,
        extra_uplink_bits=0.0,
        downlink_bits=_downlink_bits(gamma, vocab_size),
        extra_round_trip=False,
    )


def sh_payload(
    gamma: int,
    num_mismatches: int,
    vocab_size: int,
    hidden_size: int,
    bits_per_value: int = 16,
) -> RoundPayload:
    """Mismatch-first selective-hidden upload: ids first; with m > 0 mismatches the edge sends
    a gamma-bit request mask and the device uploads the m hidden states (one extra trip)."""
    gamma = checks.integer("gamma", gamma, 1)
    m = checks.integer("num_mismatches", num_mismatches, 0)
    if m > gamma:
        raise ValueError(f"num_mismatches={m} exceeds gamma={gamma}")
    return RoundPayload(
        uplink_bits=gamma * token_id_bits(vocab_size),
        extra_uplink_bits=m * hidden_state_bits(hidden_size, bits_per_value),
        downlink_bits=_downlink_bits(gamma, vocab_size) + (gamma if m > 0 else 0),
        extra_round_trip=m > 0,
    )


def draft_forwards_per_round(gamma: int, keep_hidden: bool) -> int:
    """The draft forwards ``edgespec.decoding.rounds.generate_rounds`` runs per row and round:
    one per draft token, and one more over the last draft token where the hidden states are
    kept (its after-token state for the decision head). The delay model charges each
    (``protocols.round_breakdown``); a test counts the engine's forwards against it."""
    return int(gamma) + (1 if keep_hidden else 0)


BREAKDOWN_PARTS = (
    "draft_s",
    "uplink_s",
    "rtt_s",
    "verify_s",
    "head_s",
    "retransmission_s",
    "downlink_s",
)
"""The parts of a round's latency (:func:`round_breakdown`), in the order figures stack them."""


def round_breakdown(
    payload: RoundPayload,
    rate_bps,
    rtt_s,
    draft_forwards,
    draft_token_s: float,
    target_verify_s: float,
    extra_verify_s: float = 0.0,
    downlink_rate_bps=None,
    per=0.0,
    arq: ArqSettings | None = None,
) -> dict[str, np.ndarray]:
    """The latency of one round by part [s] (module docstring formula), keys
    ``BREAKDOWN_PARTS``: ``draft_s`` n_d tau_SLM, n_d = ``draft_forwards`` the draft forwards
    the round runs (gamma, or gamma + 1 where the last draft token's hidden state needs one
    more); ``uplink_s`` every uplink bit at ``rate_bps`` [bit/s]; ``rtt_s`` one RTT per trip
    (two for SH's extra trip); ``verify_s`` tau_LLM(gamma) = ``target_verify_s``; ``head_s``
    ``extra_verify_s``, the decision head; ``retransmission_s`` the expected ARQ
    retransmissions of every uplink message under packet error rate ``per``
    (``edgespec.wireless.arq``, settings ``arq``, default ``ArqSettings()``); ``downlink_s``
    the downlink bits at ``downlink_rate_bps`` (0 where None). ``rate_bps``, ``rtt_s``,
    ``draft_forwards`` and ``per`` broadcast, so one call prices many rounds."""
    rate = checks.positive_array("rate_bps", rate_bps)
    rtt = checks.nonneg_array("rtt_s", rtt_s)
    forwards = checks.nonneg_array("draft_forwards", draft_forwards)
    compute = checks.nonneg_array("compute times", [draft_token_s, target_verify_s, extra_verify_s])
    arq = arq or ArqSettings()
    shape = np.broadcast(rate, rtt, forwards, np.asarray(per, dtype=float)).shape
    trips = 2 if payload.extra_round_trip else 1
    retx = expected_retransmission_s(payload.uplink_bits, rate, per, rtt, arq)
    if payload.extra_uplink_bits > 0:
        retx = retx + expected_retransmission_s(payload.extra_uplink_bits, rate, per, rtt, arq)
    downlink = (
        0.0
        if downlink_rate_bps is None
        else payload.downlink_bits / checks.positive_array("downlink_rate_bps", downlink_rate_bps)
    )
    parts = {
        "draft_s": forwards * compute[0],
        "uplink_s": (payload.uplink_bits + payload.extra_uplink_bits) / rate,
        "rtt_s": trips * rtt,
        "verify_s": compute[1],
        "head_s": compute[2],
        "retransmission_s": retx,
        "downlink_s": downlink,
    }
    return {k: np.broadcast_to(np.asarray(v, dtype=float), shape) + 0.0 for k, v in parts.items()}


def round_latency(payload: RoundPayload, *args, **kwargs):
    """Latency of one round [s]: the sum of :func:`round_breakdown`'s parts (the same
    arguments: payload, rate_bps, rtt_s, draft_forwards n_d, draft_token_s, target_verify_s,
    then the options). A float comes back for scalar inputs."""
    parts = round_breakdown(payload, *args, **kwargs)
    out = np.asarray(sum(parts[k] for k in BREAKDOWN_PARTS), dtype=float)
    return float(out) if out.ndim == 0 else out


def crossover_rtt(
    gamma: int,
    num_mismatches: float,
    rate_bps,
    hidden_size: int,
    bits_per_value: int = 16,
    p_any_mismatch: float | None = None,
    downlink_rate_bps=None,
):
    """The RTT [s] below which SH is strictly faster than FH (at equal compute times).

    Per round with m mismatches: SH beats FH iff RTT < (gamma - m) b_h / R (``p_any_mismatch``
    left None; m = 0 gives +inf, SH always wins). In expectation over rounds, pass the mean
    mismatch count E|M| as ``num_mismatches`` and P(M != {}) as ``p_any_mismatch``:
    RTT* = (gamma - E|M|) b_h / (R P(M != {})). With a downlink rate, SH's request mask
    (gamma bits per extra trip) is charged too. A result of 0 means FH is never slower.
    """
    gamma = checks.integer("gamma", gamma, 1)
    m = float(num_mismatches)
    if not 0 <= m <= gamma:
        raise ValueError(f"num_mismatches must lie in [0, gamma={gamma}], got {m}")
    if p_any_mismatch is None:
        p = 1.0 if m > 0 else 0.0
    else:
        p = float(p_any_mismatch)
        if not 0 <= p <= 1:
            raise ValueError(f"p_any_mismatch must lie in [0, 1], got {p}")
        if m > 0 and p == 0:
            raise ValueError("num_mismatches > 0 needs p_any_mismatch > 0")
    rate = checks.positive_array("rate_bps", rate_bps)
    saving = (gamma - m) * hidden_state_bits(hidden_size, bits_per_value) / rate
    if downlink_rate_bps is not None:
        saving = saving - p * gamma / checks.positive_array("downlink_rate_bps", downlink_rate_bps)
    if p == 0:
        out = np.where(saving > 0, np.inf, 0.0)
    else:
        out = np.maximum(saving, 0.0) / p
    out = np.asarray(out, dtype=float)
    return float(out) if out.ndim == 0 else out
