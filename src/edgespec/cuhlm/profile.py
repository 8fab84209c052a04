"""The device's CU-HLM vocabulary work, timed on the draft's real distribution (methods §5).

Per uploaded token the CU-HLM device sorts x and searches every k for the online k(t)
selection (:func:`edgespec.cuhlm.bounds.online_k`) and extracts the top-k of x. Both are
timed here, batch 1, one warm-up and the median of ``repeats`` timings
(:func:`edgespec.profiling.median_time`); rule ``profile_latency`` adds them to the measured
latency profile as ``online_k_s`` and ``topk_s`` [s].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgespec.cuhlm.bounds import online_k
from edgespec.cuhlm.calibration import LinearFit
from edgespec.profiling import median_time, next_token_logits

NOMINAL_FIT = LinearFit(a=0.8, b=-0.06, r2=float("nan"), pearson_r=float("nan"), n=0)
"""The calibration fit the online k(t) selection is timed with: its work (one sort of x, a
prefix sum and one batched search over every k) does not depend on the fit's values."""


def topk_ladder(vocab_size: int) -> list[int]:
    """Upload sizes the top-k extraction is timed at: 1, powers of 4 below |V|, and |V| - 1."""
    sizes = {1, vocab_size - 1}
    k = 4
    while k < vocab_size:
        sizes.add(k)
        k *= 4
    return sorted(s for s in sizes if 1 <= s < vocab_size)


def measure_vocabulary_operations(
    probs: torch.Tensor, token: torch.Tensor, repeats: int, theta_tv: float = 0.1
) -> dict:
    """Median times [s] of the device's per-token CU-HLM work on one real distribution x
    (``probs`` [1, V], batch 1): ``online_k_s``, one online k(t) selection
    (:func:`edgespec.cuhlm.bounds.online_k` over every k, timed with :data:`NOMINAL_FIT`), and
    ``topk_s``, k -> one ``torch.topk`` extraction of k values and indices, at the sizes of
    :func:`topk_ladder`."""
    if probs.dim() != 2 or probs.shape[0] != 1:
        raise ValueError(f"probs must be one distribution [1, V], got {tuple(probs.shape)}")
    vocab = probs.shape[-1]
    u = torch.full((1,), 0.5)
    online_k_s = median_time(
        lambda: online_k(probs, token.view(1), u, NOMINAL_FIT, theta_tv), repeats
    )
    topk_s = {
        str(k): median_time(lambda k=k: torch.topk(probs, k, dim=-1), repeats)
        for k in topk_ladder(vocab)
    }
    return {"online_k_s": online_k_s, "topk_s": topk_s}


def measure_draft_vocabulary_operations(
    draft: torch.nn.Module, prompt: Sequence[int], repeats: int
) -> dict:
    """:func:`measure_vocabulary_operations` on the draft's distribution after ``prompt`` and
    its most likely token (the distribution the latency profile's uncertainty is timed on)."""
    logits = next_token_logits(draft, prompt)
    return measure_vocabulary_operations(torch.softmax(logits, -1), logits.argmax(-1), repeats)
