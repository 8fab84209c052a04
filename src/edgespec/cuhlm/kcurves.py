"""The mean online bound of every upload size k, per skip threshold (methods §3.4, offline k*).

The offline programme needs, for a skip threshold u_th and an upload size k, the mean of the
online bound U_TV(t; k) = N_k(t) / den(t) over the calibration tokens that u_th transmits
(u(t) > u_th), the share of tokens transmitted, and the risk among the skipped ones. All three
depend on u_th only through which distinct u values (u lives on the 1/M lattice) lie above it,
so :class:`BoundCurves` keeps, per distinct u value g: its token count, its sum of beta and,
for every k on its k axis, the sum of U_TV(t; k) over its tokens. Every threshold is then a
sum over groups.

Two k axes:

- :meth:`BoundCurves.from_trace`: the trace's k grid (its ``nk_{k}`` columns);
- :func:`dense_bound_curves`: every integer k in [1, |V|], from the draft distributions
  themselves (:func:`edgespec.cuhlm.bounds.reconstruction_errors_all_k`, one sort per token),
  which the trace does not store (|V| floats per token); the workflow recomputes them with
  :func:`edgespec.cuhlm.traces.replay_draft_probs`.

N_k(t) never increases with k (keeping one more entry exact and re-spreading the tail cannot
increase the L1 error), so neither does any mean bound curve.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from edgespec.artifacts import write_npz
from edgespec.cuhlm.bounds import beta_hat, online_bound_denominator, reconstruction_errors_all_k
from edgespec.cuhlm.calibration import LinearFit


def _denominator(x_d: np.ndarray, u: np.ndarray, fit: LinearFit, eta: float) -> np.ndarray:
    return np.asarray(online_bound_denominator(x_d, beta_hat(u, fit), eta), dtype=np.float64)


@dataclass
class BoundCurves:
    """Per distinct u value g (``u_values`` increasing): ``counts[g]`` tokens, ``beta_sums[g]``
    their summed beta, and ``bound_sums[g, i]`` their summed online bound at ``k_values[i]``
    (increasing, within [1, |V| = ``vocab_size``]; a trace grid and the dense axis end at |V|,
    where the bound is 0, so some k always meets any budget)."""

    k_values: np.ndarray
    u_values: np.ndarray
    counts: np.ndarray
    beta_sums: np.ndarray
    bound_sums: np.ndarray
    vocab_size: int

    def __post_init__(self) -> None:
        self.k_values = np.asarray(self.k_values, dtype=np.int64)
        self.u_values = np.asarray(self.u_values, dtype=np.float64)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        self.beta_sums = np.asarray(self.beta_sums, dtype=np.float64)
        self.bound_sums = np.asarray(self.bound_sums, dtype=np.float64)
        groups, ks = len(self.u_values), len(self.k_values)
        if self.bound_sums.shape != (groups, ks):
            raise ValueError(f"bound_sums must be [{groups}, {ks}], got {self.bound_sums.shape}")
        if self.counts.shape != (groups,) or self.beta_sums.shape != (groups,):
            raise ValueError("counts and beta_sums need one entry per u value")
        if ks == 0 or np.any(np.diff(self.k_values) <= 0) or self.k_values[0] < 1:
            raise ValueError("k_values must be increasing integers >= 1")
        if self.k_values[-1] > self.vocab_size:
            raise ValueError(f"k_values must lie in [1, |V| = {self.vocab_size}]")
        if groups == 0 or self.counts.sum() == 0:
            raise ValueError("no calibration tokens")

    @property
    def num_tokens(self) -> int:
        return int(self.counts.sum())

    def transmitted(self, u_th: float | None) -> np.ndarray:
        """Groups whose tokens u_th transmits (u > u_th; every group for None)."""
        if u_th is None:
            return np.ones(len(self.u_values), dtype=bool)
        return self.u_values > float(u_th)

    def p_tx(self, u_th: float | None) -> float:
        """P(u > u_th) over the calibration tokens."""
        return float(self.counts[self.transmitted(u_th)].sum()) / self.num_tokens

    def risk(self, u_th: float | None) -> float:
        """Mean beta over the skipped tokens (0 when none is skipped)."""
        skipped = ~self.transmitted(u_th)
        n = int(self.counts[skipped].sum())
        return float(self.beta_sums[skipped].sum()) / n if n else 0.0

    def mean_bound(self, u_th: float | None) -> np.ndarray:
        """Mean U_TV(t; k) over transmitted tokens at every k (zeros when none is sent)."""
        sent = self.transmitted(u_th)
        n = int(self.counts[sent].sum())
        if n == 0:
            return np.zeros(len(self.k_values))
        return self.bound_sums[sent].sum(axis=0) / n

    @classmethod
    def from_trace(
        cls,
        trace: pd.DataFrame,
        k_grid,
        fit: LinearFit,
        eta: float = 1.0,
        vocab_size: int | None = None,
    ) -> BoundCurves:
        """Curves on a k grid from a trace's ``nk_{k}`` columns; |V| is the grid's largest k
        (a trace grid ends at |V|) unless ``vocab_size`` is given."""
        grid = sorted(int(k) for k in k_grid)
        missing = [c for c in ["u", "beta", "x_d"] + [f"nk_{k}" for k in grid] if c not in trace]
        if missing:
            raise KeyError(f"trace is missing columns {missing}")
        u = trace["u"].to_numpy(np.float64)
        den = _denominator(trace["x_d"].to_numpy(np.float64), u, fit, eta)
        bounds = trace[[f"nk_{k}" for k in grid]].to_numpy(np.float64) / den[:, None]
        values, group = np.unique(u, return_inverse=True)
        sums = np.zeros((len(values), len(grid)))
        np.add.at(sums, group, bounds)
        return cls(
            k_values=np.asarray(grid),
            u_values=values,
            counts=np.bincount(group, minlength=len(values)),
            beta_sums=np.bincount(
                group, weights=trace["beta"].to_numpy(np.float64), minlength=len(values)
            ),
            bound_sums=sums,
            vocab_size=grid[-1] if vocab_size is None else int(vocab_size),
        )


def dense_bound_curves(
    draft_prob_chunks: Iterable[torch.Tensor],
    u,
    x_d,
    beta,
    fit: LinearFit,
    eta: float = 1.0,
) -> BoundCurves:
    """Curves over every k in [1, |V|] from the draft distributions of the calibration tokens.

    ``draft_prob_chunks`` yields [n_i, V] tensors whose rows, concatenated, are the tokens of
    ``u``, ``x_d`` and ``beta`` in order (e.g. one chunk per prompt from
    :func:`edgespec.cuhlm.traces.replay_draft_probs`); N_k(t) for all k comes from one sort
    per row (:func:`edgespec.cuhlm.bounds.reconstruction_errors_all_k`). The denominator of
    U_TV uses the trace's x_d and u.
    """
    u = np.asarray(u, dtype=np.float64)
    x_d = np.asarray(x_d, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    if not u.shape == x_d.shape == beta.shape:
        raise ValueError("u, x_d and beta must have one entry per token")
    den = _denominator(x_d, u, fit, eta)
    values, group = np.unique(u, return_inverse=True)
    sums: torch.Tensor | None = None
    start = 0
    for chunk in draft_prob_chunks:
        if chunk.shape[0] == 0:
            continue
        stop = start + chunk.shape[0]
        if stop > len(u):
            raise ValueError(f"the draft distributions hold more rows than the {len(u)} tokens")
        errors = reconstruction_errors_all_k(chunk)  # [n, V] float64
        if sums is None:
            sums = torch.zeros(len(values), errors.shape[1], dtype=torch.float64)
        elif errors.shape[1] != sums.shape[1]:
            raise ValueError("every chunk must have the same vocabulary size")
        weights = torch.as_tensor(1.0 / den[start:stop], dtype=torch.float64)
        sums.index_add_(0, torch.as_tensor(group[start:stop]), errors * weights[:, None])
        start = stop
    if start != len(u):
        raise ValueError(f"the draft distributions hold {start} rows for {len(u)} tokens")
    vocab = sums.shape[1]
    return BoundCurves(
        k_values=np.arange(1, vocab + 1),
        u_values=values,
        counts=np.bincount(group, minlength=len(values)),
        beta_sums=np.bincount(group, weights=beta, minlength=len(values)),
        bound_sums=sums.numpy(),
        vocab_size=vocab,
    )


CURVE_ARRAYS = ("k_values", "u_values", "counts", "beta_sums", "bound_sums")


def save_curves(curves: BoundCurves, path) -> None:
    """Write ``curves`` to an ``.npz`` file (float64, exact), so that later stages (the joint
    programme per channel) reuse them without replaying the draft."""
    write_npz(
        path,
        **{name: getattr(curves, name) for name in CURVE_ARRAYS},
        vocab_size=np.asarray(curves.vocab_size, dtype=np.int64),
    )


def load_curves(path) -> BoundCurves:
    """The curves :func:`save_curves` wrote, exactly."""
    with np.load(path) as data:
        missing = [n for n in (*CURVE_ARRAYS, "vocab_size") if n not in data.files]
        if missing:
            raise ValueError(f"{path}: not a bound-curves file (arrays {missing} missing)")
        return BoundCurves(
            **{name: data[name] for name in CURVE_ARRAYS}, vocab_size=int(data["vocab_size"])
        )
