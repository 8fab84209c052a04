"""Compute-time profiles and the CU-HLM per-token delay model (methods §3.1, 5 and 6).

Per token t of a hybrid (HLM-family) run,

    tau(t) = tau_SLM + tau_unc + tau_dev(t) + 1{upload(t)} * (B(t) / R(t) + tau_LLM + RTT)   [s]

with B(t) the uplink payload [bit] (B(k(t)) of ``edgespec.wireless.payload.upload_bits``), R(t) the
block-fading uplink rate [bit/s] of that token (``edgespec.wireless.channel``), tau_SLM, tau_LLM the
device and edge forward times, tau_unc the device's uncertainty estimate and tau_dev(t) its other
per-token vocabulary work (online k(t) selection, top-k extraction; the caller says which token
pays what), all from a ``LatencyProfile``. Token throughput = generated tokens / sum_t tau(t)
[tokens/s].

Compute times are never hard-coded: a profile is measured on the machine that runs the
workflow (``source="measured"``) or given in config to emulate other hardware.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from edgespec import checks


@dataclass(frozen=True)
class LatencyProfile:
    """Compute times of one device/edge hardware pair [s].

    ``draft_token_s``: one draft (SLM) forward producing one token on the device.
    ``target_token_s``: one target (LLM) forward for one token on the edge (tau_LLM of CU-HLM).
    ``target_verify_s``: gamma -> one target forward over gamma + 1 tokens (WISV verification
    of gamma draft tokens), for the gammas that were measured or configured.
    ``uncertainty_s``: the device's per-token uncertainty estimate u(t).
    ``online_k_s``: the device's online k(t) selection for one token (CU-HLM online: one sort of
    x and a search over every k).
    ``topk_s``: k -> one extraction of the top-k entries (values and indices) of x on the
    device; :meth:`topk_time` interpolates it (empty: free).
    ``source``: where the numbers come from, e.g. "measured" or "config".
    ``draft_prefill_token_s`` / ``target_prefill_token_s``: prompt prefill per prompt token of
    the draft (device) and the target (edge), charged once per answer (``prefill_s``).
    """

    draft_token_s: float
    target_token_s: float
    target_verify_s: Mapping[int, float] = field(default_factory=dict)
    uncertainty_s: float = 0.0
    source: str = "measured"
    online_k_s: float = 0.0
    topk_s: Mapping[int, float] = field(default_factory=dict)
    draft_prefill_token_s: float = 0.0
    target_prefill_token_s: float = 0.0

    def __post_init__(self) -> None:
        for key in (
            "draft_token_s",
            "target_token_s",
            "uncertainty_s",
            "online_k_s",
            "draft_prefill_token_s",
            "target_prefill_token_s",
        ):
            object.__setattr__(self, key, checks.seconds(key, getattr(self, key)))
        topk = checks.int_keyed_table("topk_s", self.topk_s)
        verify = checks.int_keyed_table("target_verify_s", self.target_verify_s, key="gamma")
        object.__setattr__(self, "topk_s", MappingProxyType(topk))
        object.__setattr__(self, "target_verify_s", MappingProxyType(verify))
        if not isinstance(self.source, str):
            raise ValueError(f"source must be a string, got {self.source!r}")

    def __hash__(self) -> int:
        return hash(
            (
                self.draft_token_s,
                self.target_token_s,
                tuple(self.target_verify_s.items()),
                self.uncertainty_s,
                self.source,
                self.online_k_s,
                tuple(self.topk_s.items()),
                self.draft_prefill_token_s,
                self.target_prefill_token_s,
            )
        )

    def topk_time(self, k) -> np.ndarray | float:
        """Seconds to extract the top-k of x for upload size(s) ``k``
        (:func:`topk_extraction_s` on ``topk_s``)."""
        return topk_extraction_s(self.topk_s, k)

    def prefill_s(self, prompt_tokens):
        """Prefill of a prompt of ``prompt_tokens`` tokens on both models [s]: the device's
        draft, then the edge's target (scalar or array, like its argument)."""
        out = np.asarray(prompt_tokens, dtype=float) * (
            self.draft_prefill_token_s + self.target_prefill_token_s
        )
        return float(out) if out.ndim == 0 else out

    def target_verify(self, gamma: int) -> float:
        """tau_LLM(gamma) [s]: the exact entry, or linear interpolation between the nearest
        measured gammas; a gamma outside the measured range raises ValueError (no
        extrapolation)."""
        known = list(self.target_verify_s)
        if not known:
            raise ValueError("this latency profile has no target_verify_s entries")
        if gamma in self.target_verify_s:
            return self.target_verify_s[gamma]
        if not known[0] < gamma < known[-1]:
            raise ValueError(
                f"gamma={gamma} lies outside the profiled gammas {known}; "
                f"measure or configure target_verify_s for it"
            )
        return float(np.interp(gamma, known, [self.target_verify_s[g] for g in known]))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LatencyProfile:
        """Build from a config or JSON mapping (gamma keys may be strings).

        A ``machine`` entry (where a measured profile was taken) is description only.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a latency profile must be a mapping, got {type(d).__name__}")
        d = {k: v for k, v in d.items() if k not in ("machine", "derivation")}
        valid = {
            "draft_token_s",
            "target_token_s",
            "target_verify_s",
            "uncertainty_s",
            "source",
            "online_k_s",
            "topk_s",
            "draft_prefill_token_s",
            "target_prefill_token_s",
        }
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"latency profile: unknown key(s) {unknown}; valid: {sorted(valid)}")
        for key in ("draft_token_s", "target_token_s"):
            if key not in d:
                raise ValueError(f"latency profile: missing required key {key!r}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping (gamma keys as strings) that ``from_dict`` reads back."""
        return {
            "draft_token_s": self.draft_token_s,
            "target_token_s": self.target_token_s,
            "target_verify_s": {str(g): s for g, s in self.target_verify_s.items()},
            "uncertainty_s": self.uncertainty_s,
            "source": self.source,
            "online_k_s": self.online_k_s,
            "topk_s": {str(k): v for k, v in self.topk_s.items()},
            "draft_prefill_token_s": self.draft_prefill_token_s,
            "target_prefill_token_s": self.target_prefill_token_s,
        }


def topk_extraction_s(table: Mapping[int, float], k):
    """Top-k extraction time [s] at upload size(s) ``k`` from a {k: seconds} table.

    Linear interpolation in log k between the tabulated sizes, constant beyond the first and
    last; the table is first made non-decreasing (running maximum), since extracting more
    entries never takes less time and a measured table carries timing noise. An empty table
    costs nothing. Returns a float for a scalar k, an array otherwise.
    """
    table = checks.int_keyed_table("topk_s", table)
    k_arr = np.asarray(k, dtype=np.float64)
    if np.any(~(k_arr >= 1)):
        raise ValueError("top-k sizes must be >= 1")
    if not table:
        out = np.zeros_like(k_arr)
    else:
        sizes = np.log(np.array(list(table), dtype=np.float64))
        seconds = np.maximum.accumulate(np.array(list(table.values()), dtype=np.float64))
        out = np.interp(np.log(k_arr), sizes, seconds)
    return float(out) if out.ndim == 0 else out


def _per_token(name: str, value, length: int) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != length):
        raise ValueError(f"{name} must be a scalar or have shape [{length}], got {arr.shape}")
    return np.broadcast_to(arr, (length,))


def tokenwise_delays(
    uploaded,
    upload_bits,
    rates_bps,
    profile: LatencyProfile,
    rtt_s,
    uses_uncertainty: bool,
    uses_draft: bool = True,
    uses_target_always: bool = False,
    downlink_bits: float = 0.0,
    resync_bits_per_skipped: float = 0.0,
    downlink_rate_bps=None,
    device_s=0.0,
    segment_starts=None,
) -> np.ndarray:
    """Per-token delays tau(t) [s], shape [T].

    ``uploaded`` bool [T]; ``upload_bits`` [T] payload B(t) [bit] (read only where uploaded);
    ``rates_bps`` [T] uplink rate R(t) [bit/s], > 0 where uploaded; ``rtt_s`` [s], scalar or
    [T]; ``downlink_rate_bps`` [bit/s], scalar or [T]; ``device_s`` [s], scalar or [T], the
    device's other vocabulary work per token (k selection, top-k extraction), hybrid mode only.
    The tokens are one sequence, or with ``segment_starts`` (increasing indices, the first 0)
    several sequences laid end to end: each starts at one of them, and nothing carries over
    from one sequence to the next (the same as calling this once per sequence).

    Modes:

    - hybrid (``uses_draft=True``, the HLM family; SLM-only is the case with no uploads):
      tau = tau_SLM + 1{uses_uncertainty} tau_unc + device_s
      + 1{upload} (B/R + tau_LLM + RTT + downlink_bits / R_dl).
      Skipped tokens are resynchronised by piggybacking ``resync_bits_per_skipped`` per
      skipped token on the next upload (at that upload's rate); skipped tokens after the last
      upload are never sent (nothing at the edge needs them).
    - LLM-only (``uses_draft=False, uses_target_always=True``): the edge generates alone,
      tau = tau_LLM + downlink_bits / R_dl.

    The downlink (the accepted or resampled token id) costs ``downlink_bits / downlink_rate_bps``
    when a downlink rate is given and nothing otherwise (the papers' convention);
    ``downlink_bits > 0`` without a downlink rate is an error rather than a silent zero.
    """
    up = np.asarray(uploaded)
    if up.ndim != 1 or up.dtype != bool:
        raise ValueError(f"uploaded must be a 1-D bool array, got dtype {up.dtype}, {up.shape}")
    length = up.shape[0]
    bits = _per_token("upload_bits", upload_bits, length)
    rates = _per_token("rates_bps", rates_bps, length)
    rtt = checks.nonneg_array("rtt_s", _per_token("rtt_s", rtt_s, length))
    device = checks.nonneg_array("device_s", _per_token("device_s", device_s, length))
    downlink_bits = float(downlink_bits)
    resync = float(resync_bits_per_skipped)
    if not (downlink_bits >= 0 and resync >= 0):
        raise ValueError("downlink_bits and resync_bits_per_skipped must be >= 0")
    if downlink_rate_bps is None:
        if downlink_bits > 0:
            raise ValueError("downlink_bits > 0 needs a downlink_rate_bps")
        downlink_s = np.zeros(length)
    else:
        dl_rate = _per_token("downlink_rate_bps", downlink_rate_bps, length)
        downlink_s = downlink_bits / checks.positive_array("downlink_rate_bps", dl_rate)

    if not uses_draft:
        if not uses_target_always:
            raise ValueError("uses_draft=False needs uses_target_always=True (LLM-only)")
        if np.any(device > 0):
            raise ValueError("LLM-only mode runs nothing on the device; device_s must be 0")
        if up.any():
            raise ValueError("LLM-only mode has no uplink; uploaded must be all False")
        # LLM-only: the edge decodes alone and streams each token id down; the stream is
        # pipelined with decoding, so no per-token RTT and no uplink of distributions.
        return profile.target_token_s + downlink_s
    if uses_target_always:
        raise ValueError(
            "uses_target_always is the LLM-only mode (set uses_draft=False); a hybrid run "
            "charges the target through its uploads"
        )

    if np.any(~(bits[up] >= 0)) or np.any(~np.isfinite(bits[up])):
        raise ValueError("upload_bits must be finite and >= 0 where a token is uploaded")
    if np.any(~(rates[up] > 0)):
        raise ValueError("rates_bps must be > 0 where a token is uploaded")
    tau = np.full(length, profile.draft_token_s, dtype=float) + device
    if uses_uncertainty:
        tau += profile.uncertainty_s
    index = np.flatnonzero(up)
    skipped_through = np.cumsum(~up)  # skipped tokens at or before each token
    # The last token before each upload whose skipped ids that upload does not carry: the
    # previous upload of the same sequence, or the token just before the sequence starts.
    before = np.concatenate([[-1], index[:-1]])[: index.size]
    if segment_starts is not None:
        starts = np.asarray(segment_starts, dtype=np.int64).reshape(-1)
        if (
            starts.size == 0
            or starts[0] != 0
            or np.any(np.diff(starts) <= 0)
            or (starts[-1] >= max(length, 1))
        ):
            raise ValueError(
                f"segment_starts must increase from 0 and stay below {length}, got {starts}"
            )
        start_of = starts[np.searchsorted(starts, index, side="right") - 1]
        before = np.maximum(before, start_of - 1)
    pending = skipped_through[index] - np.where(
        before >= 0, skipped_through[np.maximum(before, 0)], 0
    )
    payload = bits[index] + resync * pending
    tau[index] += payload / rates[index] + profile.target_token_s + rtt[index] + downlink_s[index]
    return tau


def throughput_tokens_per_s(num_tokens, delays) -> float:
    """Generated tokens / sum of delays [tokens/s] (methods §6)."""
    total = float(np.sum(np.asarray(delays, dtype=float)))
    if not (total > 0 and math.isfinite(total)):
        raise ValueError(f"total delay must be finite and > 0 s, got {total}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    return float(num_tokens) / total
