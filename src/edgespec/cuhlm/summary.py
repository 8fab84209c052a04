"""CU-HLM figures with their spread (methods §6, reporting); torch-free.

Three sources of numbers, each with its own interval (``edgespec.intervals``):

- delay-based figures (throughput, latencies, and their ratios to HLM) come from
  ``evaluate.price_variant`` under K fading seeds; the gain of a variant is computed per seed
  against HLM under the *same* fading draws (common random numbers), then reported as the
  median over seeds with a central interval (:func:`seed_summary`);
- token-level fractions of a decoded table (skip rate, vocabulary compression, distortions,
  acceptance) are ratios of sums over prompts, with a percentile bootstrap over prompts
  (:func:`token_statistics`);
- accuracy-type figures (exact match, pass@1, semantic accuracy, fidelity, and their ratios to
  HLM, paired by prompt) get a bootstrap over prompts too, and beside each its noise floor
  (HLM's, a lossless method's, on the same prompts) and minimum detectable difference
  (:func:`quality_statistics`).

:func:`summary_table` joins them into one row per (variant, channel, latency profile) with
``<metric>``, ``<metric>_lo`` and ``<metric>_hi`` columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from edgespec.intervals import (
    POWER,
    bootstrap_interval,
    detectable_difference,
    effect_sd,
    paired_effects,
    seed_interval,
)
from edgespec.seeding import numpy_rng
from edgespec.wireless.payload import upload_bits

DELAY_METRICS = ("throughput_tps", "mean_token_latency_s", "end_to_end_latency_s")
"""Per-seed metrics that depend on the fading draws and the latency profile."""

GAIN_METRICS = {
    "throughput_gain": "throughput_tps",
    "latency_ratio": "mean_token_latency_s",
    "end_to_end_latency_ratio": "end_to_end_latency_s",
}
"""Ratio to the reference variant's figure under the same channel, profile and fading seed."""

QUALITY_METRICS = (
    "exact_match",
    "pass_at_1",
    "semantic_accuracy",
    "similarity_to_llm",
    "answer_fidelity",
)

SELF_REFERENCED = {"similarity_to_llm": "llm_only", "answer_fidelity": "llm_only"}
"""Quality metrics scored against a variant's own output: that variant has no figure of them
(it would be 1 by construction)."""

TOKEN_METRICS = (
    "skip_rate",
    "transmission_rate",
    "true_skip_rate",
    "vocab_compression",
    "mean_k",
    "uplink_bytes_per_token",
    "measured_tvd_mean",
    "output_tvd_mean",
    "acceptance_rate",
)

KEYS = ["variant", "channel", "fading", "snr_db", "profile"]


def seed_relative(metrics: pd.DataFrame, reference: str = "hlm") -> pd.DataFrame:
    """``metrics`` (one row per variant, channel, profile and seed) with :data:`GAIN_METRICS`
    added: each seed's figure over the reference's under the same channel, profile and seed."""
    missing = [
        c for c in ["variant", "channel", "profile", "seed", *DELAY_METRICS] if c not in metrics
    ]
    if missing:
        raise KeyError(f"metrics lack columns {missing}")
    ref = metrics[metrics["variant"] == reference]
    if ref.empty:
        raise KeyError(
            f"reference variant {reference!r} is not among {sorted(set(metrics.variant))}"
        )
    ref = ref[["channel", "profile", "seed", *DELAY_METRICS]].rename(
        columns={c: f"{c}__ref" for c in DELAY_METRICS}
    )
    out = metrics.merge(ref, on=["channel", "profile", "seed"], how="left", validate="m:1")
    for gain, column in GAIN_METRICS.items():
        den = out[f"{column}__ref"].to_numpy(float)
        num = out[column].to_numpy(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[gain] = np.where(
                np.isfinite(num) & np.isfinite(den) & (den != 0), num / den, np.nan
            )
    return out.drop(columns=[f"{c}__ref" for c in DELAY_METRICS])


def seed_summary(relative: pd.DataFrame, level: float) -> pd.DataFrame:
    """Median and central ``level`` interval over fading seeds of every delay and gain metric,
    one row per (variant, channel, profile); ``fading_seeds`` counts the seeds."""
    columns = [*DELAY_METRICS, *GAIN_METRICS]
    rows = []
    for key, group in relative.groupby(KEYS, sort=False):
        row = dict(zip(KEYS, key, strict=True))
        row["fading_seeds"] = int(group["seed"].nunique())
        for column in columns:
            row.update(seed_interval(group[column], level).as_dict(column))
        rows.append(row)
    return pd.DataFrame(rows)


def _ratio_of_sums(
    num: np.ndarray, den: np.ndarray, rng: np.random.Generator, level: float, samples: int
) -> dict[str, float]:
    """sum(num) / sum(den) over prompts, with a bootstrap over prompts (NaN where undefined;
    resamples whose denominator is 0, e.g. no upload among the drawn prompts, are dropped)."""
    num, den = np.asarray(num, float), np.asarray(den, float)

    def statistic(index: np.ndarray) -> np.ndarray:  # [resamples, n] -> [resamples]
        idx = index.astype(np.int64)
        total = den[idx].sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total != 0, num[idx].sum(-1) / total, np.nan)

    if len(num) == 0 or den.sum() == 0:
        return {"point": np.nan, "low": np.nan, "high": np.nan}
    interval = bootstrap_interval(
        np.arange(len(num), dtype=float), rng, level, samples, statistic=statistic, vectorized=True
    )
    return {"point": interval.point, "low": interval.low, "high": interval.high}


def _per_prompt_sums(tokens: pd.DataFrame, vocab_size: int, prob_bits: int) -> pd.DataFrame:
    uploaded = tokens["uploaded"].to_numpy(bool)
    skipped = tokens["skipped"].to_numpy(bool)
    k = tokens["k"].to_numpy(np.int64)
    frame = pd.DataFrame(
        {
            "prompt_id": tokens["prompt_id"].to_numpy(),
            "tokens": 1.0,
            "skipped": skipped.astype(float),
            "uploaded": uploaded.astype(float),
            "k_up": np.where(uploaded, k, 0).astype(float),
            "bytes": np.where(uploaded, upload_bits(k, vocab_size, prob_bits) / 8.0, 0.0),
            "measured_tvd": np.where(uploaded, tokens["measured_tvd"].to_numpy(float), 0.0),
            "output_tvd": np.where(uploaded, tokens["output_tvd"].to_numpy(float), 0.0),
            "accepted_up": (uploaded & tokens["accepted"].to_numpy(bool)).astype(float),
            "accept_prob_skipped": np.where(
                skipped, np.nan_to_num(tokens["accept_prob"].to_numpy(float)), 0.0
            ),
            "skipped_verifiable": (
                skipped & np.isfinite(tokens["accept_prob"].to_numpy(float))
            ).astype(float),
        }
    )
    return frame.groupby("prompt_id", sort=True).sum()


def token_statistics(
    tokens: pd.DataFrame,
    vocab_size: int,
    prob_bits: int,
    rng_for: Callable[[str], np.random.Generator],
    level: float,
    samples: int,
) -> dict[str, float]:
    """:data:`TOKEN_METRICS` of one decoded table, each with a bootstrap over prompts
    (``rng_for(metric)`` gives each its own seeded generator). Keys ``<m>``, ``<m>_lo``,
    ``<m>_hi``; the definitions are those of ``evaluate.variant_metrics``."""
    sums = _per_prompt_sums(tokens, vocab_size, prob_bits)
    pairs = {
        "skip_rate": ("skipped", "tokens"),
        "transmission_rate": ("uploaded", "tokens"),
        "true_skip_rate": ("accept_prob_skipped", "skipped_verifiable"),
        "mean_k": ("k_up", "uploaded"),
        "uplink_bytes_per_token": ("bytes", "tokens"),
        "measured_tvd_mean": ("measured_tvd", "uploaded"),
        "output_tvd_mean": ("output_tvd", "uploaded"),
        "acceptance_rate": ("accepted_up", "uploaded"),
    }
    out: dict[str, float] = {}
    for metric, (num, den) in pairs.items():
        r = _ratio_of_sums(sums[num], sums[den], rng_for(metric), level, samples)
        out.update({metric: r["point"], f"{metric}_lo": r["low"], f"{metric}_hi": r["high"]})
    # vocab_compression = 1 - mean k / |V|: its interval is the mirror of mean_k's.
    out["vocab_compression"] = 1.0 - out["mean_k"] / vocab_size
    out["vocab_compression_lo"] = 1.0 - out["mean_k_hi"] / vocab_size
    out["vocab_compression_hi"] = 1.0 - out["mean_k_lo"] / vocab_size
    return out


def quality_statistics(
    scores: pd.DataFrame,
    rng_for: Callable[[str, str], np.random.Generator],
    level: float,
    samples: int,
    reference: str = "hlm",
    power: float = POWER,
) -> pd.DataFrame:
    """Per variant: the mean of each :data:`QUALITY_METRICS` over prompts and ``relative_<m>``
    (its ratio to the reference's, paired by prompt), each with a bootstrap interval over
    prompts (``rng_for(variant, metric)``).

    The reference (HLM, lossless) is every quality figure's noise floor (methods §6):
    ``floor_<m>`` is its mean over the same prompts, ``relative_<m>_n`` the prompts paired,
    ``relative_<m>_sd`` the per-prompt standard deviation of the ratio
    (``edgespec.intervals.paired_effects``) and ``relative_<m>_mdd`` the minimum detectable
    difference of the ratio at that n (two-sided at ``level``, with ``power``), all as
    fractions (0.02 = 2 points of the reference's figure)."""
    if reference not in set(scores["variant"]):
        raise KeyError(f"reference variant {reference!r} has no scores")
    ref = scores[scores["variant"] == reference].set_index("prompt_id")
    rows = []
    for variant, group in scores.groupby("variant", sort=False):
        group = group.set_index("prompt_id")
        row: dict[str, float | str] = {"variant": variant}
        for metric in QUALITY_METRICS:
            if metric not in group or SELF_REFERENCED.get(metric) == variant:
                continue
            values = group[metric].to_numpy(float)
            interval = bootstrap_interval(values, rng_for(variant, metric), level, samples)
            row.update(interval.as_dict(metric))
            both = pd.concat(
                [group[metric].rename("own"), ref[metric].rename("ref")], axis=1, join="inner"
            ).dropna()
            own, base = both["own"].to_numpy(float), both["ref"].to_numpy(float)
            r = _ratio_of_sums(own, base, rng_for(variant, f"relative_{metric}"), level, samples)
            sd = effect_sd(paired_effects(own, base))
            row.update(
                {
                    f"relative_{metric}": r["point"],
                    f"relative_{metric}_lo": r["low"],
                    f"relative_{metric}_hi": r["high"],
                    f"floor_{metric}": float(base.mean()) if len(base) else np.nan,
                    f"relative_{metric}_n": len(own),
                    f"relative_{metric}_sd": sd,
                    f"relative_{metric}_mdd": detectable_difference(sd, len(own), level, power),
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)


def summary_table(
    metrics: pd.DataFrame,
    tokens_by_variant: Mapping[str, pd.DataFrame],
    scores: pd.DataFrame,
    vocab_size: int,
    prob_bits: int,
    seed: int,
    seed_level: float,
    bootstrap_level: float,
    bootstrap_samples: int,
    reference: str = "hlm",
    power: float = POWER,
) -> pd.DataFrame:
    """One row per (variant, channel, profile): seed intervals of the delay and gain metrics,
    bootstrap intervals of the token-level and quality metrics, the quality metrics' floors
    and minimum detectable differences at ``power`` (module docstring). Bootstrap
    generators derive from ``seed`` and the (variant, metric) names, so each figure's
    interval is reproducible on its own."""
    seeds = seed_summary(seed_relative(metrics, reference), seed_level)
    token_rows = []
    for variant, tokens in tokens_by_variant.items():
        stats = token_statistics(
            tokens,
            vocab_size,
            prob_bits,
            lambda metric, v=variant: numpy_rng(seed, "report", "bootstrap", v, metric),
            bootstrap_level,
            bootstrap_samples,
        )
        token_rows.append({"variant": variant, **stats})
    quality = quality_statistics(
        scores,
        lambda v, metric: numpy_rng(seed, "report", "bootstrap", v, metric),
        bootstrap_level,
        bootstrap_samples,
        reference,
        power,
    )
    out = seeds.merge(pd.DataFrame(token_rows), on="variant", how="left")
    return out.merge(quality, on="variant", how="left")
