"""Measured compute-time profile of a model pair on the machine running the workflow (methods §5).

One stream (batch 1), as one device would run it: draft time per token, target time per
token, target time for one verification forward over gamma+1 tokens, the time of the
uncertainty estimate and, on the draft's real distribution over the full vocabulary, the
device's CU-HLM vocabulary work (:func:`measure_vocabulary_operations`: the online k(t)
selection and top-k extraction at a ladder of k). Each quantity gets one warm-up and the
median of ``repeats`` timings.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.kselect import online_k
from edgespec.decoding.uncertainty import perturbation_uncertainty

NOMINAL_FIT = LinearFit(a=0.8, b=-0.06, r2=float("nan"), pearson_r=float("nan"), n=0)
"""The calibration fit the online k(t) selection is timed with: its work (one sort of x, a
prefix sum and one batched search over every k) does not depend on the fit's values."""


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # GPU kernels run asynchronously: wait before reading the clock


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up: first calls allocate and pick kernels
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def _forward_time(model, prompt: Sequence[int], new_tokens: int, repeats: int) -> float:
    """Median time of one cached forward over ``new_tokens`` tokens after ``prompt``."""
    cache = DynamicCache()
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], device=device)
    model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    step = torch.tensor(
        [list(prompt[-new_tokens:]) if new_tokens <= len(prompt) else [0] * new_tokens]
    )

    def run():
        model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=new_tokens)
        cache.crop(-new_tokens)  # a negative count removes that many trailing positions

    return _median_time(run, repeats)


def measure_latency_profile(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompt: Sequence[int],
    gammas: Sequence[int],
    repeats: int,
    uncertainty_samples: int,
    theta_max: float,
    seed: int,
) -> dict:
    """A latency profile dict (seconds) in the format of
    :class:`edgespec.wireless.delay.LatencyProfile`."""
    draft_token_s = _forward_time(draft, prompt, 1, repeats)
    target_token_s = _forward_time(target, prompt, 1, repeats)
    verify = {str(g): _forward_time(target, prompt, g + 1, repeats) for g in sorted(set(gammas))}
    with torch.inference_mode():
        ids = torch.tensor([list(prompt)], device=next(draft.parameters()).device)
        logits = draft(input_ids=ids, logits_to_keep=1).logits[:, -1].float().cpu()
    generator = torch.Generator().manual_seed(seed)
    token = logits.argmax(-1)
    uncertainty_s = _median_time(
        lambda: perturbation_uncertainty(logits, token, uncertainty_samples, theta_max, generator),
        repeats,
    )
    vocabulary = measure_vocabulary_operations(
        torch.softmax(logits.to(torch.float32), -1), token, repeats
    )
    return {
        "draft_token_s": draft_token_s,
        "target_token_s": target_token_s,
        "target_verify_s": verify,
        "uncertainty_s": uncertainty_s,
        **vocabulary,
        "source": "measured",
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "dtype": str(next(target.parameters()).dtype),
            "prompt_tokens": len(prompt),
            "repeats": repeats,
        },
    }


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
    (:func:`edgespec.cuhlm.kselect.online_k` over every k, timed with :data:`NOMINAL_FIT`), and
    ``topk_s``, k -> one ``torch.topk`` extraction of k values and indices, at the sizes of
    :func:`topk_ladder`."""
    if probs.dim() != 2 or probs.shape[0] != 1:
        raise ValueError(f"probs must be one distribution [1, V], got {tuple(probs.shape)}")
    vocab = probs.shape[-1]
    u = torch.full((1,), 0.5)
    online_k_s = _median_time(
        lambda: online_k(probs, token.view(1), u, NOMINAL_FIT, theta_tv), repeats
    )
    topk_s = {
        str(k): _median_time(lambda k=k: torch.topk(probs, k, dim=-1), repeats)
        for k in topk_ladder(vocab)
    }
    return {"online_k_s": online_k_s, "topk_s": topk_s}


# ---------------------------------------------------------------------------------------------
# WISV: prompt prefill and the decision head (methods §4.3)
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def measure_prefill_token_s(model: torch.nn.Module, prompt: Sequence[int], repeats: int) -> float:
    """Median time of one uncached forward over ``prompt`` (a prefill), per prompt token [s]."""
    if len(prompt) < 1:
        raise ValueError("need a non-empty prompt to time a prefill")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], device=device)

    def run():
        model(input_ids=ids, use_cache=True, logits_to_keep=1)

    return _median_time(run, repeats) / len(prompt)


@torch.inference_mode()
def measure_head_round_s(head: torch.nn.Module, gamma: int, csi, repeats: int) -> float:
    """Median time [s] of one decision-head evaluation over a round's ``gamma`` positions (the
    edge runs it once per round with a mismatch), with random inputs of the head's sizes and
    ``csi`` ([d_csi] or [1, d_csi]) for a head that reads the CSI (``d_draft``, ``d_target``,
    ``d_csi`` attributes of ``edgespec.wisv.head.DecisionHead``)."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    generator = torch.Generator().manual_seed(0)
    dtype = next(head.parameters()).dtype
    h_draft = torch.randn((1, gamma, head.d_draft), generator=generator, dtype=dtype)
    h_target = torch.randn((1, gamma, head.d_target), generator=generator, dtype=dtype)
    features = None
    if head.d_csi:
        features = torch.as_tensor(csi, dtype=dtype).reshape(1, 1, head.d_csi)

    def run():
        torch.sigmoid(head(h_draft, h_target, features))

    return _median_time(run, repeats)


# ---------------------------------------------------------------------------------------------
# The edge's batched verification forwards (the multi-device simulation, methods §10)
# ---------------------------------------------------------------------------------------------


class BatchedForwardTimer:
    """One KV-cached target forward over ``tokens`` new tokens in each of ``batch`` rows after
    ``context`` tokens, timed (a callable for ``edgespec.multidevice.batchprofile.collect``).

    Each context is ``prompt`` continued by its own tokens repeated up to that length, prefilled
    once at batch 1; its cache is then repeated to every batch size, so no batch is prefilled,
    and each timed forward is cropped off again, so every call sees the same context. Tokens 1
    is CU-HLM's verification forward, s + 1 one after s skipped tokens, gamma + 1 a WISV
    round's. :meth:`warm_up` runs every shape once (first calls allocate and pick kernels)."""

    def __init__(
        self,
        target: torch.nn.Module,
        prompt: Sequence[int],
        contexts: Sequence[int],
        batch_sizes: Sequence[int],
    ):
        import copy

        if len(prompt) < 1:
            raise ValueError("need a non-empty prompt to time batched forwards")
        if not contexts or min(contexts) < len(prompt):
            raise ValueError(f"contexts {list(contexts)} must be >= the prompt ({len(prompt)})")
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
        self.target = target
        self.device = next(target.parameters()).device
        self.prompt = [int(t) for t in prompt]
        self.caches = {}
        with torch.inference_mode():
            for context in sorted(set(contexts)):
                ids = [self.prompt[i % len(self.prompt)] for i in range(context)]
                prefilled = DynamicCache()
                target(
                    input_ids=torch.tensor([ids], device=self.device),
                    cache=prefilled,
                    use_cache=True,
                    logits_to_keep=1,
                )
                for batch in sorted(set(batch_sizes)):
                    cache = copy.deepcopy(prefilled)
                    if batch > 1:
                        cache.batch_repeat_interleave(batch)
                    self.caches[(context, batch)] = cache

    @torch.inference_mode()
    def _forward(self, context: int, tokens: int, batch: int) -> None:
        if tokens < 1:
            raise ValueError(f"tokens per row must be >= 1, got {tokens}")
        cache = self.caches[(context, batch)]
        row = [self.prompt[-1 - (i % len(self.prompt))] for i in range(tokens)]
        step = torch.tensor([row] * batch, device=self.device)
        self.target(input_ids=step, cache=cache, use_cache=True, logits_to_keep=tokens)
        cache.crop(-tokens)  # a negative count removes that many trailing positions

    def warm_up(self, tokens_per_row: Sequence[int]) -> None:
        """One forward of every (batch, tokens) shape, at the shortest context (the longer
        ones differ only in the cache they attend to)."""
        shortest = min(context for context, _ in self.caches)
        for context, batch in self.caches:
            if context == shortest:
                for tokens in tokens_per_row:
                    self._forward(context, int(tokens), batch)

    def __call__(self, context: int, tokens: int, batch: int) -> float:
        _sync()
        start = time.perf_counter()
        self._forward(context, tokens, batch)
        _sync()
        return time.perf_counter() - start


def profile_target_batching(
    target: torch.nn.Module,
    prompt: Sequence[int],
    extra_context: Sequence[int],
    tokens_per_row: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int,
    rng,
):
    """The edge's batch profile (``edgespec.multidevice.batchprofile``): every (context, tokens,
    batch) cell timed ``repeats`` times in rounds ordered by ``rng`` (a numpy Generator), at the
    contexts ``len(prompt) + e`` for each ``e`` of ``extra_context``, outliers re-timed."""
    from edgespec.multidevice.batchprofile import collect

    contexts = sorted({len(prompt) + int(e) for e in extra_context})
    timer = BatchedForwardTimer(target, prompt, contexts, batch_sizes)
    timer.warm_up(tokens_per_row)
    return collect(timer, contexts, tokens_per_row, batch_sizes, repeats, rng)
