"""The law of the committed token after a compressed upload, and its distance from y
(methods §3.4, "output distortion").

One speculative step of the CU-HLM family: the device draws d from a law q (its full
distribution x, or for ``cuhlm_exact`` the reconstruction x_hat it uploads); the edge accepts d
with probability min(1, y_d / p_d), where p is the distribution it received (x_hat from a top-k
upload), and otherwise draws from the residual r_p = (y - p)^+ / ||(y - p)^+||_1. Summing the
accept and resample paths, the committed token has the law

    y_hat = q * min(1, y / p) + rho * r_p,    rho = sum_i q_i * max(0, 1 - y_i / p_i)

(elementwise; an entry with p_i = 0 is always accepted, as in
:func:`edgespec.decoding.sampling.verify_single_token`). With q = p it is y exactly (the
standard speculative-sampling argument), so ``cuhlm_exact`` is lossless; with q = x and
p = x_hat (the papers' CU-HLM) it is not, and TVD(y_hat, y) is the distortion of the output,
a different number from the residual distortion TVD(r, r_hat) that the bounds control.

All computations run in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgespec.decoding.compression import (
    SortedByDraft,
    reconstruct_topk,
    sort_by_draft,
    total_variation,
)
from edgespec.decoding.sampling import residual_distribution


def committed_law(
    sample_probs: torch.Tensor, verify_probs: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """y_hat [..., V]: the law of the token one step commits when d ~ ``sample_probs`` (q) is
    verified against ``verify_probs`` (p) for the target ``target_probs`` (y) (module
    docstring)."""
    if not sample_probs.shape == verify_probs.shape == target_probs.shape:
        raise ValueError(
            f"shape mismatch: q {tuple(sample_probs.shape)}, p {tuple(verify_probs.shape)}, "
            f"y {tuple(target_probs.shape)}"
        )
    q = sample_probs.to(torch.float64)
    p = verify_probs.to(torch.float64)
    y = target_probs.to(torch.float64)
    accept = torch.where(p > 0, (y / p.clamp_min(torch.finfo(p.dtype).tiny)).clamp(max=1.0), 1.0)
    kept = q * accept
    rho = (q - kept).sum(-1, keepdim=True)
    return kept + rho * residual_distribution(y, p)


def output_distortion(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    k: int | torch.Tensor,
    ranks: torch.Tensor | None = None,
    *,
    sample_from_reconstruction: bool = False,
) -> torch.Tensor:
    """TVD(y_hat, y) [...] of one step with a top-k upload of x (``draft_probs``), one k per row.

    The device draws d from x (the papers' CU-HLM) or, with ``sample_from_reconstruction``,
    from the x_hat it uploads (``cuhlm_exact``, distortion 0 up to rounding); the edge verifies
    against x_hat = ``reconstruct_topk(x, k)``. ``ranks`` (``vocabulary_ranks(x)``) saves the
    sort when several k are tried.
    """
    x = draft_probs.to(torch.float64)
    y = target_probs.to(torch.float64)
    x_hat = reconstruct_topk(x, k, ranks)
    q = x_hat if sample_from_reconstruction else x
    return total_variation(committed_law(q, x_hat, y), y)


def output_distortion_grid(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    k_values: Sequence[int],
    sorted_pair: SortedByDraft | None = None,
) -> torch.Tensor:
    """TVD(y_hat_k, y) for each k of a grid (d ~ x): [N, len(k_values)], one sort per row.

    In the draft's order the top-k entries are verified against x itself: there y_hat - y =
    -(y - x)^+ (1 - rho / Z), so the head contributes |1 - rho / Z| times a prefix sum, and
    only the tail, verified against the constant x_hat level t, is summed per k (rho, the
    rejection mass, and Z, the residual's, each add a head prefix sum to a tail sum). A row
    whose residual is empty (Z = 0) is computed by :func:`output_distortion`. ``sorted_pair``
    (``sort_by_draft(draft_probs, target_probs)``) saves the sort.
    """
    pair = sorted_pair if sorted_pair is not None else sort_by_draft(draft_probs, target_probs)
    vocab = pair.vocab
    tiny = torch.finfo(torch.float64).tiny
    out = []
    for k in k_values:
        k = int(k)
        if not 1 <= k <= vocab:
            raise ValueError(f"k={k} outside [1, {vocab}]")
        head_excess = pair.excess_prefix[:, k - 1]
        rejected = pair.deficit_prefix[:, k - 1]
        mass = head_excess
        if k < vocab:
            level = pair.tail_level(k).unsqueeze(1)
            x_tail, y_tail = pair.x[:, k:], pair.y[:, k:]
            accept = torch.where(level > 0, (y_tail / level.clamp_min(tiny)).clamp_(max=1.0), 1.0)
            kept = accept.mul_(x_tail)
            rejected = rejected + (x_tail - kept).sum(-1)
            tail_excess = (y_tail - level).clamp_min_(0)
            mass = mass + tail_excess.sum(-1)
        ratio = rejected / mass.clamp_min(tiny)
        tvd = head_excess * (1 - ratio).abs()
        if k < vocab:
            tvd = tvd + kept.add_(tail_excess.mul_(ratio.unsqueeze(1))).sub_(y_tail).abs_().sum(-1)
        tvd = 0.5 * tvd
        empty = mass <= 0
        if bool(empty.any()):
            tvd[empty] = output_distortion(draft_probs[empty], target_probs[empty], k)
        out.append(tvd)
    return torch.stack(out, dim=1)
