"""Top-k compressed upload of the draft distribution (CU-HLM, methods §3.1 and 3.4).

The device sends the k largest entries of x (values and indices). The edge rebuilds
x_hat_i = x_i on the top-k set and spreads the remaining mass uniformly,
x_hat_i = (1 - S_k) / (|V| - k), elsewhere, so x_hat sums to one without renormalisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgespec.decoding.sampling import residual_distribution


def vocabulary_ranks(probs: torch.Tensor) -> torch.Tensor:
    """Rank of every entry in its row, 0 = largest (``torch.sort`` order breaks ties)."""
    order = probs.sort(dim=-1, descending=True).indices
    vocab = probs.shape[-1]
    return torch.empty_like(order).scatter_(
        -1, order, torch.arange(vocab, device=probs.device).expand_as(order)
    )


def reconstruct_topk(
    probs: torch.Tensor, k: int | torch.Tensor, ranks: torch.Tensor | None = None
) -> torch.Tensor:
    """The edge's reconstruction x_hat from the top-k of ``probs`` [..., V].

    ``k`` is an int or a long tensor of shape ``probs.shape[:-1]`` (one k per row, 1 <= k <= V).
    Ties at the k-th value are broken by ``torch.topk``'s order (``torch.sort``'s when
    ``ranks`` from :func:`vocabulary_ranks` are given, which saves the work when several k are
    tried on one distribution). Rows with k = V are returned as they are, and when every row
    has k = V, ``probs`` itself is returned: a full upload needs no sort of the vocabulary.
    """
    vocab = probs.shape[-1]
    k_tensor = torch.as_tensor(k, device=probs.device).expand(probs.shape[:-1])
    if (k_tensor < 1).any() or (k_tensor > vocab).any():
        raise ValueError(f"k must lie in [1, {vocab}]")
    full = k_tensor >= vocab
    if bool(full.all()):
        return probs
    if ranks is not None:
        kept = ranks < k_tensor.unsqueeze(-1)
    else:
        k_max = int(k_tensor[~full].max())
        top = probs.topk(k_max, dim=-1, sorted=True).indices
        take = torch.arange(k_max, device=probs.device) < k_tensor.unsqueeze(-1)
        kept = torch.zeros(probs.shape, dtype=torch.bool, device=probs.device)
        kept.scatter_(-1, top, take)
        kept |= full.unsqueeze(-1)
    kept_mass = (probs * kept).sum(-1, keepdim=True)
    tail_size = (vocab - k_tensor).unsqueeze(-1).to(probs.dtype)
    tail_value = torch.where(
        tail_size > 0, (1 - kept_mass).clamp_min(0) / tail_size.clamp_min(1), 0
    )
    return torch.where(kept, probs, tail_value)


@dataclass(frozen=True)
class SortedByDraft:
    """A draft and a target distribution [N, V] in float64, both ordered by the draft's
    probabilities, largest first (``torch.sort``'s order, the one :func:`vocabulary_ranks`
    breaks ties by), with the prefix sums that give every top-k quantity of the head at once:
    ``x_prefix`` (S_k), ``excess_prefix`` (sum of (y - x)^+) and ``deficit_prefix`` (sum of
    (x - y)^+) over the first k entries.

    One sort serves a whole k grid: the top-k set is the first k entries, so the head's terms
    come from the prefix sums and only the tail, where x_hat is a constant, is summed per k.
    """

    x: torch.Tensor
    y: torch.Tensor
    x_prefix: torch.Tensor
    excess_prefix: torch.Tensor
    deficit_prefix: torch.Tensor

    @property
    def vocab(self) -> int:
        return int(self.x.shape[-1])

    def tail_level(self, k: int) -> torch.Tensor:
        """x_hat's constant value outside the top k, (1 - S_k)^+ / (V - k) [N] (k < V)."""
        return (1 - self.x_prefix[:, k - 1]).clamp_min(0) / (self.vocab - k)


def sort_by_draft(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> SortedByDraft:
    """:class:`SortedByDraft` of x = ``draft_probs`` and y = ``target_probs`` [N, V]."""
    if draft_probs.shape != target_probs.shape or draft_probs.dim() != 2:
        raise ValueError(
            f"need two [N, V] distributions of one shape, got {tuple(draft_probs.shape)} "
            f"and {tuple(target_probs.shape)}"
        )
    order = draft_probs.sort(dim=-1, descending=True).indices
    x = draft_probs.to(torch.float64).gather(-1, order)
    y = target_probs.to(torch.float64).gather(-1, order)
    diff = y - x
    return SortedByDraft(
        x,
        y,
        x.cumsum(-1),
        diff.clamp_min(0).cumsum(-1),
        diff.neg_().clamp_min_(0).cumsum(-1),
    )


def topk_mass_and_error(
    probs: torch.Tensor, k_values: list[int], sorted_pair: SortedByDraft | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k mass S_k and reconstruction error N_k = ||x - x_hat_k||_1 for each k of a grid.

    ``probs`` [N, V]; returns two [N, len(k_values)] tensors. One sort serves every k: the
    tail of the sorted distribution above the uniform level u_k = (1 - S_k) / (V - k) is a
    prefix of the tail, so N_k = 2 * (H_k - m_k * u_k) + (V - k) * u_k - T_k, with H_k, m_k the
    sum and length of that prefix and T_k the tail mass (methods §3.4; equals 2(H_k - m_k u_k)
    when x sums to one). ``sorted_pair`` (:func:`sort_by_draft` of ``probs``) saves the sort.
    """
    vocab = probs.shape[-1]
    if sorted_pair is not None:
        sorted_probs, prefix = sorted_pair.x, sorted_pair.x_prefix
    else:
        sorted_probs = probs.sort(dim=-1, descending=True).values.to(torch.float64)
        prefix = torch.cumsum(sorted_probs, dim=-1)
    total = prefix[:, -1:]
    masses, errors = [], []
    ascending = sorted_probs.flip(-1)
    for k in k_values:
        if not 1 <= k <= vocab:
            raise ValueError(f"k={k} outside [1, {vocab}]")
        kept = prefix[:, k - 1 : k]
        tail_mass = total - kept
        if k == vocab:
            masses.append(kept.squeeze(1))
            errors.append(torch.zeros_like(kept.squeeze(1)))
            continue
        level = tail_mass / (vocab - k)
        # Count tail entries >= level: search in the ascending tail, which is the reversed prefix.
        tail_ascending = ascending[:, : vocab - k].contiguous()
        below = torch.searchsorted(tail_ascending, level, right=False)
        above_count = (vocab - k) - below
        above_sum = prefix.gather(1, (k - 1 + above_count).clamp(max=vocab - 1)) - kept
        error = 2 * (above_sum - above_count * level) + (vocab - k) * level - tail_mass
        masses.append(kept.squeeze(1))
        errors.append(error.squeeze(1).clamp_min(0))
    return torch.stack(masses, dim=1), torch.stack(errors, dim=1)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """TVD(p, q) = 1/2 sum_i |p_i - q_i| along the last axis."""
    return 0.5 * (p - q).abs().sum(-1)


def resampling_distortion(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    k_values: list[int],
    sorted_pair: SortedByDraft | None = None,
) -> torch.Tensor:
    """Measured TVD(r, r_hat_k) between the exact residual and the one built from x_hat_k.

    ``draft_probs``, ``target_probs`` [N, V]; returns [N, len(k_values)] in float64 (methods
    §3.4). With r = (y - x)^+ / Z and r_hat = (y - x_hat)^+ / Z_hat, the top-k entries share
    x_hat = x, so the head contributes sum_{i<k} (y_i - x_i)^+ |1/Z - 1/Z_hat| from a prefix
    sum, and only the tail is summed per k. A row whose residual is empty (Z or Z_hat = 0,
    where ``residual_distribution`` falls back to y) is computed directly. ``sorted_pair``
    (:func:`sort_by_draft` of the two) saves the sort.
    """
    pair = sorted_pair if sorted_pair is not None else sort_by_draft(draft_probs, target_probs)
    vocab = pair.vocab
    tiny = torch.finfo(torch.float64).tiny
    exact_mass = pair.excess_prefix[:, -1]
    safe_exact = exact_mass.clamp_min(tiny).unsqueeze(1)
    exact = (pair.y - pair.x).clamp_min_(0).div_(safe_exact)  # r, in the draft's order
    out = []
    for k in k_values:
        if not 1 <= k <= vocab:
            raise ValueError(f"k={k} outside [1, {vocab}]")
        if k == vocab:  # x_hat = x: the same residual
            out.append(torch.zeros_like(exact_mass))
            continue
        head_excess = pair.excess_prefix[:, k - 1]
        approx = (pair.y[:, k:] - pair.tail_level(k).unsqueeze(1)).clamp_min_(0)
        approx_mass = head_excess + approx.sum(-1)
        safe_approx = approx_mass.clamp_min(tiny).unsqueeze(1)
        tail = approx.div_(safe_approx).sub_(exact[:, k:]).abs_().sum(-1)
        head = head_excess * (1 / safe_exact.squeeze(1) - 1 / safe_approx.squeeze(1)).abs()
        tvd = 0.5 * (head + tail)
        empty = (exact_mass <= 0) | (approx_mass <= 0)
        if bool(empty.any()):
            x = draft_probs[empty].to(torch.float64)
            y = target_probs[empty].to(torch.float64)
            tvd[empty] = total_variation(
                residual_distribution(y, x),
                residual_distribution(y, reconstruct_topk(x, k, vocabulary_ranks(x))),
            )
        out.append(tvd)
    return torch.stack(out, dim=1)
