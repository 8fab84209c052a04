"""Pricing decoded WISV rounds under a channel (methods §4.3, 5, 6); torch-free.

A round's acceptance outcome does not depend on timing, so a decoded round table is priced
under any channel afterwards: :func:`round_latencies` applies the variant's upload protocol
(``VARIANT_PROTOCOL``: ids only, full-hidden or selective-hidden, ``edgespec.wisv.protocols``)
to each round's mismatch count and uplink rate, :func:`round_uplink_bits` counts its bits and
:func:`wisv_metrics` gives the run-level metrics. :func:`draw_round_gains` draws the
block-fading gains indexed by (prompt, round), the common random numbers every variant shares.
This module imports neither torch nor transformers, so the many small evaluation jobs start fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.variants import WISV_VARIANTS
from edgespec.wireless.channel import (
    ChannelCondition,
    sample_power_gains,
)
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.protocols import (
    RoundPayload,
    fh_payload,
    round_latency,
    sh_payload,
    vanilla_payload,
)

VARIANTS = WISV_VARIANTS
HEAD_VARIANTS = ("head_no_csi", "wisv_fh", "wisv_sh")
VARIANT_PROTOCOL = {
    "vanilla_sd": "ids",
    "topk_accept": "ids",
    "head_no_csi": "fh",
    "wisv_fh": "fh",
    "wisv_sh": "sh",
}
"""Uplink protocol of each variant: ids only (vanilla payload), full-hidden or selective."""


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown WISV variant {variant!r}; expected one of {VARIANTS}")
    return variant


def draw_round_gains(
    condition: ChannelCondition, num_prompts: int, max_rounds: int, rng: np.random.Generator
) -> np.ndarray:
    """The [num_prompts, max_rounds] block-fading gains |h|^2, entry (i, r) for prompt i's
    round r, drawn row-major in one call: the same rng state gives the same gain to the same
    (prompt, round) in every variant (common random numbers)."""
    gains = sample_power_gains(condition, num_prompts * max_rounds, rng)
    return np.asarray(gains, dtype=np.float64).reshape(num_prompts, max_rounds)


def _protocol_param(params: Mapping[str, Any], key: str, default: Any = None) -> int:
    if key in params:
        return int(params[key])
    if default is None:
        raise KeyError(f"protocol_params lacks {key!r}")
    return int(default)


def _payload(variant: str, gamma: int, mismatches: int, params: Mapping[str, Any]) -> RoundPayload:
    vocab = _protocol_param(params, "vocab_size")
    protocol = VARIANT_PROTOCOL[check_variant(variant)]
    if protocol == "ids":
        return vanilla_payload(gamma, vocab)
    hidden = _protocol_param(params, "hidden_size")
    bits = _protocol_param(params, "bits_per_value", 16)
    if protocol == "fh":
        return fh_payload(gamma, vocab, hidden, bits)
    return sh_payload(gamma, mismatches, vocab, hidden, bits)


def _check_rounds(rounds: pd.DataFrame, gamma: int) -> None:
    missing = {"num_drafted", "num_mismatches", "rate_bps"} - set(rounds.columns)
    if missing:
        raise ValueError(f"rounds lacks column(s) {sorted(missing)}")
    if len(rounds) and not (rounds["num_drafted"] == gamma).all():
        raise ValueError(f"rounds were not drafted with gamma={gamma}")


def round_uplink_bits(
    rounds: pd.DataFrame, variant: str, protocol_params: Mapping[str, Any], gamma: int
) -> np.ndarray:
    """All uplink bits of each round under the variant's protocol [bit] (``VARIANT_PROTOCOL``)."""
    _check_rounds(rounds, gamma)
    m = rounds["num_mismatches"].to_numpy(dtype=np.int64)
    out = np.zeros(len(rounds), dtype=np.float64)
    for value in np.unique(m):
        out[m == value] = _payload(variant, gamma, int(value), protocol_params).total_uplink_bits
    return out


def round_latencies(
    rounds: pd.DataFrame,
    variant: str,
    protocol_params: Mapping[str, Any],
    profile: LatencyProfile,
    rtt_s: float,
    gamma: int,
    head_s: float = 0.0,
    downlink_rate_bps: float | None = None,
) -> np.ndarray:
    """Latency of each round [s] (``protocols.round_latency``), shape [len(rounds)].

    ``protocol_params``: vocab_size, hidden_size (the draft's), bits_per_value (default 16).
    vanilla_sd and topk_accept upload ids only; head_no_csi and wisv_fh the FH payload (ids and
    all gamma hidden states); wisv_sh the SH payload of the round's mismatch count (an extra
    round trip iff it is > 0). Compute: gamma * ``profile.draft_token_s`` and
    ``profile.target_verify(gamma)``; ``head_s`` (decision-head time, default 0) is charged to
    head variants in rounds with a mismatch. The uplink runs at the round's ``rate_bps``.
    """
    _check_rounds(rounds, gamma)
    m = rounds["num_mismatches"].to_numpy(dtype=np.int64)
    rate = rounds["rate_bps"].to_numpy(dtype=np.float64)
    verify_s = profile.target_verify(gamma)
    out = np.zeros(len(rounds), dtype=np.float64)
    for value in np.unique(m):
        sel = m == value
        extra = head_s if (variant in HEAD_VARIANTS and value > 0) else 0.0
        out[sel] = round_latency(
            _payload(variant, gamma, int(value), protocol_params),
            rate[sel],
            rtt_s,
            gamma,
            profile.draft_token_s,
            verify_s,
            extra_verify_s=extra,
            downlink_rate_bps=downlink_rate_bps,
        )
    return out


def wisv_metrics(rounds: pd.DataFrame, latencies: Any, uplink_bits: Any = None) -> dict[str, float]:
    """Run-level metrics of one (variant, condition) (methods §6).

    aal: tokens committed per round (bonus/repair included); rounds_per_answer: rounds per
    prompt; e2e_latency_s: mean over prompts of the summed round latencies; throughput_tok_s:
    committed tokens / total latency; acceptance_rate: accepted / drafted draft tokens;
    semantic_accept_fraction: committed mismatched drafts / accepted drafts; mismatch_rate:
    mismatches / drafted; uplink_bytes_per_round and uplink_bytes_per_token (committed) from
    ``uplink_bits`` (``round_uplink_bits``; NaN when not given). Also num_prompts,
    num_rounds, num_tokens, total_latency_s.
    """
    lat = np.asarray(latencies, dtype=np.float64).reshape(-1)
    if len(lat) != len(rounds):
        raise ValueError(f"{len(lat)} latencies for {len(rounds)} rounds")
    if len(rounds) == 0:
        raise ValueError("no rounds")
    committed = rounds["num_committed"].to_numpy(dtype=np.float64)
    accepted = float(rounds["num_accepted"].sum())
    drafted = float(rounds["num_drafted"].sum())
    tokens = float(committed.sum())
    total = float(lat.sum())
    per_prompt = pd.Series(lat).groupby(rounds["prompt_id"].to_numpy()).sum()
    num_prompts = int(rounds["prompt_id"].nunique())
    if uplink_bits is None:
        up_round = up_token = math.nan
    else:
        bits = np.asarray(uplink_bits, dtype=np.float64).reshape(-1)
        if len(bits) != len(rounds):
            raise ValueError(f"{len(bits)} uplink sizes for {len(rounds)} rounds")
        up_round = float(bits.sum() / 8 / len(rounds))
        up_token = float(bits.sum() / 8 / tokens) if tokens > 0 else math.nan
    return {
        "num_prompts": num_prompts,
        "num_rounds": int(len(rounds)),
        "num_tokens": int(tokens),
        "aal": tokens / len(rounds),
        "rounds_per_answer": len(rounds) / num_prompts,
        "e2e_latency_s": float(per_prompt.mean()),
        "total_latency_s": total,
        "throughput_tok_s": tokens / total if total > 0 else math.nan,
        "acceptance_rate": accepted / drafted if drafted > 0 else math.nan,
        "semantic_accept_fraction": (
            float(rounds["num_semantic_accepts"].sum()) / accepted if accepted > 0 else 0.0
        ),
        "mismatch_rate": float(rounds["num_mismatches"].sum()) / drafted if drafted else math.nan,
        "uplink_bytes_per_round": up_round,
        "uplink_bytes_per_token": up_token,
    }
