"""WISV report tables with their spread (methods §6); torch-free.

Inputs are the evaluation's per (variant, channel, gamma, fading seed, prompt) costs
(``edgespec.wisv.evaluate.price_over_seeds``) and the per-prompt text scores of each decode
(``edgespec.wisv.scores``). Every delay-type figure (latency, throughput, AAL, rounds, uplink)
is a ratio of sums over prompts, computed per fading seed: its point is the median over seeds,
with the central interval over seeds (``intervals.seed_interval``; NaN where a variant was
priced under a single seed) and, always, a percentile bootstrap over prompts of the
seed-averaged per-prompt sums (``intervals.bootstrap_interval``). Figures relative to vanilla SD
(same channel and gamma) pair the seeds and the prompts: the same seed's draws, the same
resampled prompts. Accuracy-type figures (exact match, answer fidelity, semantic accuracy) are
means over prompts with a bootstrap interval; a CSI-reading variant decoded under several seeds
is averaged over them per prompt first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.intervals import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_SAMPLES,
    SEED_LEVEL,
    bootstrap_interval,
    detectable_difference,
    effect_sd,
    format_bounds,
    format_interval,
)
from edgespec.intervals import seed_interval as _seed_interval
from edgespec.report import HEADLINE_COLUMNS, verdict_at_n
from edgespec.seeding import numpy_rng

REFERENCE = "vanilla_sd"
KEY = ("variant", "channel", "gamma")
ANY_CHANNEL = "any"
"""The channel of a channel-blind decode's scores: they hold under every channel."""

RATIO_METRICS: dict[str, tuple[str, str | None, float]] = {
    # name: (numerator field, denominator field or None for the prompt count, scale)
    "e2e_latency_s": ("latency_s", None, 1.0),
    "throughput_tok_s": ("tokens", "latency_s", 1.0),
    "aal": ("tokens", "rounds", 1.0),
    "rounds_per_answer": ("rounds", None, 1.0),
    "uplink_bytes_per_token": ("uplink_bits", "tokens", 1 / 8),
    "acceptance_rate": ("accepted", "drafted", 1.0),
    "mismatch_rate": ("mismatches", "drafted", 1.0),
    "semantic_accept_fraction": ("semantic_accepts", "accepted", 1.0),
    "prefill_s": ("prefill_s", None, 1.0),
}
"""Delay-type figures: per seed, scale * sum(numerator) / sum(denominator) over prompts."""

RELATIVE_METRICS: dict[str, tuple[str, Callable[[float, float], float]]] = {
    "latency_reduction": ("e2e_latency_s", lambda ours, ref: 1.0 - ours / ref),
    "throughput_gain": ("throughput_tok_s", lambda ours, ref: ours / ref),
    "aal_gain": ("aal", lambda ours, ref: ours / ref - 1.0),
    "round_reduction": ("rounds_per_answer", lambda ours, ref: 1.0 - ours / ref),
}
"""Figures against vanilla SD on the same channel and gamma, seed by seed."""

SCORE_METRICS = {
    "task_accuracy": "exact_match",
    "answer_fidelity": "answer_fidelity",
    "semantic_accuracy": "semantic_accuracy",
    "identical_to_vanilla": "identical_to_vanilla",
}
DROP_METRICS = {"accuracy_drop": "exact_match", "semantic_drop": "semantic_accuracy"}
"""Paired over prompts: vanilla SD's score minus the variant's (positive = worse)."""


def _safe_ratio(num: float, den: float) -> float:
    return float(num / den) if den != 0 else math.nan


class _Settings:
    def __init__(self, seed: int, evaluation: Mapping[str, Any] | None):
        evaluation = evaluation or {}
        self.seed = seed
        self.seed_level = float(evaluation.get("seed_interval", SEED_LEVEL))
        self.boot_level = float(evaluation.get("bootstrap_interval", BOOTSTRAP_LEVEL))
        self.samples = int(evaluation.get("bootstrap_samples", BOOTSTRAP_SAMPLES))

    def rng(self, *parts: object) -> np.random.Generator:
        return numpy_rng(self.seed, "wisv-bootstrap", *parts)


def _cube(costs: pd.DataFrame, prompts: list[Any]) -> tuple[list[int], dict[str, np.ndarray]]:
    """Per field, a [seeds, prompts] array (prompts in the given order)."""
    seeds = sorted(int(s) for s in costs["fading_index"].unique())
    out = {}
    fields = {f for num, den, _ in RATIO_METRICS.values() for f in (num, den) if f is not None}
    indexed = costs.set_index(["fading_index", "prompt_id"])
    full = pd.MultiIndex.from_product([seeds, prompts], names=["fading_index", "prompt_id"])
    aligned = indexed.reindex(full)
    if aligned[sorted(fields)].isna().any().any():
        raise ValueError("the per-prompt costs miss a (fading seed, prompt) pair")
    for f in fields:
        out[f] = aligned[f].to_numpy(dtype=np.float64).reshape(len(seeds), len(prompts))
    return seeds, out


def _stat(cube: dict[str, np.ndarray], name: str, idx: np.ndarray | None = None) -> np.ndarray:
    """Per seed (rows of the cube), the ratio metric over prompts ``idx`` (all: None). With a
    one-row cube (seed means) and ``idx`` [resamples, n], one value per resample."""
    num_f, den_f, scale = RATIO_METRICS[name]
    if idx is not None and idx.ndim == 2:  # resamples of a one-row cube
        cube = {f: v[0] for f, v in cube.items()}
    num = cube[num_f] if idx is None else cube[num_f][..., idx]
    if den_f is None:
        den = np.full(num.shape[0], num.shape[1], dtype=np.float64)
    else:
        den = (cube[den_f] if idx is None else cube[den_f][..., idx]).sum(1)
    total = num.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, scale * total / den, np.nan)


def _seed_bounds(values: np.ndarray, level: float) -> tuple[float, float, float]:
    interval = _seed_interval(values, level)
    if np.isfinite(values).sum() < 2:
        return interval.point, math.nan, math.nan
    return interval.point, interval.low, interval.high


def _metric_block(name: str, per_seed: tuple[float, float, float], boot) -> dict[str, float]:
    point, s_lo, s_hi = per_seed
    return {
        name: point,
        f"{name}_seed_lo": s_lo,
        f"{name}_seed_hi": s_hi,
        f"{name}_lo": boot.low,
        f"{name}_hi": boot.high,
    }


def summarise(
    costs: pd.DataFrame,
    scores: pd.DataFrame,
    seed: int,
    evaluation: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """One row per (variant, channel, gamma) with every figure, its seed and bootstrap
    intervals (module docstring).

    ``costs``: columns variant, channel, gamma, fading_index, prompt_id and the fields of
    ``evaluate.PROMPT_COLUMNS``. ``scores``: variant, channel, gamma, prompt_id and the text
    scores (``scores.SCORE_COLUMNS``), one row per decode and prompt (several decodes of a
    (variant, channel, gamma) are averaged per prompt; channel ``ANY_CHANNEL`` holds for every
    channel). ``evaluation``: the config's
    ``evaluation`` block (interval levels, bootstrap samples). Columns: the key, ``seeds``
    (fading seeds the delay figures are over), ``prompts``, each metric M with ``M_seed_lo``,
    ``M_seed_hi`` (over seeds) and ``M_lo``, ``M_hi`` (bootstrap over prompts); accuracy-type
    figures carry ``M_lo``, ``M_hi`` only.
    """
    cfg = _Settings(seed, evaluation)
    prompts = sorted(costs["prompt_id"].unique(), key=str)
    channels = sorted(costs["channel"].unique())
    blind = scores[scores["channel"] == ANY_CHANNEL]
    scores = pd.concat(
        [scores[scores["channel"] != ANY_CHANNEL]]
        + [blind.assign(channel=channel) for channel in channels],
        ignore_index=True,
    )
    cubes = {}
    for key, group in costs.groupby(list(KEY), sort=True):
        cubes[key] = _cube(group, prompts)
    score_means = (
        scores.groupby([*KEY, "prompt_id"], sort=False)[list(SCORE_METRICS.values())]
        .mean()
        .sort_index()
    )
    rows = []
    for key, (seeds, cube) in cubes.items():
        variant, channel, gamma = key
        tag = (variant, channel, int(gamma))
        row: dict[str, Any] = {
            "variant": variant,
            "channel": channel,
            "gamma": int(gamma),
            "seeds": len(seeds),
            "prompts": len(prompts),
        }
        index = np.arange(len(prompts), dtype=np.float64)
        seed_mean = {f: v.mean(0, keepdims=True) for f, v in cube.items()}
        for name in RATIO_METRICS:
            per_seed = _stat(cube, name)
            boot = bootstrap_interval(
                index,
                cfg.rng(*tag, name),
                cfg.boot_level,
                cfg.samples,
                statistic=lambda i, name=name, m=seed_mean: _stat(m, name, i.astype(int)),
                vectorized=True,
            )
            row.update(_metric_block(name, _seed_bounds(per_seed, cfg.seed_level), boot))
        ref_key = (REFERENCE, channel, gamma)
        if ref_key in cubes:
            ref_seeds, ref_cube = cubes[ref_key]
            common = [s for s in seeds if s in ref_seeds]
            ours_rows = [seeds.index(s) for s in common]
            ref_rows = [ref_seeds.index(s) for s in common]
            ours_c = {f: v[ours_rows] for f, v in cube.items()}
            ref_c = {f: v[ref_rows] for f, v in ref_cube.items()}
            ours_m = {f: v.mean(0, keepdims=True) for f, v in ours_c.items()}
            ref_m = {f: v.mean(0, keepdims=True) for f, v in ref_c.items()}
            for name, (base, relate) in RELATIVE_METRICS.items():
                per_seed = np.array(
                    [
                        relate(a, b) if b else math.nan
                        for a, b in zip(_stat(ours_c, base), _stat(ref_c, base), strict=True)
                    ]
                )

                def paired(i, base=base, relate=relate, ours_m=ours_m, ref_m=ref_m):
                    i = i.astype(int)
                    ref = _stat(ref_m, base, i)
                    with np.errstate(divide="ignore", invalid="ignore"):
                        return np.where(ref != 0, relate(_stat(ours_m, base, i), ref), math.nan)

                boot = bootstrap_interval(
                    index,
                    cfg.rng(*tag, name),
                    cfg.boot_level,
                    cfg.samples,
                    statistic=paired,
                    vectorized=True,
                )
                row.update(_metric_block(name, _seed_bounds(per_seed, cfg.seed_level), boot))
        row.update(_score_block(score_means, key, ref_key, prompts, cfg, tag))
        rows.append(row)
    out = pd.DataFrame(rows)
    return out.sort_values(["gamma", "channel", "variant"], kind="stable").reset_index(drop=True)


def _score_block(score_means, key, ref_key, prompts, cfg: _Settings, tag) -> dict[str, float]:
    row: dict[str, float] = {}
    if key not in score_means.index.droplevel("prompt_id"):
        return row
    ours = score_means.loc[key].reindex(prompts)
    for name, column in SCORE_METRICS.items():
        values = ours[column].to_numpy(dtype=np.float64)
        boot = bootstrap_interval(values, cfg.rng(*tag, name), cfg.boot_level, cfg.samples)
        row.update({name: boot.point, f"{name}_lo": boot.low, f"{name}_hi": boot.high})
    if ref_key in score_means.index.droplevel("prompt_id"):
        ref = score_means.loc[ref_key].reindex(prompts)
        for name, column in DROP_METRICS.items():
            diff = ref[column].to_numpy(dtype=np.float64) - ours[column].to_numpy(np.float64)
            boot = bootstrap_interval(diff, cfg.rng(*tag, name), cfg.boot_level, cfg.samples)
            row.update({name: boot.point, f"{name}_lo": boot.low, f"{name}_hi": boot.high})
            # against the floor, 0 (vanilla SD's own drop): the MDD at the prompts scored
            n = int(np.isfinite(diff).sum())
            mdd = detectable_difference(effect_sd(diff), n, cfg.boot_level)
            row.update({f"{name}_n": n, f"{name}_mdd": mdd})
    return row


# --------------------------------------------------------------------------------------------
# The paper's numbers beside ours
# --------------------------------------------------------------------------------------------

WISV_REFERENCES = (
    # (metric, paper, column, sign shown (+1 gain, -1 reduction), unit, pick the best setting)
    ("accepted length (AAL) vs vanilla SD", "+60.8", "aal_gain", 1, "%", True),
    ("interaction rounds vs vanilla SD", "-37.3", "round_reduction", -1, "%", True),
    ("end-to-end latency vs vanilla SD (simulation)", "-31.4", "latency_reduction", -1, "%", True),
    ("task-accuracy drop vs vanilla SD", "<1", "accuracy_drop", 1, "points", False),
)
"""WISV (arXiv 2604.17701) abstract numbers, 1B/8B pair, simulated channel (methods §8)."""


def headline(summary: pd.DataFrame, variants=("wisv_fh", "wisv_sh")) -> pd.DataFrame:
    """The paper's headline numbers beside ours (``HEADLINE_COLUMNS``): the best WISV setting
    (median) for each gain, and the accuracy drop at the setting with the best latency
    reduction; ``ours_lo``/``ours_hi`` the bootstrap interval over prompts (the spread every
    variant has, also where a CSI-reading variant was decoded under one fading seed), in the
    unit shown (percent of vanilla SD, or accuracy points)."""
    ours = summary[summary["variant"].isin(variants)]
    rows = []
    if ours.empty or "latency_reduction" not in ours:
        return pd.DataFrame(columns=list(HEADLINE_COLUMNS))
    best_latency = ours.loc[ours["latency_reduction"].fillna(-np.inf).idxmax()]
    for metric, paper, column, sign, unit, pick_best in WISV_REFERENCES:
        if column not in ours:
            continue
        row = ours.loc[ours[column].fillna(-np.inf).idxmax()] if pick_best else best_latency
        bounds = sorted([100 * sign * row[f"{column}_lo"], 100 * sign * row[f"{column}_hi"]])
        line = {
            "metric": metric,
            "paper": paper,
            "ours": 100 * sign * row[column],
            "ours_lo": bounds[0],
            "ours_hi": bounds[1],
            "unit": unit,
            "where": f"{row['variant']}, {row['channel']}, gamma={int(row['gamma'])}",
        }
        if column in DROP_METRICS:  # a quality claim: "< 1 point", against a floor of 0
            n = float(row.get(f"{column}_n", math.nan))
            line.update(
                floor=0.0,
                mdd=100 * float(row.get(f"{column}_mdd", math.nan)),
                n=n,
                verdict=verdict_at_n(*bounds, float(paper.lstrip("<")), "at_most", n),
            )
        rows.append(line)
    return pd.DataFrame(rows, columns=list(HEADLINE_COLUMNS))


def cell(row: Mapping[str, Any], name: str, spec: str = ".3g", scale: float = 1.0) -> str:
    """``"1.23 [1.1, 1.4] (1.0, 1.5)"``: the point, [the seed interval] where there is one,
    (the bootstrap interval)."""
    point = row.get(name, math.nan)
    seed = row.get(f"{name}_seed_lo", math.nan), row.get(f"{name}_seed_hi", math.nan)
    text = format_interval(point, *seed, spec, scale)
    lo, hi = row.get(f"{name}_lo", math.nan), row.get(f"{name}_hi", math.nan)
    if text != "n/a" and np.isfinite(lo) and np.isfinite(hi):
        text += " " + format_bounds(lo, hi, spec, scale, brackets="()")
    return text


DISPLAY = (
    ("e2e latency (s)", "e2e_latency_s", 1.0),
    ("latency vs vanilla (%)", "latency_reduction", -100.0),
    ("AAL", "aal", 1.0),
    ("AAL vs vanilla (%)", "aal_gain", 100.0),
    ("rounds per answer", "rounds_per_answer", 1.0),
    ("uplink B/token", "uplink_bytes_per_token", 1.0),
    ("exact match", "task_accuracy", 1.0),
    ("accuracy drop (points)", "accuracy_drop", 100.0),
    ("semantic accuracy", "semantic_accuracy", 1.0),
    ("answer fidelity", "answer_fidelity", 1.0),
)


def display_table(summary: pd.DataFrame, columns=DISPLAY) -> pd.DataFrame:
    """Human-readable cells (``cell``) for the markdown report."""
    out = summary[["variant", "channel", "gamma", "seeds"]].copy()
    for label, name, scale in columns:
        out[label] = [cell(row, name, scale=scale) for row in summary.to_dict("records")]
    return out
