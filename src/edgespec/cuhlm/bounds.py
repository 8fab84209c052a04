"""Bounds on CU-HLM's top-k resampling distortion, and the online choice of k (methods §3.4).

The device knows x, its sampled token d, x_d and its uncertainty u. For each k it can compute
N_k = ||x - x_hat_k||_1 (:func:`reconstruction_errors_all_k`, one sort per row). Two bounds on
the resampling distortion TVD(r, r_hat_k) use it:

- the provable bound N_k / (x_d beta_d) (:func:`provable_bound`; needs the target's y, so it is
  for offline evaluation only): (.)^+ is 1-Lipschitz, so the unnormalised residuals differ by at
  most N_k in L1, normalising gives TVD <= N_k / Z, and Z = ||(y - x)^+||_1 >= x_d beta_d;
- the online bound U_TV(t; k) = N_k / [(1 - x_d) softplus(-1) + x_d softplus(-beta_hat)], with
  beta_hat = clip(a u + b, 0, 1) from the calibration fit. This denominator is the CU-HLM
  paper's eq. (26) as reconstructed from a public replication (docs/methods.md §3.4); it is a
  device-side surrogate for Z, not a proven lower bound, and the evaluation reports how often
  it holds.

CU-HLM online picks k(t) per token with the online bound (:func:`online_k`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from edgespec.cuhlm.calibration import LinearFit


def softplus(z, eta: float = 1.0):
    """l_eta(z) = (1 / eta) log(1 + exp(eta z)), elementwise, stable for large |z|.

    Accepts floats, numpy arrays and torch tensors (a tensor in gives a tensor out).
    """
    if eta <= 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if isinstance(z, torch.Tensor):
        return torch.logaddexp(torch.zeros_like(z), eta * z) / eta
    out = np.logaddexp(0.0, eta * np.asarray(z, dtype=np.float64)) / eta
    return float(out) if np.ndim(out) == 0 else out


def beta_hat(u, fit: LinearFit):
    """Device-side estimate of the rejection probability, clip(a u + b, 0, 1)."""
    if isinstance(u, torch.Tensor):
        return (fit.a * u.to(torch.float64) + fit.b).clamp(0.0, 1.0)
    out = np.clip(fit.a * np.asarray(u, dtype=np.float64) + fit.b, 0.0, 1.0)
    return float(out) if np.ndim(out) == 0 else out


def online_bound_denominator(x_d, beta_hat_d, eta: float = 1.0):
    """(1 - x_d) softplus(-1) + x_d softplus(-beta_hat): the online bound's denominator.

    Reconstructed form of CU-HLM eq. (26) (from a public replication, not the paper's text);
    it lies in [softplus(-1), softplus(0)] = [0.313, 0.693] for eta = 1.
    """
    return (1 - x_d) * softplus(-1.0, eta) + x_d * softplus(-beta_hat_d, eta)


def reconstruction_errors_all_k(probs: torch.Tensor) -> torch.Tensor:
    """N_k = ||x - x_hat_k||_1 for every k = 1..V: a [B, V] float64 tensor, column k-1 is N_k.

    One descending sort and one prefix sum per row, then one batched ``searchsorted``: with
    S_k the top-k mass, the tail level l_k = (1 - S_k)^+ / (V - k) (the edge's reconstruction,
    as in :func:`edgespec.decoding.compression.reconstruct_topk`) and T_k the tail mass, the
    tail entries >= l_k form a prefix of the sorted tail, of length m_k and sum H_k, and
    N_k = 2 (H_k - m_k l_k) + (V - k) l_k - T_k. N_V = 0.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be [B, V], got shape {tuple(probs.shape)}")
    batch, vocab = probs.shape
    x = probs.to(torch.float64)
    desc = x.sort(dim=-1, descending=True).values
    prefix = torch.cumsum(desc, dim=-1)  # prefix[:, k-1] = S_k
    padded = torch.cat([x.new_zeros(batch, 1), prefix], dim=1)  # padded[:, k] = S_k
    k = torch.arange(1, vocab + 1, device=probs.device)
    tail_size = (vocab - k).to(torch.float64)
    tail_mass = prefix[:, -1:] - prefix
    level = (1 - prefix).clamp_min(0) / tail_size.clamp_min(1)
    ascending = desc.flip(-1).contiguous()
    # Entries >= level form a prefix of the descending row; the first k of them are kept.
    count_ge = vocab - torch.searchsorted(ascending, level.contiguous(), right=False)
    above = torch.minimum((count_ge - k).clamp_min(0), vocab - k)
    above_sum = padded.gather(1, k.expand(batch, vocab) + above) - prefix
    errors = 2 * (above_sum - above * level) + tail_size * level - tail_mass
    return torch.where(tail_size > 0, errors.clamp_min(0), torch.zeros_like(errors))


def online_k(
    probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    u,
    fit: LinearFit,
    theta_tv: float,
    k_max: int | None = None,
    eta: float = 1.0,
) -> torch.Tensor:
    """CU-HLM online: per row, the smallest k with U_TV(t; k) <= theta_tv (methods §3.4).

    Device information only: ``probs`` [B, V] (x), ``draft_tokens`` [B] (d), ``u`` [B] (or a
    scalar) and the calibration ``fit``. k is searched in 1..k_max (default V); a row with no
    such k gets k_max (with the default, k = V always qualifies since N_V = 0). DuoDecoding's
    fallback min(300, V/100) is the caller's choice of ``k_max``. Returns a long tensor [B].
    """
    batch, vocab = probs.shape
    cap = vocab if k_max is None else int(k_max)
    if not 1 <= cap <= vocab:
        raise ValueError(f"k_max must lie in [1, {vocab}], got {k_max}")
    errors = reconstruction_errors_all_k(probs)[:, :cap]
    x_d = probs.to(torch.float64).gather(1, draft_tokens.view(batch, 1).long()).squeeze(1)
    u_t = torch.as_tensor(u, dtype=torch.float64, device=probs.device).expand(batch)
    denominator = online_bound_denominator(x_d, beta_hat(u_t, fit), eta)
    meets = errors / denominator.unsqueeze(1) <= theta_tv
    first = meets.to(torch.int8).argmax(dim=1) + 1
    return torch.where(meets.any(dim=1), first, torch.full_like(first, cap)).long()


def provable_bound(nk, x_d, beta):
    """N_k / (x_d beta_d), broadcasting; inf where x_d beta_d == 0 < N_k, 0 where N_k == 0.

    A rigorous bound on TVD(r, r_hat_k) (module docstring); needs beta_d, i.e. the target.
    """
    if isinstance(nk, torch.Tensor):
        nk = nk.to(torch.float64)
        den = torch.as_tensor(x_d, dtype=torch.float64) * torch.as_tensor(beta, dtype=torch.float64)
        ratio = nk / torch.where(den > 0, den, torch.ones_like(den))
        return torch.where(nk == 0, 0.0, torch.where(den > 0, ratio, math.inf))
    nk = np.asarray(nk, dtype=np.float64)
    den = np.asarray(x_d, dtype=np.float64) * np.asarray(beta, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = nk / np.where(den > 0, den, 1.0)
    out = np.where(nk == 0, 0.0, np.where(den > 0, ratio, np.inf))
    return float(out) if out.ndim == 0 else out
