"""Pricing decoded CU-HLM token tables under a channel (methods §3.1, 5, 6); torch-free.

A variant's tokens do not depend on the channel, so the channel is swept without decoding
again: :func:`apply_channel` turns a token table (``edgespec.cuhlm.decode``) into per-token
delays under one channel condition, fading draw and latency profile, and :func:`price_variant`
repeats that over every channel of the sweep, every latency profile and K fading seeds.
Common random numbers: the normalised gain |h|^2 of the token at (prompt, position) under
fading seed s depends only on the fading model, s, the prompt and the position
(:func:`token_gains`), so every variant and every SNR sees the same draws.
:func:`variant_metrics` and :func:`relative_to` give the methods §6 metrics. This module imports
neither torch nor transformers, so the evaluation jobs start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgespec import checks
from edgespec.seeding import derive_seed
from edgespec.variants import CUHLM_VARIANTS as VARIANTS
from edgespec.variants import (
    ONLINE_K_VARIANTS,
    RECONSTRUCTION_SAMPLING_VARIANTS,
    TOPK_VARIANTS,
    UNCERTAINTY_VARIANTS,
)
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


def fading_base_seed(seed: int, condition: ChannelCondition) -> int:
    """The integer every fading draw of ``condition``'s fading model derives from: it depends
    on the configured seed and the fading model (and K-factor) only, not on the SNR."""
    return derive_seed(seed, "channel", condition.fading, condition.k_factor)


def token_gains(
    tokens: pd.DataFrame, condition: ChannelCondition, base_seed: int, seed_index: int = 0
) -> np.ndarray:
    """One block-fading power gain |h|^2 per token row, in the order of ``tokens``.

    Common random numbers: the gain of the token at (prompt p, position t) under fading seed
    ``seed_index`` is the t-th draw of a stream seeded from (``base_seed``, ``seed_index``,
    p's id). Two variants (or two SNRs of one fading model) priced with the same base seed
    therefore see the same gain at every (prompt, position, seed) they both have, whatever
    their completions' lengths; different seeds are independent realisations.
    """
    checks.integer("seed_index", seed_index, 0)
    gains = np.ones(len(tokens))
    if condition.fading == "awgn":
        return gains
    ids = tokens["prompt_id"].to_numpy()
    position = tokens["position"].to_numpy()
    for rows in _prompt_groups(tokens):
        pos = position[rows]
        if pos.min() < 0:
            raise ValueError("token positions must be >= 0")
        stream = np.random.default_rng(
            derive_seed(int(base_seed), "gain", int(seed_index), ids[rows[0]])
        )
        draws = sample_power_gains(condition, int(pos.max()) + 1, stream)
        gains[rows] = draws[pos]
    return gains


def device_seconds(
    tokens: pd.DataFrame,
    variant: str,
    profile: LatencyProfile,
    vocab_size: int,
    sampling_k: int | None = None,
) -> np.ndarray:
    """The device's per-token vocabulary work beyond the uncertainty estimate [s].

    - top-k variants (:data:`~edgespec.variants.TOPK_VARIANTS`): one top-k extraction
      (``profile.topk_time(k)``) per uploaded token with k < |V|;
    - ``cuhlm_online`` also pays one online k(t) selection (``profile.online_k_s``) per
      uploaded token;
    - ``cuhlm_exact`` draws every token, skipped or not, from x_hat of ``sampling_k``, so it
      pays one top-k extraction per token (its uploads reuse it).
    """
    extra = np.zeros(len(tokens))
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    if variant in RECONSTRUCTION_SAMPLING_VARIANTS:
        if sampling_k is None:
            raise ValueError(f"variant {variant!r} needs the sampling_k its device draws from")
        if not 1 <= sampling_k <= vocab_size:
            raise ValueError(f"sampling_k must lie in [1, {vocab_size}], got {sampling_k}")
        if sampling_k < vocab_size:
            extra += profile.topk_time(sampling_k)
        return extra
    if variant in TOPK_VARIANTS:
        compressed = uploaded & (k < vocab_size)
        if compressed.any():
            extra[compressed] += profile.topk_time(k[compressed])
    if variant in ONLINE_K_VARIANTS:
        extra[uploaded] += profile.online_k_s
    return extra


def apply_channel(
    tokens: pd.DataFrame,
    variant: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    vocab_size: int,
    prob_bits: int,
    gains,
    uses_uncertainty: bool,
    *,
    sampling_k: int | None = None,
    resync_bits_per_skipped: float = 0.0,
    downlink_bits: float = 0.0,
    downlink_rate_bps=None,
    prompt_groups: list[np.ndarray] | None = None,
) -> np.ndarray:
    """Per-token delays tau(t) [s] of ``tokens`` under one channel, in the order of ``tokens``.

    Per prompt (rows ordered by position), :func:`edgespec.wireless.delay.tokenwise_delays` with
    B(t) = k (b_p + ceil(log2 |V|)) on uploads (``payload.upload_bits``), R(t) from the
    token's power gain in ``gains`` (one per row, e.g. :func:`token_gains`) and the condition's
    average SNR, the condition's RTT, and the device's vocabulary work
    (:func:`device_seconds`). ``llm_only`` uses the LLM-only mode (tau_LLM per token, no
    uplink); ``slm_only`` and every skipped token pay tau_SLM (+ tau_unc when
    ``uses_uncertainty``, see :func:`uses_uncertainty`). Skipped token ids ride on the next
    upload (``resync_bits_per_skipped`` each); the downlink is free unless a
    ``downlink_rate_bps`` is given (the papers' convention). ``prompt_groups``: the rows of
    each prompt in position order, when the caller has them already (many channels, one table).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    if variant in ("llm_only", "slm_only") and uploaded.any():
        raise ValueError(f"variant {variant!r} has no uploads, but the table marks some")
    if np.any(k[uploaded] < 1) or np.any(k[uploaded] > vocab_size):
        raise ValueError(f"uploaded rows need 1 <= k <= |V| = {vocab_size}")
    gains = np.asarray(gains, dtype=float).reshape(-1)
    if gains.shape != (len(tokens),):
        raise ValueError(f"gains must have one entry per token row ({len(tokens)})")
    rates = np.asarray(uplink_rate_bps(condition, gains), dtype=float).reshape(-1)
    bits = np.where(uploaded, upload_bits(k, vocab_size, prob_bits), 0).astype(float)
    llm_only = variant == "llm_only"
    device = (
        np.zeros(len(tokens))
        if llm_only
        else device_seconds(tokens, variant, profile, vocab_size, sampling_k)
    )
    # Every prompt's rows, in position order, laid end to end: one call prices them all.
    groups = _prompt_groups(tokens) if prompt_groups is None else prompt_groups
    delays = np.zeros(len(tokens))
    if not groups:
        return delays
    order = np.concatenate(groups)
    starts = np.cumsum([0] + [len(rows) for rows in groups[:-1]])
    dl_rate = downlink_rate_bps
    if dl_rate is not None and np.ndim(dl_rate) == 1:
        dl_rate = np.asarray(dl_rate, dtype=float)[order]
    delays[order] = tokenwise_delays(
        uploaded[order],
        bits[order],
        rates[order],
        profile,
        condition.rtt_s,
        uses_uncertainty,
        uses_draft=not llm_only,
        uses_target_always=llm_only,
        downlink_bits=downlink_bits,
        resync_bits_per_skipped=0.0 if llm_only else resync_bits_per_skipped,
        downlink_rate_bps=dl_rate,
        device_s=device[order],
        segment_starts=starts,
    )
    return delays


def price_variant(
    tokens: pd.DataFrame,
    variant: str,
    conditions: Mapping[str, ChannelCondition],
    profiles: Mapping[str, LatencyProfile],
    vocab_size: int,
    prob_bits: int,
    seed: int,
    fading_seeds: int,
    *,
    sampling_k: int | None = None,
) -> pd.DataFrame:
    """The methods §6 metrics of one decoded variant under every channel condition, latency
    profile and fading seed: one row per (channel, profile, seed).

    Columns ``channel``, ``fading``, ``snr_db``, ``profile``, ``seed`` (0..K-1) and those of
    :func:`variant_metrics`. The gains of a fading model and seed are drawn once
    (:func:`token_gains` from :func:`fading_base_seed`) and shared by every SNR and profile.
    """
    fading_seeds = checks.integer("fading_seeds", fading_seeds)
    if not conditions or not profiles:
        raise ValueError("need at least one channel condition and one latency profile")
    unc = uses_uncertainty(variant)
    groups = _prompt_groups(tokens)
    table = _TableMetrics.of(tokens, vocab_size, prob_bits)
    rows: list[dict[str, Any]] = []
    for index in range(int(fading_seeds)):
        cached: dict[tuple, np.ndarray] = {}  # one draw per fading model and seed
        for name, condition in conditions.items():
            key = (condition.fading, condition.k_factor, condition.correlation)
            if key not in cached:
                base = fading_base_seed(seed, condition)
                cached[key] = token_gains(tokens, condition, base, index)
            gains = cached[key]
            for profile_name, profile in profiles.items():
                delays = apply_channel(
                    tokens,
                    variant,
                    condition,
                    profile,
                    vocab_size,
                    prob_bits,
                    gains,
                    unc,
                    sampling_k=sampling_k,
                    prompt_groups=groups,
                )
                rows.append(
                    {
                        "variant": variant,
                        "channel": name,
                        "fading": condition.fading,
                        "snr_db": condition.mean_snr_db(),
                        "profile": profile_name,
                        "seed": index,
                        **table.with_delays(delays),
                    }
                )
    return pd.DataFrame(rows)


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
    and ``mean_k`` over uploads; ``measured_tvd_mean`` (TVD(r, r_hat)), ``output_tvd_mean``
    (TVD(y_hat, y), the output distortion) and ``acceptance_rate`` over uploads;
    ``uploads``, ``num_prompts`` and ``interaction_rounds_per_answer`` (uploads per prompt).
    """
    return _TableMetrics.of(tokens, vocab_size, prob_bits, resync_bits_per_skipped).with_delays(
        delays
    )


@dataclass(frozen=True)
class _TableMetrics:
    """What :func:`variant_metrics` reads of a token table, computed once for many delays (a
    variant priced under every channel, profile and seed): the metrics that do not depend on
    the delays, and which prompt each row belongs to."""

    counts: dict[str, int]
    rates: dict[str, float]
    prompt_codes: np.ndarray

    @classmethod
    def of(
        cls,
        tokens: pd.DataFrame,
        vocab_size: int,
        prob_bits: int,
        resync_bits_per_skipped: float = 0.0,
    ) -> _TableMetrics:
        n = len(tokens)
        uploaded = tokens["uploaded"].to_numpy().astype(bool)
        skipped = tokens["skipped"].to_numpy().astype(bool)
        k = tokens["k"].to_numpy().astype(np.int64)
        codes, uniques = pd.factorize(tokens["prompt_id"], sort=False)
        num_prompts = len(uniques)
        bits = float(np.sum(upload_bits(k[uploaded], vocab_size, prob_bits)))
        if resync_bits_per_skipped:
            bits += float(resync_bits_per_skipped) * _resync_count(tokens)
        accept_prob = tokens["accept_prob"].to_numpy(dtype=float)[skipped]
        mean_k = _mean(k[uploaded].astype(float))
        counts = {"tokens": n, "num_prompts": num_prompts, "uploads": int(uploaded.sum())}
        rates = {
            "uplink_bits_per_token": bits / n if n else float("nan"),
            "uplink_bytes_per_token": bits / 8 / n if n else float("nan"),
            "skip_rate": _mean(skipped.astype(float)),
            "transmission_rate": _mean(uploaded.astype(float)),
            "true_skip_rate": _mean(accept_prob) if accept_prob.size else float("nan"),
            "vocab_compression": 1.0 - mean_k / vocab_size,
            "mean_k": mean_k,
            "measured_tvd_mean": _mean(tokens["measured_tvd"].to_numpy(dtype=float)[uploaded]),
            "output_tvd_mean": _mean(tokens["output_tvd"].to_numpy(dtype=float)[uploaded]),
            "acceptance_rate": _mean(tokens["accepted"].to_numpy().astype(float)[uploaded]),
            "interaction_rounds_per_answer": (
                float(uploaded.sum()) / num_prompts if num_prompts else float("nan")
            ),
        }
        return cls(counts, rates, codes)

    def with_delays(self, delays) -> dict[str, float]:
        """Every metric, in :func:`variant_metrics`' order, for these per-row delays [s]."""
        delays = np.asarray(delays, dtype=float)
        n, num_prompts = self.counts["tokens"], self.counts["num_prompts"]
        if delays.shape != (n,):
            raise ValueError(f"delays must have shape [{n}], got {delays.shape}")
        total = float(delays.sum())
        per_prompt = np.bincount(self.prompt_codes, weights=delays, minlength=num_prompts)
        timed = {
            "total_delay_s": total,
            "throughput_tps": n / total if total > 0 else float("nan"),
            "mean_token_latency_s": _mean(delays),
            "end_to_end_latency_s": float(per_prompt.mean()) if num_prompts else float("nan"),
        }
        return {**self.counts, **timed, **self.rates}


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
