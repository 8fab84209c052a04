"""Intervals over fading seeds and bootstrap intervals over prompts, against hand-computed cases
and by their coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.intervals import (
    Interval,
    bootstrap_interval,
    format_bounds,
    format_interval,
    seed_interval,
)


def test_seed_interval_is_median_and_percentiles():
    iv = seed_interval(np.arange(1, 22), level=0.9)  # 21 values: 5% -> 2, 95% -> 20
    assert (iv.point, iv.level) == (11.0, 0.9)
    assert iv.low == pytest.approx(2.0) and iv.high == pytest.approx(20.0)


def test_seed_interval_ignores_nan_and_handles_all_nan():
    assert seed_interval([1.0, np.nan, 3.0]).point == 2.0
    assert math.isnan(seed_interval([np.nan, np.nan]).point)


def test_interval_formats_and_flattens():
    iv = Interval(0.5, 0.25, 0.75, 0.9)
    assert iv.format(".1f", scale=100, suffix="%") == "50.0% [25.0, 75.0]"
    assert iv.as_dict("x") == {"x": 0.5, "x_lo": 0.25, "x_hi": 0.75}
    assert Interval(math.nan, math.nan, math.nan, 0.9).format() == "n/a"


def test_format_interval_rules():
    assert format_interval(3.851, 3.5, 7.0) == "3.85 [3.5, 7]"
    assert format_interval(0.5, 0.25, 0.75, ".1f", 100, "%") == "50.0% [25.0, 75.0]"
    # No figure: n/a, whatever the bounds.
    for point in (None, math.nan, math.inf):
        assert format_interval(point, 1.0, 2.0) == "n/a"
    # No interval: the point alone.
    assert format_interval(2.0, math.nan, 3.0) == "2"
    assert format_interval(2.0, 1.0, None) == "2"
    # An interval of no width is printed unless the caller collapses it.
    assert format_interval(2.0, 2.0, 2.0) == "2 [2, 2]"
    assert format_interval(2.0, 2.0, 2.0, collapse_equal=True) == "2"
    assert format_interval(2.0, 1.0, 3.0, collapse_equal=True) == "2 [1, 3]"
    # A negative scale flips the bounds into increasing order.
    assert format_interval(0.25, 0.2, 0.3, ".3g", -100) == "-25 [-30, -20]"
    assert format_interval(1.0, 0.5, 2.0, point_text="1.00x") == "1.00x [0.5, 2]"
    assert format_bounds(0.1, 0.4, brackets="()") == "(0.1, 0.4)"


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        seed_interval([1, 2], level=90)


def test_bootstrap_of_a_constant_is_degenerate_and_needs_a_generator():
    iv = bootstrap_interval([0.7] * 10, np.random.default_rng(0))
    assert (iv.point, iv.low, iv.high) == (0.7, 0.7, 0.7)
    with pytest.raises(TypeError):
        bootstrap_interval([1.0, 2.0], 0)


def test_bootstrap_is_reproducible_from_its_generator():
    x = np.random.default_rng(1).normal(size=30)
    a = bootstrap_interval(x, np.random.default_rng(5))
    b = bootstrap_interval(x, np.random.default_rng(5))
    c = bootstrap_interval(x, np.random.default_rng(6))
    assert a == b and a != c


def test_bootstrap_interval_covers_the_true_mean_about_as_often_as_it_says():
    """Over 400 independent samples of 40 normals, the 95% interval holds the true mean about
    95% of the time (percentile bootstrap runs a little narrow at n = 40: accept 88-99%).
    A bootstrap that reused one resample per interval, or none, would miss most of the time."""
    data_rng, boot_rng = np.random.default_rng(11), np.random.default_rng(12)
    hits = 0
    for _ in range(400):
        x = data_rng.normal(loc=2.0, scale=1.0, size=40)
        iv = bootstrap_interval(x, boot_rng, samples=500)
        hits += iv.low <= 2.0 <= iv.high
    assert 0.88 <= hits / 400 <= 0.99


def test_bootstrap_with_a_custom_statistic():
    x = np.array([1.0, 2.0, 3.0, 100.0])
    iv = bootstrap_interval(x, np.random.default_rng(0), statistic=np.median, samples=200)
    assert iv.point == 2.5 and iv.low <= 2.5 <= iv.high


def test_bootstrap_drops_resamples_where_the_statistic_is_undefined():
    """A ratio whose resampled denominator is 0 is undefined on that resample, not everywhere."""
    den = np.array([0.0, 0.0, 1.0])

    def ratio(index):
        idx = index.astype(int)
        return den[idx].sum() / len(idx) if den[idx].sum() else np.nan

    iv = bootstrap_interval(np.arange(3.0), np.random.default_rng(0), statistic=ratio, samples=400)
    assert np.isfinite(iv.low) and np.isfinite(iv.high) and iv.low <= iv.high
    never = bootstrap_interval(
        np.arange(3.0), np.random.default_rng(0), statistic=lambda i: np.nan, samples=50
    )
    assert np.isnan(never.low) and np.isnan(never.high)


def test_vectorized_statistic_gives_the_interval_of_one_call_per_resample():
    """The same draws, resample by resample: a ratio of sums over a random prompt set, with
    resamples where the denominator vanishes dropped in both forms."""
    rng = np.random.default_rng(3)
    num, den = rng.exponential(size=12), rng.integers(0, 2, size=12).astype(float)

    def one(index):
        idx = index.astype(int)
        return num[idx].sum() / den[idx].sum() if den[idx].sum() else np.nan

    def every(index):  # [resamples, n] -> [resamples]
        idx = index.astype(int)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den[idx].sum(-1) != 0, num[idx].sum(-1) / den[idx].sum(-1), np.nan)

    values = np.arange(12.0)
    loop = bootstrap_interval(values, np.random.default_rng(9), statistic=one, samples=300)
    fast = bootstrap_interval(
        values, np.random.default_rng(9), statistic=every, samples=300, vectorized=True
    )
    assert fast.point == pytest.approx(loop.point, rel=1e-12)
    assert fast.low == pytest.approx(loop.low, rel=1e-12)
    assert fast.high == pytest.approx(loop.high, rel=1e-12)
    assert loop.low < loop.point < loop.high
