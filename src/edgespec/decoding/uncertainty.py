"""Device-side uncertainty by temperature perturbation (U-HLM, methods §3.2).

From the draft logits z of one forward pass, draw M tokens d_m ~ softmax(z / theta_m) with
theta_m ~ U(0, theta_max], and score u = (1/M) sum_m 1{d_m != d}. The M samples reuse the
logits, so the cost is M normalisations over the vocabulary, not M forward passes. Only
whether d_m equals d matters, so each draw is taken as that event, a Bernoulli of
softmax(z / theta_m)_d: the same law of u as drawing the tokens, without a cumulative sum
over the vocabulary per sample.
"""

from __future__ import annotations

import torch

MIN_TEMPERATURE = 1e-6
"""theta is drawn from (0, theta_max]; clamping avoids dividing by an exact zero draw."""

NEGLIGIBLE_LOGIT_GAP = 60.0
"""Tokens whose logit lies more than theta_max * 60 below the row's maximum have probability
below e^-60 (about 1e-26) at every theta <= theta_max; over any real vocabulary their total
mass is far below float32 resolution, so normalising over the remaining candidates is exact
to the precision of a full-vocabulary sum, and cheaper when few remain."""


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
    top = logits.max(-1, keepdim=True).values
    gap = top - logits  # >= 0
    negligible = gap > NEGLIGIBLE_LOGIT_GAP * theta_max
    num_candidates = int((~negligible).sum(-1).max())
    if num_candidates <= vocab // 4:  # a partial sort pays for itself
        gap = -(logits.topk(num_candidates, dim=-1).values - top)
    # u only asks whether each draw d_m equals d: d_m = d with probability
    # p_m = softmax(z / theta_m)_d, so 1{d_m != d} is a Bernoulli(1 - p_m) draw, one uniform
    # each, and no token needs to be drawn. log p_m = -(gap_d / theta_m) - log sum_v
    # exp(-gap_v / theta_m), where the maximum's term is 1 and no term exceeds it, so the sum
    # lies in [1, C] and needs no max-shift. One sample at a time in one [B, C] buffer: a
    # [B, M, C] tensor (about 200 MB at B = 16, M = 20 and |V| = 151,936) is slower to fill.
    terms = torch.empty_like(gap)
    norm = torch.empty((batch, num_samples), dtype=gap.dtype)
    for m in range(num_samples):
        torch.div(gap, thetas[:, m : m + 1], out=terms)
        norm[:, m] = terms.neg_().exp_().sum(-1)
    log_norm = norm.log()
    gap_d = (top.squeeze(-1) - logits.gather(1, draft_tokens.view(-1, 1)).squeeze(-1)).unsqueeze(1)
    log_p_d = -(gap_d / thetas) - log_norm
    draws = torch.rand((batch, num_samples), generator=generator, dtype=torch.float64)
    differs = draws >= log_p_d.to(torch.float64).exp()
    return differs.float().mean(1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats along the last axis."""
    logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return -(probs * logp).sum(-1)
