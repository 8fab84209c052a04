"""Device-side uncertainty by temperature perturbation (U-HLM, methods §3.2).

From the draft logits z of one forward pass, draw M tokens d_m ~ softmax(z / theta_m) with
theta_m ~ U(0, theta_max], and score u = (1/M) sum_m 1{d_m != d}. The M samples reuse the
logits, so the cost is M softmaxes, not M forward passes.
"""

from __future__ import annotations

import torch

MIN_TEMPERATURE = 1e-6
"""theta is drawn from (0, theta_max]; clamping avoids dividing by an exact zero draw."""

NEGLIGIBLE_LOGIT_GAP = 60.0
"""Tokens whose logit lies more than theta_max * 60 below the row's maximum have probability
below e^-60 (about 1e-26) at every theta <= theta_max; over any real vocabulary their total
mass is far below float32 resolution, so sampling among the remaining candidates is exact
to the precision of a full-vocabulary draw and much cheaper."""


def perturbation_uncertainty(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_samples: int,
    theta_max: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """u(t) in {0, 1/M, ..., 1} for each row of ``logits`` [B, V] with draft tokens [B].

    A one-hot (infinitely peaked) distribution whose mode is the draft token gives u = 0.
    Returns float32 [B]; ``num_samples == 0`` returns zeros (uncertainty disabled).
    """
    batch, vocab = logits.shape
    if num_samples == 0:
        return torch.zeros(batch)
    if num_samples < 0 or theta_max <= 0:
        raise ValueError(f"need num_samples >= 0 and theta_max > 0, got {num_samples}, {theta_max}")
    uniform = torch.rand((batch, num_samples), generator=generator, dtype=torch.float64)
    # 1 - U lies in (0, 1], so theta lies in (0, theta_max] as the definition asks.
    thetas = ((1 - uniform) * theta_max).clamp_min(MIN_TEMPERATURE).to(torch.float32)
    logits = logits.to(torch.float32)
    gap = logits.max(-1, keepdim=True).values - logits
    negligible = gap > NEGLIGIBLE_LOGIT_GAP * theta_max
    num_candidates = int((~negligible).sum(-1).max())
    if num_candidates > vocab // 4:  # a partial sort costs more than it saves
        num_candidates = vocab
        top_logits = logits.masked_fill(negligible, float("-inf"))
        top_ids = torch.arange(vocab).expand(batch, vocab)
    else:
        top_logits, top_ids = logits.topk(num_candidates, dim=-1)
        top_logits = torch.where(
            top_logits[:, :1] - top_logits <= NEGLIGIBLE_LOGIT_GAP * theta_max,
            top_logits,
            float("-inf"),
        )
    probs = torch.softmax(top_logits.unsqueeze(1) / thetas.unsqueeze(-1), dim=-1)
    # Inverse-CDF sampling: one uniform per (row, theta) instead of one per vocabulary entry.
    cdf = probs.cumsum(-1)
    draws = torch.rand((batch, num_samples, 1), generator=generator, dtype=torch.float32)
    index = torch.searchsorted(cdf, draws * cdf[..., -1:], right=True).clamp_max(num_candidates - 1)
    perturbed = top_ids.gather(1, index.squeeze(-1))
    return (perturbed != draft_tokens.unsqueeze(1)).float().mean(1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats along the last axis."""
    logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return -(probs * logp).sum(-1)
