"""Wireless uplink model: block fading and Shannon-rate links (methods §5).

The uplink rate of one round (WISV) or one token (CU-HLM) is

    R = W * log2(1 + rho * |h|^2)   [bit/s]

with W the bandwidth [Hz], rho the average SNR [linear] and |h|^2 the small-scale power gain of
that block, normalised so that E|h|^2 = 1 (the fading changes the instantaneous SNR, never its
mean). The average SNR is either given (``snr_db``) or follows from a link budget,

    rho [dB] = P_tx [dBm] - PL(d) [dB] - (N_0 [dBm/Hz] + 10 log10 W + NF [dB]),
    PL(d) = PL_0 + 10 n log10(d / 1 m),

a log-distance path loss with reference loss PL_0 at 1 m and exponent n.

Fading models (block fading: one draw per round or token):

- ``"rayleigh"``: h ~ CN(0, 1), so |h|^2 ~ Exp(1).
- ``"rician"``: h = sqrt(K / (K + 1)) + sqrt(1 / (K + 1)) * CN(0, 1), K the linear K-factor
  (LOS-to-scattered power ratio, LOS phase 0); 2 (K + 1) |h|^2 is noncentral chi-square with
  2 degrees of freedom and noncentrality 2K. K = 0 is Rayleigh.
- ``"awgn"``: h = 1, no fading.

Consecutive blocks are correlated by a first-order Gauss-Markov process on the scattered
component, s_{n+1} = c s_n + sqrt(1 - c^2) w_n with w_n ~ CN(0, 1) i.i.d. and c the block
correlation (``ChannelCondition.correlation``, in [0, 1); c = 0 gives independent blocks). Each
s_n stays CN(0, 1), so every block keeps the fading law above, and the process consumes the same
standard normals whatever c is: conditions that differ only in c (or in SNR) see the same
underlying draws (common random numbers).

Every random draw comes from a ``numpy.random.Generator`` passed in by the caller.

Pitfall: under Rayleigh fading E[1 / R] diverges (1/x is not integrable at 0 for x ~ Exp(1)),
so a mean of per-token upload times is dominated by deep fades and converges slowly. Fix the
seed, and report throughput as tokens / sum of delays (``edgespec.wireless.delay``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from edgespec.wireless.arq import packet_error_rate

FADING_MODELS = ("rayleigh", "rician", "awgn")

SNR_FLOOR_DB = -100.0
"""Instantaneous SNRs (and gains) in dB are floored here in ``csi_features`` so that a deep
fade gives a finite feature for a learned head instead of -inf."""


class ChannelError(ValueError):
    """An invalid channel configuration or argument."""


def db_to_linear(x):
    """10^(x / 10): dB to a linear power ratio (scalar in, float out; array in, array out)."""
    out = np.power(10.0, np.asarray(x, dtype=float) / 10.0)
    return float(out) if out.ndim == 0 else out


def linear_to_db(x):
    """10 log10(x): a linear power ratio (>= 0) to dB; 0 maps to -inf."""
    arr = np.asarray(x, dtype=float)
    if np.any(arr < 0) or np.any(np.isnan(arr)):
        raise ChannelError("linear_to_db needs non-negative power ratios")
    with np.errstate(divide="ignore"):
        out = 10.0 * np.log10(arr)
    return float(out) if out.ndim == 0 else out


def _check_rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (e.g. np.random.default_rng(seed)), "
            f"got {type(rng).__name__}"
        )
    return rng


def _check_fading(fading: str, k_factor: float) -> str:
    if not isinstance(fading, str) or fading.lower() not in FADING_MODELS:
        raise ChannelError(f"fading must be one of {FADING_MODELS}, got {fading!r}")
    if not (math.isfinite(k_factor) and k_factor >= 0):
        raise ChannelError(f"k_factor must be a finite linear ratio >= 0, got {k_factor}")
    if fading.lower() != "rician" and k_factor != 0:
        raise ChannelError(
            f"k_factor={k_factor} applies to Rician fading only, but fading is {fading!r}"
        )
    return fading.lower()


_NUMERIC_FIELDS = (
    "bandwidth_hz",
    "k_factor",
    "snr_db",
    "tx_power_dbm",
    "distance_m",
    "path_loss_exponent",
    "reference_loss_db",
    "noise_psd_dbm_hz",
    "noise_figure_db",
    "rtt_s",
    "correlation",
    "per_a",
    "per_g",
)
_OPTIONAL_FIELDS = ("snr_db", "tx_power_dbm", "distance_m")


@dataclass(frozen=True)
class ChannelCondition:
    """One named channel: fading model, bandwidth, average SNR (or its link budget) and RTT.

    Units: ``bandwidth_hz`` [Hz]; ``k_factor`` linear (Rician only; 0 elsewhere); ``snr_db``
    average SNR [dB]; ``tx_power_dbm`` [dBm]; ``distance_m`` [m]; ``path_loss_exponent`` n;
    ``reference_loss_db`` path loss at 1 m [dB]; ``noise_psd_dbm_hz`` N_0 [dBm/Hz];
    ``noise_figure_db`` [dB]; ``rtt_s`` round-trip time [s] (fixed per-message delay:
    propagation, scheduling, processing); ``correlation`` c in [0, 1), the Gauss-Markov
    correlation of consecutive fading blocks (0: independent blocks).

    Give exactly one of ``snr_db`` or the link budget (``tx_power_dbm`` and ``distance_m``).
    """

    name: str
    fading: str
    bandwidth_hz: float
    k_factor: float = 0.0
    snr_db: float | None = None
    tx_power_dbm: float | None = None
    distance_m: float | None = None
    path_loss_exponent: float = 3.0
    reference_loss_db: float = 40.0
    noise_psd_dbm_hz: float = -174.0
    noise_figure_db: float = 7.0
    rtt_s: float = 0.0
    correlation: float = 0.0
    per_a: float = 0.0
    per_g: float = 0.0

    def __post_init__(self) -> None:
        label = f"channel condition {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ChannelError(f"{label}: name must be a non-empty string")
        for key in _NUMERIC_FIELDS:
            value = getattr(self, key)
            if value is None and key in _OPTIONAL_FIELDS:
                continue
            if isinstance(value, bool):
                raise ChannelError(f"{label}: {key} must be a number, got {value!r}")
            try:
                object.__setattr__(self, key, float(value))
            except (TypeError, ValueError):
                raise ChannelError(f"{label}: {key} must be a number, got {value!r}") from None
        try:
            fading = _check_fading(self.fading, self.k_factor)
        except ChannelError as err:
            raise ChannelError(f"{label}: {err}") from None
        object.__setattr__(self, "fading", fading)
        if not (math.isfinite(self.bandwidth_hz) and self.bandwidth_hz > 0):
            raise ChannelError(f"{label}: bandwidth_hz must be > 0, got {self.bandwidth_hz}")
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ChannelError(f"{label}: rtt_s must be >= 0, got {self.rtt_s}")
        for key in ("per_a", "per_g"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0):
                raise ChannelError(f"{label}: {key} must be finite and >= 0")
        if not (0.0 <= self.correlation < 1.0):
            raise ChannelError(
                f"{label}: correlation must lie in [0, 1) (0 = independent blocks), "
                f"got {self.correlation}"
            )
        budget = (self.tx_power_dbm, self.distance_m)
        if self.snr_db is not None:
            if any(v is not None for v in budget):
                raise ChannelError(
                    f"{label}: give either snr_db or tx_power_dbm + distance_m, not both"
                )
            if not math.isfinite(self.snr_db):
                raise ChannelError(f"{label}: snr_db must be finite, got {self.snr_db}")
        else:
            missing = [k for k in ("tx_power_dbm", "distance_m") if getattr(self, k) is None]
            if missing:
                raise ChannelError(
                    f"{label}: neither snr_db nor a link budget given "
                    f"(missing {', '.join(missing)})"
                )
            if not (math.isfinite(self.distance_m) and self.distance_m > 0):
                raise ChannelError(f"{label}: distance_m must be > 0, got {self.distance_m}")
            for key in (
                "tx_power_dbm",
                "path_loss_exponent",
                "reference_loss_db",
                "noise_psd_dbm_hz",
                "noise_figure_db",
            ):
                if not math.isfinite(getattr(self, key)):
                    raise ChannelError(f"{label}: {key} must be finite")

    def path_loss_db(self) -> float:
        """PL(d) = PL_0 + 10 n log10(d / 1 m) [dB]; needs the link budget."""
        if self.distance_m is None:
            raise ChannelError(f"channel condition {self.name!r} has no distance_m")
        return self.reference_loss_db + 10.0 * self.path_loss_exponent * math.log10(self.distance_m)

    def noise_power_dbm(self) -> float:
        """N_0 + 10 log10 W + NF [dBm]."""
        return self.noise_psd_dbm_hz + 10.0 * math.log10(self.bandwidth_hz) + self.noise_figure_db

    def mean_snr_db(self) -> float:
        """Average SNR rho [dB]: ``snr_db``, or P_tx - PL(d) - noise power."""
        if self.snr_db is not None:
            return float(self.snr_db)
        return self.tx_power_dbm - self.path_loss_db() - self.noise_power_dbm()

    def mean_snr_linear(self) -> float:
        """Average SNR rho [linear]."""
        return db_to_linear(self.mean_snr_db())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChannelCondition:
        """Build from a config mapping; unknown, missing or non-numeric keys raise ChannelError."""
        if not isinstance(d, Mapping):
            raise ChannelError(f"a channel condition must be a mapping, got {type(d).__name__}")
        known = {f.name: f for f in fields(cls)}
        label = f"channel condition {d.get('name', '<unnamed>')!r}"
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ChannelError(f"{label}: unknown key(s) {unknown}; valid keys are {sorted(known)}")
        for key in ("name", "fading", "bandwidth_hz"):
            if key not in d:
                raise ChannelError(f"{label}: missing required key {key!r}")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """Plain mapping that ``from_dict`` reads back."""
        return asdict(self)


def gauss_markov(innovations: np.ndarray, correlation: float) -> np.ndarray:
    """s_0 = w_0, s_n = c s_{n-1} + sqrt(1 - c^2) w_n along the first axis (c = ``correlation``).

    Unit-variance innovations give unit-variance states; c = 0 returns the innovations.
    """
    c = float(correlation)
    if not 0.0 <= c < 1.0:
        raise ChannelError(f"correlation must lie in [0, 1), got {correlation}")
    w = np.asarray(innovations)
    if c == 0.0 or len(w) == 0:
        return w.copy()
    scale = math.sqrt(1.0 - c * c)
    out = np.empty_like(w)
    out[0] = w[0]
    for i in range(1, len(w)):
        out[i] = c * out[i - 1] + scale * w[i]
    return out


def fading_coefficients(
    n: int, fading: str, k_factor: float, rng, correlation: float = 0.0
) -> np.ndarray:
    """n complex block-fading coefficients h with E|h|^2 = 1 (see the module docstring).

    Rayleigh and Rician draw one [n, 2] standard-normal block from ``rng`` (whatever
    ``correlation`` is); AWGN draws nothing. Consecutive coefficients follow the Gauss-Markov
    process with ``correlation`` on the scattered component.
    """
    fading = _check_fading(fading, float(k_factor))
    if isinstance(n, bool) or int(n) != n or n < 0:
        raise ChannelError(f"n must be a non-negative integer, got {n}")
    n = int(n)
    if fading == "awgn":
        return np.ones(n, dtype=complex)
    _check_rng(rng)
    normal = rng.standard_normal((n, 2))
    scattered = gauss_markov((normal[:, 0] + 1j * normal[:, 1]) / math.sqrt(2.0), correlation)
    k = float(k_factor) if fading == "rician" else 0.0
    return math.sqrt(k / (k + 1.0)) + math.sqrt(1.0 / (k + 1.0)) * scattered


def fading_power_gain(
    n: int, fading: str, k_factor: float, rng, correlation: float = 0.0
) -> np.ndarray:
    """n power gains |h|^2 with E|h|^2 = 1: Exp(1) (Rayleigh), Rician(K), or ones (AWGN),
    consecutive blocks correlated by ``correlation``."""
    h = fading_coefficients(n, fading, k_factor, rng, correlation)
    return h.real**2 + h.imag**2


def rician_k_moment_estimate(power_gain) -> float:
    """Moment estimate of the linear K-factor from |h|^2 samples (Greenstein et al., 1999).

    With g = Var(|h|^2) / E[|h|^2]^2 = (2K + 1) / (K + 1)^2, K = sqrt(1 - g) / (1 - sqrt(1 - g)).
    Returns 0 when the sample is at least as spread as Rayleigh (g >= 1).
    """
    x = np.asarray(power_gain, dtype=float)
    if x.size < 2:
        raise ChannelError("need at least two samples to estimate K")
    g = x.var() / x.mean() ** 2
    if g >= 1:
        return 0.0
    root = math.sqrt(1.0 - g)
    return root / (1.0 - root)


def shannon_rate_bps(bandwidth_hz, snr_linear, gain=1.0):
    """R = W log2(1 + SNR |h|^2) [bit/s]; broadcasts over arrays (float for scalar inputs)."""
    w = np.asarray(bandwidth_hz, dtype=float)
    snr = np.asarray(snr_linear, dtype=float)
    g = np.asarray(gain, dtype=float)
    if np.any(~(w > 0)):
        raise ChannelError("bandwidth_hz must be > 0")
    if np.any(~(snr >= 0)) or np.any(~(g >= 0)):
        raise ChannelError("snr_linear and gain must be >= 0 (linear, not dB)")
    out = w * np.log2(1.0 + snr * g)
    return float(out) if out.ndim == 0 else out


def sample_power_gains(condition: ChannelCondition, n: int, rng) -> np.ndarray:
    """n consecutive block-fading power gains |h|^2 for ``condition`` (one per round or token),
    correlated by ``condition.correlation``."""
    return fading_power_gain(n, condition.fading, condition.k_factor, rng, condition.correlation)


def uplink_rate_bps(condition: ChannelCondition, gain):
    """Rate [bit/s] of ``condition`` at power gain(s) |h|^2."""
    return shannon_rate_bps(condition.bandwidth_hz, condition.mean_snr_linear(), gain)


def sample_uplink_rates(condition: ChannelCondition, n: int, rng) -> np.ndarray:
    """n block-fading uplink rates [bit/s], one draw per round (WISV) or token (CU-HLM).

    Equals ``uplink_rate_bps(condition, sample_power_gains(condition, n, rng))`` with the same
    draws, so a caller that also needs the gains (for CSI features) can make the two calls.
    """
    return np.asarray(uplink_rate_bps(condition, sample_power_gains(condition, n, rng)))


def achievable_mean_rate(condition: ChannelCondition) -> float:
    """Rate at the average SNR, W log2(1 + rho) [bit/s] (|h|^2 = 1); a CSI feature."""
    return uplink_rate_bps(condition, 1.0)


def ergodic_rate_bps(condition: ChannelCondition) -> float:
    """E[R] = W E[log2(1 + rho |h|^2)] [bit/s] over the fading distribution.

    AWGN: the rate at rho. Rayleigh and Rician: numerical integration against the density of
    |h|^2, f(x) = (K+1) exp(-K - (K+1) x) I0(2 sqrt(K (K+1) x)) (K = 0 for Rayleigh, whose
    closed form is W log2(e) e^(1/rho) E1(1/rho)). Always <= ``achievable_mean_rate`` (Jensen).
    """
    rho = condition.mean_snr_linear()
    if condition.fading == "awgn":
        return achievable_mean_rate(condition)
    k = condition.k_factor if condition.fading == "rician" else 0.0
    # Imported here: scipy takes a good part of a second to import, and the evaluation jobs
    # that import this module seldom integrate.
    from scipy import integrate, special

    def integrand(x: float) -> float:
        arg = 2.0 * math.sqrt(k * (k + 1.0) * x)
        # i0e(z) = I0(z) e^-z keeps the Bessel term finite for large K x.
        density = (k + 1.0) * math.exp(-k - (k + 1.0) * x + arg) * special.i0e(arg)
        return math.log2(1.0 + rho * x) * density

    value, _ = integrate.quad(integrand, 0.0, np.inf, limit=200)
    return condition.bandwidth_hz * value


def csi_features(condition: ChannelCondition, gain) -> dict[str, Any]:
    """Channel-state features of one block (or of an array of blocks) for a learned head.

    Keys: ``snr_db_mean`` [dB], ``snr_db_instantaneous`` rho |h|^2 [dB], ``gain_db`` |h|^2 [dB]
    (both floored at ``SNR_FLOOR_DB``), ``spectral_efficiency`` log2(1 + rho |h|^2)
    [bit/s/Hz], ``rate_mbps`` instantaneous rate [Mbit/s], ``mean_rate_mbps`` rate at the
    average SNR [Mbit/s], ``rtt_ms`` [ms], ``per`` the packet error rate at the
    instantaneous SNR (``packet_error_rate``). Values are floats for a scalar gain, arrays
    otherwise; normalising them is the head's job.
    """
    g = np.asarray(gain, dtype=float)
    if np.any(~(g >= 0)):
        raise ChannelError("gain must be >= 0 (linear |h|^2)")
    rho = condition.mean_snr_linear()
    floor = db_to_linear(SNR_FLOOR_DB)
    inst_db = 10.0 * np.log10(np.maximum(rho * g, floor))
    gain_db = 10.0 * np.log10(np.maximum(g, floor))
    efficiency = np.log2(1.0 + rho * g)

    def out(a):
        a = np.asarray(a, dtype=float)
        return float(a) if a.ndim == 0 else a

    return {
        "snr_db_mean": condition.mean_snr_db(),
        "snr_db_instantaneous": out(inst_db),
        "gain_db": out(gain_db),
        "spectral_efficiency": out(efficiency),
        "rate_mbps": out(condition.bandwidth_hz * efficiency / 1e6),
        "mean_rate_mbps": achievable_mean_rate(condition) / 1e6,
        "rtt_ms": condition.rtt_s * 1e3,
        "per": out(packet_error_rate(rho * g, condition.per_a, condition.per_g)),
    }


def block_packet_error_rate(condition: ChannelCondition, gain):
    """PER of blocks with power gain(s) |h|^2 under ``condition`` (``arq.packet_error_rate``
    at rho |h|^2)."""
    return packet_error_rate(
        condition.mean_snr_linear() * np.asarray(gain, dtype=float),
        condition.per_a,
        condition.per_g,
    )


def expected_rate_given_gain(condition: ChannelCondition, gain, lag: int = 1):
    """E[R_{n+lag} | |h_n|^2 = gain] [bit/s]: the ergodic rate of a block ``lag`` blocks after
    one whose power gain is known, under the Gauss-Markov block fading of ``condition``.

    With c = ``condition.correlation``, s_{n+lag} = c^lag s_n + sqrt(1 - c^(2 lag)) w, w ~
    CN(0, 1), so given |h_n|^2 = g (Rayleigh, h = s) the gain |h_{n+lag}|^2 is Rician with a
    fixed component of power c^(2 lag) g and a scattered one of power 1 - c^(2 lag): mean
    Omega = c^(2 lag) g + 1 - c^(2 lag), K-factor K = c^(2 lag) g / (1 - c^(2 lag)). The rate
    W E[log2(1 + rho |h|^2)] is integrated against that density (``ergodic_rate_bps``'s
    integral); c = 0 gives the unconditional ergodic rate, and the result rises with the
    known gain. Units: ``gain`` |h_n|^2 (linear, E|h|^2 = 1), W [Hz], rho the average SNR
    (linear), result [bit/s]; scalar in, float out; array in, array out.

    This is the rate a repair round should be priced at given the CSI a decision sees: not the
    current block's rate (the repair happens in a later block), and not bits * E[1/R], which is
    infinite under Rayleigh fading. AWGN: the rate at rho. Rician fading is refused: its
    scattered component, which the correlation acts on, is not determined by |h_n|^2 alone.
    """
    if isinstance(lag, bool) or int(lag) != lag or lag < 1:
        raise ChannelError(f"lag must be an integer >= 1 block, got {lag!r}")
    g = np.asarray(gain, dtype=float)
    if np.any(~(g >= 0)) or np.any(~np.isfinite(g)):
        raise ChannelError("gain must be finite and >= 0 (linear |h|^2)")
    if condition.fading == "awgn":
        out = np.full(g.shape, achievable_mean_rate(condition))
        return float(out) if out.ndim == 0 else out
    if condition.fading != "rayleigh":
        raise ChannelError(
            f"channel condition {condition.name!r}: the rate given |h|^2 is defined for Rayleigh "
            f"(or AWGN) fading, not {condition.fading!r}"
        )
    rho = condition.mean_snr_linear()
    memory = condition.correlation ** (2 * int(lag))
    if memory == 0.0:
        out = np.full(g.shape, ergodic_rate_bps(condition))
        return float(out) if out.ndim == 0 else out
    scattered = 1.0 - memory
    from scipy import integrate, special  # see ergodic_rate_bps

    def one(g0: float) -> float:
        los = memory * g0
        omega = los + scattered
        k = los / scattered

        def integrand(x: float) -> float:
            arg = 2.0 * math.sqrt(k * (k + 1.0) * x / omega)
            density = (k + 1.0) / omega * math.exp(-k - (k + 1.0) * x / omega + arg)
            return math.log2(1.0 + rho * x) * density * special.i0e(arg)

        # The density peaks near the fixed component's power: split the integral there.
        value = sum(
            integrate.quad(integrand, lo, hi, limit=200)[0]
            for lo, hi in ((0.0, omega), (omega, 4.0 * omega + 10.0), (4.0 * omega + 10.0, np.inf))
        )
        return condition.bandwidth_hz * value

    out = np.vectorize(one, otypes=[float])(g)
    return float(out) if out.ndim == 0 else out
