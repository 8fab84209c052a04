"""Channel model: fading statistics, Shannon rates, link budget, configuration errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from edgespec.wireless.channel import (
    ChannelCondition,
    ChannelError,
    achievable_mean_rate,
    csi_features,
    db_to_linear,
    ergodic_rate_bps,
    expected_rate_given_gain,
    fading_coefficients,
    fading_power_gain,
    gauss_markov,
    linear_to_db,
    rician_k_moment_estimate,
    sample_power_gains,
    sample_uplink_rates,
    shannon_rate_bps,
    uplink_rate_bps,
)

N = 1_000_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- fading statistics


@pytest.mark.parametrize(
    "fading,k", [("rayleigh", 0.0), ("rician", 1.0), ("rician", 5.0), ("rician", 20.0)]
)
def test_power_gain_is_energy_normalised(fading, k):
    gain = fading_power_gain(N, fading, k, rng(1))
    assert gain.shape == (N,)
    assert np.all(gain >= 0)
    # std of the mean is at most 1e-3 (Rayleigh); 5 sigma.
    assert abs(gain.mean() - 1.0) < 5e-3


def test_rayleigh_power_gain_is_exp1():
    gain = fading_power_gain(N, "rayleigh", 0.0, rng(2))
    # Var of Exp(1) is 1; the sample variance has std sqrt(8 / N) ~ 2.8e-3.
    assert abs(gain.var() - 1.0) < 1.5e-2
    assert stats.kstest(gain, stats.expon.cdf).pvalue > 1e-3


@pytest.mark.parametrize("k", [1.0, 5.0, 20.0])
def test_rician_k_factor_recovered(k):
    h = fading_coefficients(N, "rician", k, rng(3))
    # LOS mean sqrt(K/(K+1)), scattered variance 1/(K+1): K = |E h|^2 / Var h.
    k_from_h = abs(h.mean()) ** 2 / h.var()
    assert k_from_h == pytest.approx(k, rel=2e-2)
    gain = h.real**2 + h.imag**2
    assert rician_k_moment_estimate(gain) == pytest.approx(k, rel=3e-2)
    # Var |h|^2 = (2K + 1) / (K + 1)^2 for the energy-normalised Rician.
    assert gain.var() == pytest.approx((2 * k + 1) / (k + 1) ** 2, rel=2e-2)


@pytest.mark.parametrize("k", [1.0, 5.0])
def test_rician_power_gain_distribution(k):
    gain = fading_power_gain(200_000, "rician", k, rng(4))
    # 2 (K + 1) |h|^2 ~ noncentral chi-square, 2 degrees of freedom, noncentrality 2K.
    scaled = 2 * (k + 1) * gain
    assert stats.kstest(scaled, stats.ncx2(df=2, nc=2 * k).cdf).pvalue > 1e-3


def test_rician_k0_is_rayleigh_and_awgn_is_flat():
    a = fading_power_gain(1000, "rician", 0.0, rng(5))
    b = fading_power_gain(1000, "rayleigh", 0.0, rng(5))
    np.testing.assert_array_equal(a, b)
    generator = rng(6)
    state = generator.bit_generator.state
    np.testing.assert_array_equal(fading_power_gain(7, "awgn", 0.0, generator), np.ones(7))
    assert generator.bit_generator.state == state  # AWGN consumes no draws


def test_same_seed_same_draws():
    cond = ChannelCondition(name="c", fading="rician", k_factor=3.0, bandwidth_hz=1e7, snr_db=5)
    np.testing.assert_array_equal(
        sample_uplink_rates(cond, 100, rng(7)), sample_uplink_rates(cond, 100, rng(7))
    )
    assert not np.array_equal(
        sample_uplink_rates(cond, 100, rng(7)), sample_uplink_rates(cond, 100, rng(8))
    )
    gains = sample_power_gains(cond, 100, rng(7))
    np.testing.assert_allclose(uplink_rate_bps(cond, gains), sample_uplink_rates(cond, 100, rng(7)))


def test_rng_must_be_a_generator():
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        fading_power_gain(3, "rayleigh", 0.0, 42)
    with pytest.raises(ChannelError, match="fading must be one of"):
        fading_power_gain(3, "nakagami", 0.0, rng())
    with pytest.raises(ChannelError, match="Rician fading only"):
        fading_power_gain(3, "rayleigh", 2.0, rng())
    with pytest.raises(ChannelError, match="non-negative integer"):
        fading_power_gain(-1, "rayleigh", 0.0, rng())


# ---------------------------------------------------------------- rates


def test_db_conversions():
    assert db_to_linear(10) == pytest.approx(10.0)
    assert db_to_linear(-20) == pytest.approx(0.01)
    np.testing.assert_allclose(linear_to_db(np.array([1.0, 100.0])), [0.0, 20.0])
    assert linear_to_db(0.0) == -math.inf
    with pytest.raises(ChannelError):
        linear_to_db(-1.0)


def test_shannon_rate_hand_computed():
    # W = 10 MHz: 10 dB -> 1e7 log2(11) = 34.594 Mb/s; -20 dB -> 1e7 log2(1.01) = 143.55 kb/s.
    assert shannon_rate_bps(10e6, db_to_linear(10)) == pytest.approx(34.594e6, rel=1e-4)
    assert shannon_rate_bps(10e6, db_to_linear(-20)) == pytest.approx(143.55e3, rel=1e-4)
    # A fade of |h|^2 = 0.1 at 10 dB is 0 dB: 1e7 log2(2) = 10 Mb/s.
    assert shannon_rate_bps(10e6, 10.0, 0.1) == pytest.approx(10e6)
    np.testing.assert_allclose(shannon_rate_bps(1.0, 1.0, np.array([0.0, 1.0, 3.0])), [0, 1, 2])
    with pytest.raises(ChannelError, match="linear, not dB"):
        shannon_rate_bps(10e6, -20.0)


def test_mean_rate_and_ergodic_rate():
    cond = ChannelCondition(name="c", fading="rayleigh", bandwidth_hz=10e6, snr_db=10)
    assert achievable_mean_rate(cond) == pytest.approx(10e6 * math.log2(11))
    # Rayleigh closed form: W log2(e) e^(1/rho) E1(1/rho).
    closed = 10e6 * math.log2(math.e) * math.exp(0.1) * special.exp1(0.1)
    assert ergodic_rate_bps(cond) == pytest.approx(closed, rel=1e-6)
    assert ergodic_rate_bps(cond) < achievable_mean_rate(cond)  # Jensen
    assert sample_uplink_rates(cond, N, rng(9)).mean() == pytest.approx(closed, rel=2e-3)
    rician = ChannelCondition(
        name="r", fading="rician", k_factor=5.0, bandwidth_hz=10e6, snr_db=-20
    )
    mc = sample_uplink_rates(rician, N, rng(10)).mean()
    assert ergodic_rate_bps(rician) == pytest.approx(mc, rel=2e-3)
    awgn = ChannelCondition(name="a", fading="awgn", bandwidth_hz=10e6, snr_db=-20)
    np.testing.assert_allclose(sample_uplink_rates(awgn, 3, rng()), 143.55e3, rtol=1e-4)
    assert ergodic_rate_bps(awgn) == pytest.approx(achievable_mean_rate(awgn))


# ---------------------------------------------------------------- link budget and config


def test_link_budget_snr_hand_computed():
    # PL(20 m) = 40 + 30 log10(20) = 79.031 dB; noise = -174 + 70 + 7 = -97 dBm;
    # SNR = 23 - 79.031 + 97 = 40.969 dB.
    cond = ChannelCondition(
        name="near", fading="rayleigh", bandwidth_hz=10e6, tx_power_dbm=23, distance_m=20
    )
    assert cond.path_loss_db() == pytest.approx(79.0309, abs=1e-4)
    assert cond.noise_power_dbm() == pytest.approx(-97.0)
    assert cond.mean_snr_db() == pytest.approx(40.9691, abs=1e-4)
    assert cond.mean_snr_linear() == pytest.approx(10**4.09691, rel=1e-5)
    far = ChannelCondition(
        name="far",
        fading="awgn",
        bandwidth_hz=1e6,
        tx_power_dbm=0,
        distance_m=100,
        path_loss_exponent=3.5,
        reference_loss_db=30,
        noise_figure_db=0,
    )
    # PL = 30 + 70 = 100 dB; noise = -174 + 60 = -114 dBm; SNR = 0 - 100 + 114 = 14 dB.
    assert far.mean_snr_db() == pytest.approx(14.0)


def test_from_dict_round_trip_and_errors():
    good = {
        "name": "poor",
        "fading": "Rician",
        "bandwidth_hz": "1e6",
        "k_factor": 3,
        "snr_db": 0,
        "rtt_s": 0.02,
    }
    cond = ChannelCondition.from_dict(good)
    assert cond.fading == "rician" and cond.bandwidth_hz == 1e6
    assert ChannelCondition.from_dict(cond.to_dict()) == cond

    with pytest.raises(ChannelError, match="neither snr_db nor a link budget"):
        ChannelCondition.from_dict({"name": "x", "fading": "rayleigh", "bandwidth_hz": 1e6})
    with pytest.raises(ChannelError, match="missing distance_m"):
        ChannelCondition.from_dict(
            {"name": "x", "fading": "rayleigh", "bandwidth_hz": 1e6, "tx_power_dbm": 23}
        )
    with pytest.raises(ChannelError, match="not both"):
        ChannelCondition.from_dict(
            {
                "name": "x",
                "fading": "awgn",
                "bandwidth_hz": 1e6,
                "snr_db": 3,
                "tx_power_dbm": 23,
                "distance_m": 5,
            }
        )
    with pytest.raises(ChannelError, match="missing required key 'bandwidth_hz'"):
        ChannelCondition.from_dict({"name": "x", "fading": "awgn", "snr_db": 3})
    with pytest.raises(ChannelError, match=r"unknown key\(s\) \['snr'\]"):
        ChannelCondition.from_dict({"name": "x", "fading": "awgn", "bandwidth_hz": 1, "snr": 3})
    with pytest.raises(ChannelError, match="'x'.*bandwidth_hz must be a number"):
        ChannelCondition.from_dict(
            {"name": "x", "fading": "awgn", "bandwidth_hz": "wide", "snr_db": 3}
        )
    with pytest.raises(ChannelError, match="bandwidth_hz must be > 0"):
        ChannelCondition.from_dict({"name": "x", "fading": "awgn", "bandwidth_hz": 0, "snr_db": 3})
    with pytest.raises(ChannelError, match="fading must be one of"):
        ChannelCondition.from_dict({"name": "x", "fading": "fast", "bandwidth_hz": 1, "snr_db": 3})
    with pytest.raises(ChannelError, match="Rician fading only"):
        ChannelCondition.from_dict(
            {"name": "x", "fading": "rayleigh", "bandwidth_hz": 1, "snr_db": 3, "k_factor": 4}
        )
    with pytest.raises(ChannelError, match="distance_m must be > 0"):
        ChannelCondition.from_dict(
            {"name": "x", "fading": "awgn", "bandwidth_hz": 1, "tx_power_dbm": 3, "distance_m": 0}
        )
    with pytest.raises(ChannelError, match="rtt_s must be >= 0"):
        ChannelCondition.from_dict(
            {"name": "x", "fading": "awgn", "bandwidth_hz": 1, "snr_db": 3, "rtt_s": -1}
        )
    with pytest.raises(ChannelError, match="must be a mapping"):
        ChannelCondition.from_dict([("name", "x")])


def test_csi_features():
    cond = ChannelCondition(name="c", fading="rayleigh", bandwidth_hz=10e6, snr_db=10, rtt_s=0.025)
    feats = csi_features(cond, 0.1)
    assert feats["snr_db_mean"] == pytest.approx(10.0)
    assert feats["snr_db_instantaneous"] == pytest.approx(0.0)
    assert feats["gain_db"] == pytest.approx(-10.0)
    assert feats["spectral_efficiency"] == pytest.approx(1.0)
    assert feats["rate_mbps"] == pytest.approx(10.0)
    assert feats["mean_rate_mbps"] == pytest.approx(34.594, rel=1e-4)
    assert feats["rtt_ms"] == pytest.approx(25.0)
    batch = csi_features(cond, np.array([0.0, 1.0]))
    assert batch["snr_db_instantaneous"].shape == (2,)
    assert np.all(np.isfinite(batch["snr_db_instantaneous"]))  # deep fade floored, not -inf
    assert batch["rate_mbps"][0] == 0.0


# ---------------------------------------------------------------- time-correlated fading


@pytest.mark.parametrize("c", [0.5, 0.9])
def test_gauss_markov_fading_has_the_configured_block_correlation(c):
    h = fading_coefficients(200_000, "rayleigh", 0.0, rng(21), correlation=c)
    lag1 = np.mean(h[1:] * np.conj(h[:-1]))
    assert abs(lag1.real - c) < 0.01 and abs(lag1.imag) < 0.01
    g = np.abs(h) ** 2
    # |h|^2 stays Exp(1) block by block; its lag-1 correlation is c^2 for Rayleigh.
    assert abs(g.mean() - 1.0) < 0.02
    assert abs(np.corrcoef(g[1:], g[:-1])[0, 1] - c * c) < 0.02
    assert stats.kstest(g[::50], "expon").pvalue > 1e-3


def test_correlation_reuses_the_same_draws_and_zero_is_independent():
    independent = fading_coefficients(1000, "rician", 3.0, rng(4))
    assert np.array_equal(independent, fading_coefficients(1000, "rician", 3.0, rng(4), 0.0))
    correlated = fading_coefficients(1000, "rician", 3.0, rng(4), 0.8)
    los = math.sqrt(3.0 / 4.0)
    s0, s1 = (independent - los) / math.sqrt(0.25), (correlated - los) / math.sqrt(0.25)
    assert np.allclose(s1[0], s0[0]) and np.allclose(s1[1:], 0.8 * s1[:-1] + 0.6 * s0[1:])
    lag1 = np.corrcoef(np.abs(independent[1:]), np.abs(independent[:-1]))[0, 1]
    assert abs(lag1) < 0.1


def test_condition_correlation_is_validated_and_used():
    with pytest.raises(ChannelError, match="correlation"):
        ChannelCondition(name="x", fading="rayleigh", bandwidth_hz=1e6, snr_db=0, correlation=1.0)
    cond = ChannelCondition(
        name="x", fading="rayleigh", bandwidth_hz=1e6, snr_db=0, correlation=0.7
    )
    assert ChannelCondition.from_dict(cond.to_dict()) == cond
    assert np.array_equal(
        sample_power_gains(cond, 50, rng(9)), fading_power_gain(50, "rayleigh", 0.0, rng(9), 0.7)
    )


# ---------------------------------------------------------------- rate given the current CSI


@pytest.mark.parametrize("c", [0.5, 0.9])
@pytest.mark.parametrize("lag", [1, 3])
def test_expected_rate_given_gain_matches_monte_carlo(c, lag):
    """E[R_{n+lag} | |h_n|^2 = g] against simulated Gauss-Markov paths started at that gain."""
    condition = ChannelCondition(
        name="c", fading="rayleigh", bandwidth_hz=1e6, snr_db=3.0, correlation=c
    )
    draws = 200_000
    generator = rng(5)
    for g0 in (0.0, 0.02, 0.7, 2.5, 6.0):
        start = np.full(draws, math.sqrt(g0), dtype=complex)  # the phase does not matter
        normal = generator.standard_normal((lag, draws, 2))
        w = (normal[..., 0] + 1j * normal[..., 1]) / math.sqrt(2.0)
        path = gauss_markov(np.concatenate([start[None], w]), c)
        rates = uplink_rate_bps(condition, np.abs(path[lag]) ** 2)
        error = rates.std() / math.sqrt(draws)
        assert abs(expected_rate_given_gain(condition, g0, lag) - rates.mean()) < 4.5 * error


def test_expected_rate_given_gain_limits_and_errors():
    base = dict(name="c", fading="rayleigh", bandwidth_hz=2e6, snr_db=10.0)
    independent = ChannelCondition(**base)
    assert expected_rate_given_gain(independent, 0.01) == pytest.approx(
        ergodic_rate_bps(independent), rel=1e-9
    )
    correlated = ChannelCondition(**base, correlation=0.9)
    rates = expected_rate_given_gain(correlated, np.array([0.01, 0.3, 1.0, 4.0]))
    assert np.all(np.diff(rates) > 0)  # a stronger block now predicts a faster one next
    # Further ahead, the prediction returns to the ergodic rate.
    far = expected_rate_given_gain(correlated, 4.0, lag=200)
    assert far == pytest.approx(ergodic_rate_bps(correlated), rel=1e-6)
    awgn = ChannelCondition(name="a", fading="awgn", bandwidth_hz=1e6, snr_db=0.0)
    assert expected_rate_given_gain(awgn, 0.2) == pytest.approx(1e6)
    rician = ChannelCondition(name="r", fading="rician", k_factor=3.0, bandwidth_hz=1e6, snr_db=0.0)
    with pytest.raises(ChannelError, match="Rayleigh"):
        expected_rate_given_gain(rician, 1.0)
    with pytest.raises(ChannelError, match="lag"):
        expected_rate_given_gain(correlated, 1.0, lag=0)
    with pytest.raises(ChannelError, match="gain"):
        expected_rate_given_gain(correlated, -1.0)
