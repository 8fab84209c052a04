"""Pricing decoded CU-HLM token tables under a channel (methods §3.1, 5, 6); torch-free.

A variant's tokens do not depend on the channel, so the channel is swept without decoding
again: :func:`apply_channel` turns a token table (``edgespec.cuhlm.decode``) into per-token
delays under one channel condition and latency profile (block fading, one draw per token,
common random numbers indexed by prompt and position); :func:`variant_metrics` and
:func:`relative_to` give the methods §6 metrics. This module imports neither torch nor
transformers, so the many small evaluation jobs start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.seeding import derive_seed
from edgespec.variants import CUHLM_VARIANTS as VARIANTS
from edgespec.variants import UNCERTAINTY_VARIANTS
from edgespec.wireless.channel import ChannelCondition, sample_power_gains, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile, tokenwise_delays
from edgespec.wireless.payload import upload_bits

RELATIVE_KEYS = ("exact_match", "semantic_accuracy", "similarity_to_llm", "answer_fidelity")
"""Quality metrics that :func:`relative_to` also expresses as a fraction of the reference's."""


def uses_uncertainty(variant: str) -> bool:
    """Whether the device computes u(t) to decide, so tau_unc is charged per token."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return variant in UNCERTAINTY_VARIANTS


def _prompt_groups(tokens: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of each prompt (in order of first appearance), sorted by position."""
    codes, _ = pd.factorize(tokens["prompt_id"], sort=False)
    position = tokens["position"].to_numpy()
    order = np.lexsort((position, codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    return np.split(order, bounds) if len(order) else []


def token_gains(tokens: pd.DataFrame, condition: ChannelCondition, rng) -> np.ndarray:
    """One block-fading power gain |h|^2 per token row, in the order of ``tokens``.

    Common random numbers: one integer is drawn from ``rng``; the gain of the token at
    (prompt p, position t) is the t-th draw of a stream seeded from that integer and p's id.
    Two variants evaluated with equally seeded ``rng`` therefore see the same gain at every
    (prompt, position) they both generate, whatever their other completions' lengths; in
    particular two tables with equal token counts per prompt see the same draws.
    """
    gains = np.ones(len(tokens))
    if condition.fading == "awgn":
        return gains
    base = int(rng.integers(0, 2**63 - 1))
    ids = tokens["prompt_id"].to_numpy()
    position = tokens["position"].to_numpy()
    for rows in _prompt_groups(tokens):
        pos = position[rows]
        if pos.min() < 0:
            raise ValueError("token positions must be >= 0")
        stream = np.random.default_rng(derive_seed(base, "gain", ids[rows[0]]))
        draws = sample_power_gains(condition, int(pos.max()) + 1, stream)
        gains[rows] = draws[pos]
    return gains


def apply_channel(
    tokens: pd.DataFrame,
    variant: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    vocab_size: int,
    prob_bits: int,
    rng: np.random.Generator,
    uses_uncertainty: bool,
    *,
    resync_bits_per_skipped: float = 0.0,
    downlink_bits: float = 0.0,
    downlink_rate_bps=None,
) -> np.ndarray:
    """Per-token delays tau(t) [s] of ``tokens`` under one channel, in the order of ``tokens``.

    Per prompt (rows ordered by position), :func:`edgespec.wireless.delay.tokenwise_delays` with
    B(t) = k (b_p + ceil(log2 |V|)) on uploads (``compression.upload_bits``), R(t) from the
    token's gain (:func:`token_gains`: one block-fading draw per token, common random numbers)
    and the condition's RTT. ``llm_only`` uses the LLM-only mode (tau_LLM per token, no
    uplink); ``slm_only`` and every skipped token pay tau_SLM (+ tau_unc when
    ``uses_uncertainty``, see :func:`uses_uncertainty`). Skipped token ids ride on the next
    upload (``resync_bits_per_skipped`` each); the downlink is free unless a
    ``downlink_rate_bps`` is given (the papers' convention).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    if variant in ("llm_only", "slm_only") and uploaded.any():
        raise ValueError(f"variant {variant!r} has no uploads, but the table marks some")
    if np.any(k[uploaded] < 1) or np.any(k[uploaded] > vocab_size):
        raise ValueError(f"uploaded rows need 1 <= k <= |V| = {vocab_size}")
    gains = token_gains(tokens, condition, rng)
    rates = np.asarray(uplink_rate_bps(condition, gains), dtype=float).reshape(-1)
    bits = np.where(uploaded, upload_bits(k, vocab_size, prob_bits), 0).astype(float)
    delays = np.zeros(len(tokens))
    llm_only = variant == "llm_only"
    for rows in _prompt_groups(tokens):
        dl_rate = downlink_rate_bps
        if dl_rate is not None and np.ndim(dl_rate) == 1:
            dl_rate = np.asarray(dl_rate, dtype=float)[rows]
        delays[rows] = tokenwise_delays(
            uploaded[rows],
            bits[rows],
            rates[rows],
            profile,
            condition.rtt_s,
            uses_uncertainty,
            uses_draft=not llm_only,
            uses_target_always=llm_only,
            downlink_bits=downlink_bits,
            resync_bits_per_skipped=0.0 if llm_only else resync_bits_per_skipped,
            downlink_rate_bps=dl_rate,
        )
    return delays


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else float("nan")


def _resync_count(tokens: pd.DataFrame) -> int:
    """Skipped tokens that are followed by an upload of the same prompt (and so resent)."""
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    skipped = tokens["skipped"].to_numpy().astype(bool)
    total = 0
    for rows in _prompt_groups(tokens):
        up = uploaded[rows]
        if up.any():
            last = np.flatnonzero(up)[-1]
            total += int(skipped[rows][:last].sum())
    return total


def variant_metrics(
    tokens: pd.DataFrame,
    delays,
    vocab_size: int,
    prob_bits: int,
    *,
    resync_bits_per_skipped: float = 0.0,
) -> dict[str, float]:
    """The methods §6 metrics a token table and its delays give (one definition each).

    ``tokens``: generated tokens; ``total_delay_s``; ``throughput_tps`` = tokens / total
    delay; ``mean_token_latency_s``; ``end_to_end_latency_s`` (mean over prompts of the summed
    delay); ``uplink_bits_per_token`` (upload payloads, plus resynchronised skipped ids when
    ``resync_bits_per_skipped`` > 0, over all tokens) and ``uplink_bytes_per_token``;
    ``skip_rate`` and ``transmission_rate`` (fractions of tokens skipped / uploaded);
    ``true_skip_rate`` (mean accept_prob over skipped tokens: the fraction the LLM would have
    accepted; NaN if none skipped or no target ran); ``vocab_compression`` = 1 - mean k / |V|
    and ``mean_k`` over uploads; ``measured_tvd_mean`` and ``acceptance_rate`` over uploads;
    ``uploads``, ``num_prompts`` and ``interaction_rounds_per_answer`` (uploads per prompt).
    """
    delays = np.asarray(delays, dtype=float)
    n = len(tokens)
    if delays.shape != (n,):
        raise ValueError(f"delays must have shape [{n}], got {delays.shape}")
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    skipped = tokens["skipped"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    num_prompts = int(tokens["prompt_id"].nunique())
    total = float(delays.sum())
    per_prompt = pd.Series(delays).groupby(tokens["prompt_id"].to_numpy(), sort=False).sum()
    bits = float(np.sum(upload_bits(k[uploaded], vocab_size, prob_bits)))
    if resync_bits_per_skipped:
        bits += float(resync_bits_per_skipped) * _resync_count(tokens)
    accept_prob = tokens["accept_prob"].to_numpy(dtype=float)[skipped]
    mean_k = _mean(k[uploaded].astype(float))
    return {
        "tokens": n,
        "num_prompts": num_prompts,
        "uploads": int(uploaded.sum()),
        "total_delay_s": total,
        "throughput_tps": n / total if total > 0 else float("nan"),
        "mean_token_latency_s": _mean(delays),
        "end_to_end_latency_s": float(per_prompt.mean()) if num_prompts else float("nan"),
        "uplink_bits_per_token": bits / n if n else float("nan"),
        "uplink_bytes_per_token": bits / 8 / n if n else float("nan"),
        "skip_rate": _mean(skipped.astype(float)),
        "transmission_rate": _mean(uploaded.astype(float)),
        "true_skip_rate": _mean(accept_prob) if accept_prob.size else float("nan"),
        "vocab_compression": 1.0 - mean_k / vocab_size,
        "mean_k": mean_k,
        "measured_tvd_mean": _mean(tokens["measured_tvd"].to_numpy(dtype=float)[uploaded]),
        "acceptance_rate": _mean(tokens["accepted"].to_numpy().astype(float)[uploaded]),
        "interaction_rounds_per_answer": (
            float(uploaded.sum()) / num_prompts if num_prompts else float("nan")
        ),
    }


def _ratio(a, b) -> float:
    a, b = float(a), float(b)
    if not (np.isfinite(a) and np.isfinite(b)) or b == 0:
        return float("nan")
    return a / b


def relative_to(
    metrics_by_variant: Mapping[str, Mapping[str, Any]], reference: str = "hlm"
) -> dict[str, dict[str, Any]]:
    """Copies of the metrics with ratios to ``reference``'s (HLM for CU-HLM) added.

    ``throughput_gain`` (throughput / reference's), ``latency_ratio`` (mean token latency),
    ``end_to_end_latency_ratio``, ``uplink_bits_ratio``, ``uploads_ratio``, and
    ``relative_<m>`` (m / reference's m) for each quality metric in :data:`RELATIVE_KEYS` that
    both carry (e.g. "97.4% of HLM accuracy"). NaN where a ratio is undefined.
    """
    if reference not in metrics_by_variant:
        raise KeyError(f"reference variant {reference!r} is not among {sorted(metrics_by_variant)}")
    ref = metrics_by_variant[reference]
    pairs = {
        "throughput_gain": "throughput_tps",
        "latency_ratio": "mean_token_latency_s",
        "end_to_end_latency_ratio": "end_to_end_latency_s",
        "uplink_bits_ratio": "uplink_bits_per_token",
        "uploads_ratio": "transmission_rate",
    }
    out: dict[str, dict[str, Any]] = {}
    for variant, metrics in metrics_by_variant.items():
        row = dict(metrics)
        for name, key in pairs.items():
            if key in metrics and key in ref:
                row[name] = _ratio(metrics[key], ref[key])
        for key in RELATIVE_KEYS:
            if key in metrics and key in ref:
                row[f"relative_{key}"] = _ratio(metrics[key], ref[key])
        out[variant] = row
    return out
