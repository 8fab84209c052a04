"""Packet errors and ARQ retransmissions on the uplink (methods §5); torch-free.

**Packet error rate.** A packet sent in a fading block whose instantaneous SNR is
s = rho |h|^2 (linear) is lost with probability

    PER(s) = min(1, a exp(-g s))

the exponential fit that adaptive-modulation-and-coding studies use for one coded mode
(Liu, Zhou and Giannakis, IEEE Trans. Wireless Commun. 2004; a and g per mode and packet
length, a exp(-g s) = 1 at the mode's threshold SNR). ``ChannelCondition.per_a`` and
``per_g`` hold a and g; a = 0 is an error-free link. The rate the bits move at stays the
block's Shannon rate (``edgespec.wireless.channel``): the PER is a separate loss process of
the same SNR, the project's own simplification (docs/methods.md §5).

**ARQ** (selective repeat with a timeout, truncated): a message of B bits goes out as
n = ceil(B / L) packets of L bits (:class:`ArqSettings` ``packet_bits``). Each packet lost
is sent again after a timeout T_o (default: the channel's RTT, the time the missing
acknowledgement takes to show), all packets lost in one pass together, at most N_r times
(``max_retransmissions``); a packet still lost after that is left to the layer above and
charged nothing more. Packet losses are independent with the block's PER p (block fading:
every retransmission of a round happens in the round's block). Retransmission pass k
(1..N_r) happens iff some packet was lost k times in a row, P_k = 1 - (1 - p^k)^n, and
resends on average B p^k bits, so the expected extra time of the message is

    E[T_retx] = sum_{k=1..N_r} ( P_k T_o + B p^k / R )   [s]

(:func:`expected_retransmission_s`; the timeout and the resent bits as separate parts in
:func:`retransmission_parts`). It is an expectation given the block's PER, not a draw, so
every variant priced on the same fading draws sees the same loss process (common random
numbers need no further draws).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


class ArqError(ValueError):
    """Invalid packet-error or ARQ settings."""


@dataclass(frozen=True)
class ArqSettings:
    """The link layer's retransmission scheme (config key ``wisv.arq``).

    ``packet_bits`` L [bit]; ``max_retransmissions`` N_r (0: no ARQ); ``timeout_s`` T_o [s]
    before a lost packet is sent again (None: the channel's RTT).
    """

    packet_bits: int = 1080
    max_retransmissions: int = 3
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        for key in ("packet_bits", "max_retransmissions"):
            value = getattr(self, key)
            if isinstance(value, bool) or int(value) != value:
                raise ArqError(f"wisv.arq.{key} must be an integer, got {value!r}")
        if self.packet_bits < 1 or self.max_retransmissions < 0:
            raise ArqError(
                f"wisv.arq: packet_bits must be >= 1 and max_retransmissions >= 0, got "
                f"{self.packet_bits}, {self.max_retransmissions}"
            )
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s >= 0
        ):
            raise ArqError(f"wisv.arq.timeout_s must be >= 0 s or null, got {self.timeout_s}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> ArqSettings:
        """From config key ``wisv.arq`` (None: the defaults)."""
        d = dict(d or {})
        unknown = sorted(set(d) - {"packet_bits", "max_retransmissions", "timeout_s"})
        if unknown:
            raise ArqError(f"wisv.arq: unknown key(s) {unknown}")
        return cls(**d)

    def timeout(self, rtt_s):
        """T_o [s]: ``timeout_s``, else the RTT (scalar or array, like ``rtt_s``)."""
        if self.timeout_s is None:
            return rtt_s
        return np.broadcast_to(np.float64(self.timeout_s), np.shape(rtt_s)) + 0.0


def packet_error_rate(snr_linear, per_a: float, per_g: float):
    """PER(s) = min(1, a exp(-g s)) at instantaneous SNR(s) s (linear); a = 0 gives 0.
    Scalar in, float out; array in, array out."""
    if not (math.isfinite(per_a) and per_a >= 0 and math.isfinite(per_g) and per_g >= 0):
        raise ArqError(f"per_a and per_g must be finite and >= 0, got {per_a}, {per_g}")
    s = np.asarray(snr_linear, dtype=np.float64)
    if np.any(~(s >= 0)):
        raise ArqError("the SNR of a packet error rate must be >= 0 (linear)")
    out = np.minimum(1.0, per_a * np.exp(-per_g * s)) if per_a > 0 else np.zeros_like(s)
    return float(out) if out.ndim == 0 else out


def retransmission_parts(bits, rate_bps, per, rtt_s, arq: ArqSettings):
    """(expected timeout seconds, expected resent bits) of messages of ``bits`` [bit] under
    packet error rate(s) ``per`` (module docstring); broadcasts, arrays out."""
    b = np.asarray(bits, dtype=np.float64)
    p = np.asarray(per, dtype=np.float64)
    if np.any(~(b >= 0)) or np.any(~((p >= 0) & (p <= 1))):
        raise ArqError("bits must be >= 0 and per in [0, 1]")
    rtt = np.asarray(rtt_s, dtype=np.float64)
    timeout = np.asarray(arq.timeout(rtt), dtype=np.float64)
    packets = np.ceil(b / arq.packet_bits)
    shape = np.broadcast(b, p, timeout).shape
    waits, resent = np.zeros(shape), np.zeros(shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in range(1, arq.max_retransmissions + 1):
            lost_k = p**k  # a given packet lost k times in a row
            # P_k = 1 - (1 - p^k)^n, written to stay accurate for tiny p^k and many packets
            happens = np.where(packets > 0, -np.expm1(packets * np.log1p(-lost_k)), 0.0)
            waits = waits + timeout * happens
            resent = resent + b * lost_k
    return waits, resent


def expected_retransmission_s(bits, rate_bps, per, rtt_s, arq: ArqSettings):
    """E[T_retx] [s] of messages of ``bits`` [bit] sent at ``rate_bps`` [bit/s] under packet
    error rate(s) ``per``, RTT ``rtt_s`` [s] (module docstring); broadcasts. A message of no
    bits, or an error-free block, costs 0."""
    waits, resent = retransmission_parts(bits, rate_bps, per, rtt_s, arq)
    rate = np.asarray(rate_bps, dtype=np.float64)
    if np.any(~(rate > 0)):
        raise ArqError("rate_bps must be > 0")
    out = waits + resent / rate
    return float(out) if out.ndim == 0 else out
