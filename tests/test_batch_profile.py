"""The edge's batch profile: interleaved repeats, medians, the isotonic fit, outliers re-timed or
reported, the spread carried into bootstrap draws."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.multidevice.batchprofile import (
    BatchProfile,
    collect,
    leave_one_out_fit,
    round_loads,
)
from edgespec.multidevice.edge import BatchTimes, isotonic

CONTEXTS, TOKENS, SIZES = [40, 72], [1, 5], [1, 2, 4, 8, 16]


def test_isotonic_pools_decreasing_runs_into_their_mean():
    np.testing.assert_allclose(isotonic([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
    np.testing.assert_allclose(isotonic([3, 2, 1]), [2, 2, 2])
    np.testing.assert_allclose(isotonic([1, 3, 2], weights=[1, 3, 1]), [1, 2.75, 2.75])
    np.testing.assert_allclose(isotonic([1, 2, 2, 5]), [1, 2, 2, 5])


def test_leave_one_out_fit_reads_the_neighbours():
    sizes, medians = [1, 2, 4, 8], [1.0, 1.1, 5.6, 1.2]
    assert leave_one_out_fit(sizes, medians, 2) == pytest.approx((1.1 + 0.1 / 3,) * 2)
    # The largest batch: held at the last other (low), extrapolated along the last two (high).
    assert leave_one_out_fit(sizes, medians, 3) == pytest.approx((5.6, 5.6 + 2.25 * 4))
    assert leave_one_out_fit(sizes, medians, 0) == pytest.approx((1.1, 1.1))  # held below
    assert np.isnan(leave_one_out_fit([1], [1.0], 0)).all()


class FakeTimer:
    """True times rising with the batch, tokens and context, with 2% noise per sample (one
    stream per cell, so two runs draw the same k-th sample of a cell); ``glitch(cell, k)`` says
    how much slower the k-th call of a cell runs."""

    def __init__(self, glitch=lambda cell, k: 1.0):
        self.glitch = glitch
        self.calls: dict = {}

    def true(self, context, tokens, batch):
        return (0.1 + 0.01 * batch * tokens) * (1 + context / 1000)

    def __call__(self, context, tokens, batch):
        cell = (context, tokens, batch)
        k = self.calls.get(cell, 0)
        self.calls[cell] = k + 1
        noise = np.random.default_rng([context, tokens, batch, k]).lognormal(0.0, 0.02)
        return self.true(*cell) * noise * self.glitch(cell, k)


def profile_with(timer, retries=1):
    return collect(timer, CONTEXTS, TOKENS, SIZES, 5, np.random.default_rng(3), retries)


def neighbours_spread(profile, tokens, batch):
    """The widest interquartile range of the cells beside (tokens, batch), over contexts."""
    i = SIZES.index(batch)
    near = [SIZES[j] for j in (i - 1, i + 1) if 0 <= j < len(SIZES)]
    spread = profile.spread()
    return max(hi - lo for c in CONTEXTS for b in near for lo, hi in [spread[c][tokens][b]])


def charged(profile):
    times = profile.times()
    return {(t, b): times.seconds(t, b) for t in TOKENS for b in SIZES}


@pytest.mark.parametrize("glitched_calls", [range(0, 1), range(0, 5)], ids=["one", "first-pass"])
def test_one_outlier_changes_no_charged_time_by_more_than_its_neighbours_spread(glitched_calls):
    """A cell timed 5.6x too slow (the f86dc4f batch 4), once or on its whole first pass."""
    clean = profile_with(FakeTimer())
    bad_cell = (40, 1, 4)
    glitched = profile_with(
        FakeTimer(lambda cell, k: 5.6 if cell == bad_cell and k in glitched_calls else 1.0)
    )
    assert not clean.warnings and not glitched.warnings
    base, got = charged(clean), charged(glitched)
    for (tokens, batch), seconds in base.items():
        assert abs(got[(tokens, batch)] - seconds) <= neighbours_spread(clean, tokens, batch)
    retimed = "context 40, 1 tokens per row, batch 4"
    assert (retimed in glitched.discarded) == (len(glitched_calls) == 5)
    # Every round timed every cell once, the re-timing the flagged cell 5 more times.
    assert all(
        len(v) == 5 for rows in glitched.samples.values() for r in rows.values() for v in r.values()
    )


def test_an_outlier_that_persists_is_reported_not_hidden():
    bad_cell = (72, 5, 2)
    profile = profile_with(FakeTimer(lambda cell, k: 5.6 if cell == bad_cell else 1.0))
    assert len(profile.warnings) == 1
    assert "context 72, 5 tokens per row, batch 2" in profile.warnings[0]
    assert "after re-timing" in profile.warnings[0]
    assert len(profile.discarded["context 72, 5 tokens per row, batch 2"]) == 5


def test_the_charged_table_is_the_mean_over_contexts_of_the_isotonic_fits():
    samples = {
        10: {1: {1: [1.0] * 5, 2: [0.8] * 5, 4: [2.0] * 5}},
        30: {1: {1: [2.0] * 5, 2: [2.2] * 5, 4: [3.0] * 5}},
    }
    times = BatchProfile(samples).times()
    # context 10: 1.0, 0.8 pool into 0.9; context 30 is already non-decreasing.
    assert times.seconds(1, 1) == pytest.approx((0.9 + 2.0) / 2)
    assert times.seconds(1, 2) == pytest.approx((0.9 + 2.2) / 2)
    assert times.seconds(1, 4) == pytest.approx((2.0 + 3.0) / 2)


def test_draws_carry_the_spread_and_the_record_round_trips():
    rng = np.random.default_rng(0)
    samples = {
        50: {t: {b: list(rng.uniform(0.09, 0.11, 5) * b * t) for b in SIZES} for t in TOKENS}
    }
    profile = BatchProfile(samples, warnings=["x"])
    draws = [profile.draw(np.random.default_rng(s)).seconds(5, 8) for s in range(20)]
    assert np.std(draws) > 0
    q25, q75 = profile.spread()[50][5][8]
    assert min(draws) >= min(samples[50][5][8]) and max(draws) <= max(samples[50][5][8])
    assert q25 < q75
    again = BatchProfile.from_dict(profile.to_dict())
    assert again.samples == profile.samples and again.warnings == ["x"]
    assert BatchTimes.from_dict(profile.to_dict()).table == profile.times().table
    given = BatchProfile.given({"1": {"1": 0.03, "8": 0.02}})
    assert given.draw(np.random.default_rng(1)).table == given.times().table
    assert given.times().seconds(1, 8) == pytest.approx(0.025)
    with pytest.raises(ValueError, match="at least 5 repeats"):
        collect(FakeTimer(), CONTEXTS, TOKENS, SIZES, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="samples_s"):
        BatchProfile.from_dict({"target_batch_s": {}})


def test_a_slow_spell_of_the_machine_lands_on_several_cells_not_one():
    """Five consecutive forwards run 5.6x slow (another job on the cores): with interleaved
    rounds they hit five different cells once each, and no median moves enough to be re-timed."""
    calls = []

    class Spell(FakeTimer):
        def __call__(self, context, tokens, batch):
            calls.append((context, tokens, batch))
            seconds = super().__call__(context, tokens, batch)
            return seconds * (5.6 if 30 <= len(calls) < 35 else 1.0)

    profile = profile_with(Spell())
    assert len(set(calls[30:35])) == 5
    assert not profile.discarded and not profile.warnings
    cells = len(CONTEXTS) * len(TOKENS) * len(SIZES)
    # Each round times every cell once, in its own order.
    rounds = [calls[i * cells : (i + 1) * cells] for i in range(5)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds) and rounds[0] != rounds[1]


def test_round_loads_are_the_median_slow_down_of_a_round():
    typical = {(0, 1, 1): 1.0, (0, 1, 2): 2.0, (0, 1, 4): 4.0}
    rounds = [
        {(0, 1, 1): 1.0, (0, 1, 2): 2.0, (0, 1, 4): 4.0},
        {(0, 1, 1): 3.0, (0, 1, 2): 6.0, (0, 1, 4): 40.0},  # slow round, one glitch
    ]
    assert round_loads(rounds, typical) == [1.0, 3.0]


class Drifting(FakeTimer):
    """The machine's load falls from 3x to 1x over the first pass of rounds (other jobs end),
    and stays at 1x while flagged cells are re-timed."""

    main_calls = len(CONTEXTS) * len(TOKENS) * len(SIZES) * 5

    def __init__(self, glitch=lambda cell, k: 1.0):
        super().__init__(glitch)
        self.count = 0

    def __call__(self, context, tokens, batch):
        load = 3.0 - 2.0 * min(self.count / self.main_calls, 1.0)
        self.count += 1
        return super().__call__(context, tokens, batch) * load


@pytest.mark.parametrize("factor", [5.6, 0.2], ids=["slow", "fast"])
def test_a_cell_re_timed_after_the_load_fell_is_scaled_to_its_rounds(factor):
    bad_cell = (72, 5, 8)
    clean = profile_with(Drifting())
    glitched = profile_with(Drifting(lambda cell, k: factor if cell == bad_cell and k < 5 else 1.0))
    assert "context 72, 5 tokens per row, batch 8" in glitched.discarded
    assert not glitched.warnings and len(glitched.retime_loads) == 5
    # The re-timing ran at load 1 while the rounds' cells were scaled to their median load.
    assert np.median(glitched.retime_loads) < 0.7
    base, got = charged(clean), charged(glitched)
    for (tokens, batch), seconds in base.items():
        assert abs(got[(tokens, batch)] - seconds) <= neighbours_spread(clean, tokens, batch)
    # Dividing by each round's load leaves the spread of the noise, not of the drift.
    q25, q75 = clean.spread()[40][1][1]
    assert (q75 - q25) / np.median(clean.samples[40][1][1]) < 0.1
