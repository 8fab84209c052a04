"""Shared limits for the tests that compare sampled tokens with an exact law."""

from __future__ import annotations

import torch


def tv_noise_floor(law: torch.Tensor, n: int) -> float:
    """E[TV(empirical, law)] for n draws, to first order:
    1/2 sum_i sqrt(2 p_i (1 - p_i) / (pi n)). A limit written as a multiple of it holds a
    correct sampler to the same standard at every sample count."""
    return 0.5 * float(torch.sqrt(2 * law * (1 - law) / (torch.pi * n)).sum())
