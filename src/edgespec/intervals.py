"""Spread of a reported figure: a median and interval over fading seeds, a bootstrap over prompts.

Two sources of randomness decide most figures (methods §6, reporting):

- **fading**: delay-based figures (throughput, latency, gains) are re-priced from the decoded
  tables under K fading seeds; under Rayleigh fading E[1/R] is unbounded, so one realisation
  can be far from another. They are reported as the median over seeds with a central interval
  (:func:`seed_interval`, 90% by default).
- **prompts**: accuracy-type figures (exact match, semantic accuracy, fidelity) are means over
  a small prompt set; they get a percentile bootstrap interval over prompts
  (:func:`bootstrap_interval`, 95% by default), drawn from a seeded generator passed in.

A quality figure is compared with its noise floor (what a lossless method scores on the same
prompts) paired by prompt: :func:`paired_effects` gives the per-prompt contributions, whose
standard deviation decides the minimum detectable difference at a number of prompts
(:func:`detectable_difference`) and the prompts needed for a given one
(:func:`prompts_needed`), methods §6.

Every report table prints a figure and its interval the same way, ``"3.85 [3.50, 7.00]"``
(:func:`format_interval`, with its rules for a missing figure or interval).

Torch-free, so the evaluation and report jobs stay cheap to start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

SEED_LEVEL = 0.9
BOOTSTRAP_LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate with the bounds of a central interval at ``level``; NaN when undefined."""

    point: float
    low: float
    high: float
    level: float

    def as_dict(self, name: str) -> dict[str, float]:
        """``{name: point, name_lo: low, name_hi: high}`` for a table row."""
        return {name: self.point, f"{name}_lo": self.low, f"{name}_hi": self.high}

    def format(self, spec: str = ".3g", scale: float = 1.0, suffix: str = "") -> str:
        """``"3.85 [3.50, 7.00]"`` (:func:`format_interval`)."""
        return format_interval(self.point, self.low, self.high, spec, scale, suffix)


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def format_bounds(low, high, spec: str = ".3g", scale: float = 1.0, brackets: str = "[]") -> str:
    """``"[3.50, 7.00]"``: ``low`` and ``high`` times ``scale``, formatted with ``spec``, in
    increasing order (a negative ``scale``, e.g. -100 for a reduction in percent, flips them)."""
    a, b = sorted([low * scale, high * scale])
    return f"{brackets[0]}{format(a, spec)}, {format(b, spec)}{brackets[1]}"


def format_interval(
    point,
    low,
    high,
    spec: str = ".3g",
    scale: float = 1.0,
    suffix: str = "",
    *,
    point_text: str | None = None,
    collapse_equal: bool = False,
) -> str:
    """``"3.85 [3.50, 7.00]"``: a figure and its interval, as every report table prints them.

    Each value is multiplied by ``scale`` (100 for percent) and formatted with ``spec``;
    ``suffix`` follows the point, ``point_text`` (where given) replaces the formatted point and
    its suffix (a caller that prints the point in its own unit format). The rules:

    - no figure (``point`` None, NaN or infinite): ``"n/a"``;
    - no interval (``low`` or ``high`` None or not finite), or with ``collapse_equal`` an
      interval of no width (``low == high == point``): the point alone;
    - otherwise ``"point [low, high]"``, the bounds by :func:`format_bounds` (increasing).
    """
    if not _finite(point):
        return "n/a"
    text = point_text if point_text is not None else f"{format(point * scale, spec)}{suffix}"
    if not (_finite(low) and _finite(high)) or (collapse_equal and low == high == point):
        return text
    return f"{text} {format_bounds(low, high, spec, scale)}"


def _check_level(level: float) -> float:
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"an interval level lies in (0, 1), got {level!r}")
    return float(level)


def seed_interval(values, level: float = SEED_LEVEL) -> Interval:
    """Median of per-seed ``values`` with the central ``level`` percentile interval.

    NaNs are ignored (a seed where the figure is undefined); all NaN gives a NaN interval.
    """
    level = _check_level(level)
    x = np.asarray(values, dtype=float).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, level)
    tail = (1.0 - level) / 2.0
    low, median, high = np.quantile(x, [tail, 0.5, 1.0 - tail])
    return Interval(float(median), float(low), float(high), level)


def bootstrap_interval(
    values,
    rng: np.random.Generator,
    level: float = BOOTSTRAP_LEVEL,
    samples: int = BOOTSTRAP_SAMPLES,
    statistic: Callable[[np.ndarray], float] | None = None,
    vectorized: bool = False,
) -> Interval:
    """``statistic`` (default: the mean) of per-prompt ``values`` with a percentile bootstrap
    interval: ``samples`` resamples of the prompts with replacement, drawn from ``rng``.
    ``vectorized``: ``statistic`` takes every resample at once, a [samples, n] array, and
    returns [samples] (the same draws as one call per resample, without a Python loop).

    NaNs are dropped first (a prompt without a gold answer has no exact match), and so are
    resamples where ``statistic`` is undefined (NaN, e.g. a ratio whose resampled denominator is
    0); the interval is NaN when every resample is.
    """
    level = _check_level(level)
    if not isinstance(rng, np.random.Generator):
        raise TypeError("bootstrap_interval needs a numpy.random.Generator")
    if int(samples) < 1:
        raise ValueError(f"samples must be >= 1, got {samples!r}")
    x = np.asarray(values, dtype=float).reshape(-1)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, level)
    if statistic is None:
        point = float(x.mean())
        draws = x[rng.integers(0, x.size, size=(int(samples), x.size))].mean(axis=1)
    elif vectorized:
        point = float(np.asarray(statistic(x[np.newaxis]), dtype=float)[0])
        idx = rng.integers(0, x.size, size=(int(samples), x.size))
        draws = np.asarray(statistic(x[idx]), dtype=float).reshape(-1)
    else:
        point = float(statistic(x))
        idx = rng.integers(0, x.size, size=(int(samples), x.size))
        draws = np.array([statistic(x[row]) for row in idx], dtype=float)
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return Interval(point, math.nan, math.nan, level)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return Interval(point, float(low), float(high), level)


# --------------------------------------------------------------------------- power, paired

POWER = 0.8
"""Default power of a minimum detectable difference (the chance to see a true difference of
that size as significant)."""


def _z(level: float, power: float) -> float:
    """z_{1 - (1 - level)/2} + z_{power}: the two-sided critical value at confidence ``level``
    plus the quantile that gives ``power``."""
    level = _check_level(level)
    if not 0.0 < float(power) < 1.0:
        raise ValueError(f"power lies in (0, 1), got {power!r}")
    normal = NormalDist()
    return normal.inv_cdf(1.0 - (1.0 - level) / 2.0) + normal.inv_cdf(float(power))


def paired_effects(values, floor, relative: bool = True) -> np.ndarray:
    """Per-prompt contributions of a figure against its floor, paired by prompt (NaN pairs
    dropped): their mean is the figure's distance from the floor, their standard deviation
    over sqrt(n) its standard error.

    ``relative``: the figure is the ratio of means R = sum(a) / sum(b) (a = ``values``, b =
    ``floor``), linearised by the delta method, e_i = (a_i - R b_i) / mean(b) (so mean(e) = 0
    and var(R) ~ var(e) / n); else the difference a_i - b_i.
    """
    a, b = np.asarray(values, dtype=float), np.asarray(floor, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"{a.shape} values but {b.shape} floor values (paired by prompt)")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if not relative:
        return a - b
    if a.size == 0 or b.sum() == 0:
        return np.full(a.size, np.nan)
    ratio = a.sum() / b.sum()
    return (a - ratio * b) / b.mean()


def effect_sd(effects) -> float:
    """Sample standard deviation (ddof 1) of per-prompt effects; NaN below two prompts."""
    e = np.asarray(effects, dtype=float)
    e = e[np.isfinite(e)]
    return float(e.std(ddof=1)) if e.size >= 2 else math.nan


def detectable_difference(
    sd: float, n: int, level: float = BOOTSTRAP_LEVEL, power: float = POWER
) -> float:
    """Minimum detectable difference of a paired mean: (z_{1-alpha/2} + z_power) sd / sqrt(n),
    in the unit of ``sd`` (the per-prompt standard deviation of :func:`paired_effects`), for a
    two-sided test at confidence ``level`` with ``power``. NaN where sd or n is undefined."""
    if not (math.isfinite(sd) and n and n > 0):
        return math.nan
    return _z(level, power) * float(sd) / math.sqrt(n)


def prompts_needed(
    sd: float, difference: float, level: float = BOOTSTRAP_LEVEL, power: float = POWER
) -> int:
    """The fewest prompts whose :func:`detectable_difference` is at most ``difference`` (same
    unit as ``sd``): ceil(((z_{1-alpha/2} + z_power) sd / difference)^2)."""
    if not difference > 0:
        raise ValueError(f"difference must be > 0, got {difference!r}")
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be finite and >= 0, got {sd!r}")
    return max(1, math.ceil((_z(level, power) * sd / difference) ** 2 - 1e-9))
