"""Channel-aware relabeling (methods §4.2): exactness with a deterministic tie-break,
monotonicity in the channel, budget, CSI samples that span the evaluation channels, a
trade-off that means the same on a slow and a fast machine."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.csi import (
    CsiSample,
    csi_ranges,
    latin_hypercube,
    repair_cost_rounds,
    round_compute_s,
    sample_csi,
)
from edgespec.wisv.regimes import Pricing
from edgespec.wisv.relabel import (
    TRADE_OFF_KEYS,
    RelabelError,
    check_two_classes,
    csi_feature_columns,
    price_csi_samples,
    relabel_mismatches,
    relabel_over_csi,
    relabel_under_csi,
    safe_fraction_by_channel,
)


def objective(z, risk, cost, lam):
    return z.sum() * cost + lam * ((1 - z) * risk).sum()


def brute_force(risk, cost, lam, budget):
    """Exhaustive optimum over {0,1}^J with the module's tie-break: (best objective, the z
    with the least sum_j (j + 1) z_j among the optimal ones, how many z were optimal)."""
    best, optimal = np.inf, []
    for bits in itertools.product((0, 1), repeat=len(risk)):
        z = np.array(bits, dtype=float)
        if budget is not None and ((1 - z) * risk).sum() > budget * len(risk) + 1e-12:
            continue
        value = objective(z, risk, cost, lam)
        if value < best - 1e-9:
            best, optimal = value, [z]
        elif abs(value - best) <= 1e-9:
            optimal.append(z)
    order = np.arange(1, len(risk) + 1)
    tie = min(optimal, key=lambda z: (z @ order, tuple(z)))
    return best, tie.astype(bool), len(optimal)


@pytest.mark.parametrize("solver", ["HIGHS", "SCIPY"])
def test_matches_brute_force_including_the_tie_break(solver):
    rng = np.random.default_rng(3)
    ties = 0
    for trial in range(16):
        num = int(rng.integers(1, 8))
        cost = float(rng.uniform(0.01, 0.5))
        if trial % 2:  # graded risks
            risk = rng.random(num)
            lam = float(rng.uniform(0.0, 1.0))
            budget = None if trial % 3 == 0 else float(rng.uniform(0.0, 0.4))
        else:  # 0/1 risks, skipping preferred, a budget that binds: many optimal z
            num = max(num, 3)
            risk = rng.integers(0, 2, num).astype(float)
            risk[:2] = 1.0
            lam = cost * float(rng.uniform(0.2, 0.9))
            budget = float(rng.uniform(0.1, 0.4))
        z = relabel_mismatches(risk, cost, lam, budget, solver=solver)
        best, expected, optimal = brute_force(risk, cost, lam, budget)
        assert z.dtype == bool and z.shape == (num,)
        assert objective(z.astype(float), risk, cost, lam) == pytest.approx(best, abs=1e-9)
        np.testing.assert_array_equal(z, expected)
        ties += optimal > 1
    assert ties >= 3  # the tie-break was exercised


@pytest.mark.parametrize("solver", ["HIGHS", "SCIPY"])
def test_tie_break_repairs_the_earliest_of_equal_risks(solver):
    # Four answer-changing mismatches and a budget that lets one be skipped (the issue's
    # case), and the mirror image: the earliest are repaired whatever the solver.
    risk = np.array([1.0, 1.0, 0.0, 1.0, 1.0])
    z = relabel_mismatches(risk, 2.0, 1.0, 0.2, solver=solver)
    np.testing.assert_array_equal(z, [True, True, False, True, False])
    z = relabel_mismatches(risk[::-1].copy(), 2.0, 1.0, 0.2, solver=solver)
    np.testing.assert_array_equal(z, [True, True, False, True, False])


def test_no_budget_is_the_per_item_rule():
    risk = np.array([0.05, 0.2, 0.4, 0.9])
    # lam = 1 s per unit risk, C_rep = 0.3 s: repair iff r > 0.3.
    z = relabel_mismatches(risk, 0.3, 1.0, None)
    np.testing.assert_array_equal(z, [False, False, True, True])


def test_budget_forces_repairs_of_the_riskiest():
    risk = np.array([0.1, 0.5, 0.3, 0.2])
    # Skipping is nearly free (lam small against C_rep), so only the budget forces repairs.
    # Mean skipped risk <= 0.1 means total skipped <= 0.4: two repairs are needed, and the
    # two riskiest leave the least risk skipped (0.3).
    z = relabel_mismatches(risk, 1.0, 0.01, 0.1)
    np.testing.assert_array_equal(z, [False, True, True, False])
    assert risk[~z].sum() <= 0.1 * len(risk)


@pytest.mark.parametrize("budget", [None, 0.15])
def test_worse_channel_never_makes_fewer_safe(budget):
    rng = np.random.default_rng(11)
    risk = rng.random(12)
    costs = np.linspace(0.0, 1.2, 25)
    safe_sets = [~relabel_mismatches(risk, c, 1.0, budget) for c in costs]
    counts = [s.sum() for s in safe_sets]
    assert all(a <= b for a, b in zip(counts, counts[1:], strict=False))
    # Stronger: what is safe under a better channel stays safe under a worse one.
    for better, worse in zip(safe_sets, safe_sets[1:], strict=False):
        assert not np.any(better & ~worse)
    assert counts[0] < counts[-1]  # the sweep actually moves the labels
    if budget is not None:
        assert all(risk[s].sum() <= budget * len(risk) + 1e-9 for s in safe_sets)


def test_infeasible_budget_raises_naming_it():
    with pytest.raises(RelabelError, match="risk_budget"):
        relabel_mismatches(np.array([0.2, 0.4]), 0.1, 1.0, -0.1)


def test_invalid_inputs():
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2, 1.5]), 0.1, 1.0, None)
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2]), -0.1, 1.0, None)
    with pytest.raises(RelabelError):
        relabel_mismatches(np.array([0.2]), 0.1, -1.0, None)
    assert relabel_mismatches(np.array([]), 0.1, 1.0, 0.1).shape == (0,)


PROFILE = LatencyProfile(draft_token_s=0.02, target_token_s=0.03, target_verify_s={4: 0.04})


def test_repair_cost_in_rounds_hand_computed():
    condition = ChannelCondition(name="c", fading="awgn", bandwidth_hz=1e6, snr_db=0.0, rtt_s=0.02)
    t0 = round_compute_s(PROFILE, 4)
    # The head's decodes run gamma + 1 draft forwards a round (the last token's hidden state).
    assert t0 == pytest.approx(5 * 0.02 + 0.04)
    assert round_compute_s(PROFILE, 4, head_s=0.01) == pytest.approx(t0 + 0.01)
    # AWGN: the next block's rate is W log2(1 + 1) = 1 Mbit/s whatever the gain.
    cost = repair_cost_rounds(CsiSample(condition, 0.3), 2e5, t0)
    assert cost == pytest.approx((t0 + 0.2 + 0.02) / t0)
    # Packet errors: PER = 0.5 exp(0) = 0.5 at any SNR; two 1e5-bit packets, one retry: the
    # retry happens with probability 1 - 0.5^2 after the 0.02 s RTT and resends 1e5 bits.
    lossy = ChannelCondition(
        name="c", fading="awgn", bandwidth_hz=1e6, snr_db=0.0, rtt_s=0.02, per_a=0.5
    )
    arq = ArqSettings(packet_bits=100_000, max_retransmissions=1)
    cost = repair_cost_rounds(CsiSample(lossy, 0.3), 2e5, t0, arq)
    assert cost == pytest.approx((t0 + 0.2 + 0.02 + 0.75 * 0.02 + 0.1) / t0)
    with pytest.raises(ValueError):
        repair_cost_rounds(CsiSample(condition, 0.3), 2e5, 0.0)


def _rayleigh(snr_db, bandwidth_hz=1e6, rtt_s=0.02, correlation=0.8):
    return ChannelCondition(
        name="c",
        fading="rayleigh",
        bandwidth_hz=bandwidth_hz,
        snr_db=snr_db,
        rtt_s=rtt_s,
        correlation=correlation,
    )


def test_repair_cost_uses_the_csi_through_the_correlation():
    t0 = round_compute_s(PROFILE, 4)
    faded = repair_cost_rounds(CsiSample(_rayleigh(5.0), 0.05), 6e4, t0)
    strong = repair_cost_rounds(CsiSample(_rayleigh(5.0), 3.0), 6e4, t0)
    assert faded > strong > 1.0
    # Independent blocks: the current gain says nothing about the repair round.
    blind = [
        repair_cost_rounds(CsiSample(_rayleigh(5.0, correlation=0.0), g), 6e4, t0)
        for g in (0.05, 3.0)
    ]
    assert blind[0] == pytest.approx(blind[1])


def _mismatches():
    rng = np.random.default_rng(5)
    risk = np.round(rng.random(10), 3)
    return pd.DataFrame(
        {
            "prompt_id": ["a"] * 4 + ["b"] * 6,
            "risk": risk,
            "label": (risk > 0.5).astype(int),
        },
        index=np.arange(100, 110),
    )


def _csi(costs):
    return [
        {"features": {"snr_db": 30.0 - 10 * i, "rate_mbps": 100.0 / (i + 1)}, "repair_cost": c}
        for i, c in enumerate(costs)
    ]


def test_relabel_over_csi_rows_and_groups():
    mism = _mismatches()
    costs = [0.1, 0.4, 0.8]
    out = relabel_over_csi(mism, _csi(costs), lam=1.0, risk_budget=0.3)
    assert len(out) == len(mism) * len(costs)
    assert csi_feature_columns(out) == ["phi_snr_db", "phi_rate_mbps"]
    assert set(out["label_csi"]) <= {0, 1}
    for sample_id, cost in enumerate(costs):
        rows = out[out["csi_sample"] == sample_id]
        assert list(rows["mismatch"]) == list(mism.index)
        assert (rows["repair_cost"] == cost).all()
        assert (rows["phi_snr_db"] == 30.0 - 10 * sample_id).all()
        # Each prompt group is one optimisation with its own budget.
        for _, pos in mism.groupby("prompt_id").indices.items():
            expected = relabel_mismatches(mism["risk"].to_numpy()[pos], cost, 1.0, 0.3)
            np.testing.assert_array_equal(rows["label_csi"].to_numpy()[pos], expected)
    np.testing.assert_array_equal(out["label"].to_numpy()[: len(mism)], mism["label"])


def test_safe_fraction_rises_with_repair_cost():
    mism = _mismatches()
    costs = [0.8, 0.05, 0.4, 0.2]  # deliberately unsorted
    table = safe_fraction_by_channel(relabel_over_csi(mism, _csi(costs), 1.0, None))
    assert list(table["repair_cost"]) == sorted(costs)
    assert (table["n_mismatches"] == len(mism)).all()
    assert table["safe_fraction"].is_monotonic_increasing
    assert table["safe_fraction"].iloc[0] < table["safe_fraction"].iloc[-1]
    assert {"phi_snr_db", "phi_rate_mbps", "skipped_risk_mean"} <= set(table.columns)


def test_relabel_over_csi_errors():
    mism = _mismatches()
    with pytest.raises(RelabelError, match="risk_budget"):
        relabel_over_csi(mism, _csi([0.1]), 1.0, -0.5)
    with pytest.raises(RelabelError):
        relabel_over_csi(mism, [{"features": {"snr_db": 1.0}}], 1.0, None)
    bad = _csi([0.1, 0.2])
    bad[1]["features"] = {"snr_db": 1.0}
    with pytest.raises(RelabelError):
        relabel_over_csi(mism, bad, 1.0, None)


# --------------------------------------------------------------------------------------------
# CSI samples and the trade-off through the channel model
# --------------------------------------------------------------------------------------------

CHANNELS = {
    "poor": {"fading": "rayleigh", "bandwidth_hz": 1e6, "snr_db": 0.0, "rtt_s": 0.05},
    "good": {"fading": "rayleigh", "bandwidth_hz": 2e7, "snr_db": 20.0, "rtt_s": 0.01},
}
FH_BITS = 4 * (896 * 16 + 18)


def test_csi_samples_span_the_evaluation_channels():
    ranges = csi_ranges(CHANNELS)
    assert ranges == {"bandwidth_hz": (1e6, 2e7), "snr_db": (0.0, 20.0), "rtt_s": (0.01, 0.05)}
    assert csi_ranges(CHANNELS, {"snr_db_range": [-5, 25]})["snr_db"] == (-5.0, 25.0)
    with pytest.raises(ValueError, match="wisv.relabel.rtt_s_range"):
        csi_ranges(CHANNELS, {"rtt_s_range": [0.1, 0.0]})
    samples = sample_csi(ranges, 40, np.random.default_rng(0), correlation=0.8)
    snr = np.array([s.condition.snr_db for s in samples])
    width = np.array([s.condition.bandwidth_hz for s in samples])
    rtt = np.array([s.condition.rtt_s for s in samples])
    # A Latin hypercube: one sample in each of the 40 strata of every range.
    for values, (low, high) in ((snr, (0, 20)), (rtt, (0.01, 0.05))):
        strata = np.floor((values - low) / (high - low) * 40).astype(int)
        assert sorted(strata) == list(range(40))
    log_w = (np.log(width) - np.log(1e6)) / (np.log(2e7) - np.log(1e6))
    assert sorted(np.floor(log_w * 40).astype(int)) == list(range(40))
    assert all(s.condition.correlation == 0.8 for s in samples)
    gains = np.array([s.gain for s in samples])
    assert sorted(np.floor((1 - np.exp(-gains)) * 40).astype(int)) == list(range(40))
    points = latin_hypercube(7, 3, np.random.default_rng(1))
    assert points.shape == (7, 3) and ((points >= 0) & (points < 1)).all()


def _relabel_through_channels(samples, profile, lam=2.0, budget=None):
    mism = _mismatches()
    csi = price_csi_samples(samples, ["snr_db_instantaneous"], FH_BITS, round_compute_s(profile, 4))
    return mism, relabel_over_csi(mism, csi, lam, budget)


@pytest.mark.parametrize("budget", [None, 0.25])
def test_worse_channel_relabels_at_least_as_many_safe(budget):
    # (With the budget, the budget binds on every channel here: the counts may all be equal.)
    """On the same mismatches, each step to a worse channel (lower SNR, narrower band, longer
    RTT, a deeper current fade) keeps every safe label safe."""
    steps = [
        CsiSample(_rayleigh(20.0, 2e7, 0.01), 2.0),
        CsiSample(_rayleigh(10.0, 2e7, 0.01), 2.0),
        CsiSample(_rayleigh(10.0, 5e6, 0.01), 2.0),
        CsiSample(_rayleigh(10.0, 5e6, 0.05), 2.0),
        CsiSample(_rayleigh(10.0, 5e6, 0.05), 0.05),
        CsiSample(_rayleigh(0.0, 1e6, 0.05), 0.05),
    ]
    fast = LatencyProfile(draft_token_s=0.005, target_token_s=0.01, target_verify_s={4: 0.01})
    mism, out = _relabel_through_channels(steps, fast, budget=budget)
    safe = [out.loc[out["csi_sample"] == i, "label_csi"].to_numpy() == 0 for i in range(len(steps))]
    costs = [out.loc[out["csi_sample"] == i, "repair_cost"].iloc[0] for i in range(len(steps))]
    assert costs == sorted(costs)
    for better, worse in zip(safe, safe[1:], strict=False):
        assert not np.any(better & ~worse)
    if budget is None:
        assert safe[0].sum() < safe[-1].sum()  # the sweep actually moves the labels


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_best_channel_keeps_important_mismatches_on_slow_and_fast_machines(scale):
    """lambda in rounds: a 10x slower machine (a compute round of 2 s, more than lambda = 1.5
    would be in seconds) must not turn the best channel's important mismatches safe."""
    profile = LatencyProfile(
        draft_token_s=0.03 * scale, target_token_s=0.03 * scale, target_verify_s={4: 0.08 * scale}
    )
    samples = sample_csi(csi_ranges(CHANNELS), 16, np.random.default_rng(4), 0.8)
    # No budget: the budget would force the riskiest repairs whatever lambda says.
    mism, out = _relabel_through_channels(samples, profile, lam=1.5, budget=None)
    best = out[out["repair_cost"] == out["repair_cost"].min()]
    important = mism["risk"].to_numpy() > 0.9
    assert important.any()
    assert (best["label_csi"].to_numpy()[important] == 1).all()
    # The channel still matters: the worst sample makes more mismatches safe than the best.
    worst = out[out["repair_cost"] == out["repair_cost"].max()]
    assert (worst["label_csi"] == 0).sum() >= (best["label_csi"] == 0).sum()


def test_one_class_label_set_stops_with_counts_and_keys():
    check_two_classes([0, 1, 1], "relabeled labels")
    with pytest.raises(RelabelError) as err:
        check_two_classes([0] * 12, "relabeled labels", " (3 mismatches x 4 CSI samples)")
    text = str(err.value)
    assert "12 safe and 0 important of 12" in text and "3 mismatches x 4 CSI samples" in text
    for key in TRADE_OFF_KEYS:
        assert key in text


def test_each_csi_sample_is_priced_with_its_own_cost():
    samples = sample_csi(csi_ranges(CHANNELS), 5, np.random.default_rng(2), 0.8)
    t0 = round_compute_s(PROFILE, 4)
    priced = price_csi_samples(samples, ["rtt_ms", "gain_db"], FH_BITS, t0)
    assert len(priced) == len(samples)
    for sample, entry in zip(samples, priced, strict=True):
        assert entry["repair_cost"] == repair_cost_rounds(sample, FH_BITS, t0)
        assert entry["features"] == sample.features(["rtt_ms", "gain_db"])
    assert len({entry["repair_cost"] for entry in priced}) == len(samples)


PRICING = Pricing(
    "measured",
    PROFILE,
    {"vocab_size": 60, "hidden_size": 896, "bits_per_value": 16},
    {"head_round_s": {"wisv_head": 0.002}},
    "a test pricing",
)
RELABEL_SETTINGS = {
    "relabel": {
        "gamma": 4,
        "num_csi_samples": 4,
        "lam_rounds_per_risk": 3.0,
        "risk_budget": None,
    },
    "correlation": 0.8,
    "csi_features": ["snr_db_instantaneous", "rtt_ms"],
}


def _mined(labels=None):
    """Mined mismatches of three prompts, listed out of response order, graded risks."""
    rng = np.random.default_rng(11)
    # lam * risk straddles the samples' repair costs (1.18 to 1.41 rounds).
    risk = rng.permutation([0.05, 0.1, 0.2, 0.3, 0.38, 0.41, 0.43, 0.45, 0.5, 0.7, 0.8, 0.95])
    return pd.DataFrame(
        {
            "prompt_id": ["b", "a", "c", "a", "b", "c", "a", "b", "c", "a", "b", "c"],
            "position": [5, 2, 1, 0, 1, 7, 9, 3, 4, 4, 8, 2],
            "draft_token": rng.integers(0, 40, 12),
            "target_token": rng.integers(0, 60, 12),
            "risk": risk,
            "label": (risk > 0.5).astype(np.int64) if labels is None else labels,
        }
    )


def test_relabeling_under_csi_prices_every_sample_itself():
    """The rule's loop: the same samples the seeded generator draws, each repaired at its own
    cost (the FH upload of one round, T_0 of the profile), the no-budget rule per sample,
    each prompt's mismatches in response order, and the summary."""
    table = _mined()
    run = relabel_under_csi(
        table, PRICING, CHANNELS, RELABEL_SETTINGS, np.random.default_rng(9), "m.parquet"
    )
    samples = sample_csi(csi_ranges(CHANNELS, {}), 4, np.random.default_rng(9), 0.8)
    bits = 4 * (896 * 16 + 6)  # vocabulary of 60 tokens: 6-bit ids
    t0 = round_compute_s(PROFILE, 4, head_s=0.002)  # the CSI head's time in the repair round
    costs = [repair_cost_rounds(s, bits, t0) for s in samples]
    out = run.relabeled
    ordered = table.sort_values(["prompt_id", "position"], kind="stable").index.to_numpy()
    for i, cost in enumerate(costs):
        rows = out[out["csi_sample"] == i]
        np.testing.assert_array_equal(rows["mismatch"].to_numpy(), ordered)
        assert (rows["repair_cost"] == cost).all()
        expected = (3.0 * table.loc[ordered, "risk"].to_numpy() > cost).astype(np.int64)
        np.testing.assert_array_equal(rows["label_csi"].to_numpy(), expected)
        features = samples[i].features(["snr_db_instantaneous", "rtt_ms"])
        assert (rows["phi_rtt_ms"] == features["rtt_ms"]).all()
    # The costs differ enough across samples to move labels.
    assert len({tuple(out.loc[out["csi_sample"] == i, "label_csi"]) for i in range(4)}) > 1
    assert list(run.safe["repair_cost"]) == sorted(costs)
    assert {"snr_db_mean", "rate_mbps"} <= set(run.safe.columns)
    summary = run.summary
    assert summary["uplink_bits"] == bits and summary["round_compute_s"] == pytest.approx(t0)
    assert summary["repair_cost_rounds"] == [min(costs), max(costs)]
    assert summary["safe_before"] == pytest.approx((table["label"] == 0).mean())
    assert summary["safe_after"] == pytest.approx((out["label_csi"] == 0).mean())
    assert summary["safe_best_channel"] == run.safe["safe_fraction"].iloc[0]
    assert summary["csi_samples"] == 4 and summary["mismatches"] == len(table)


def test_relabeling_under_csi_stops_on_one_class_naming_the_file():
    table = _mined(labels=np.zeros(12, dtype=np.int64))
    with pytest.raises(RelabelError, match=r"mined labels \(m.parquet\): 12 safe and 0"):
        relabel_under_csi(
            table, PRICING, CHANNELS, RELABEL_SETTINGS, np.random.default_rng(9), "m.parquet"
        )
