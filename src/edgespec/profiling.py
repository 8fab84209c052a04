"""Measured compute-time profile of a model pair on the machine running the workflow (methods §5).

One stream (batch 1), as one device would run it: draft time per token, target time per
token, target time for one verification forward over gamma+1 tokens and the time of the
uncertainty estimate; the prompt prefill, a decision-head round and the edge's batched
forwards. Each quantity gets one warm-up and the median of ``repeats`` timings
(:func:`median_time`). Nothing here belongs to one wing: the CU-HLM vocabulary work (online
k(t) selection, top-k extraction) is timed by ``edgespec.cuhlm.profile`` with these helpers.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from edgespec.decoding.uncertainty import perturbation_uncertainty


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # GPU kernels run asynchronously: wait before reading the clock


def median_time(fn, repeats: int) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call, the GPU
    synchronised around each (on a CPU-only machine, wall seconds)."""
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

    return median_time(run, repeats)


@torch.inference_mode()
def next_token_logits(model: torch.nn.Module, prompt: Sequence[int]) -> torch.Tensor:
    """[1, V] float32 logits (on the CPU) of the token after ``prompt``: one uncached forward."""
    ids = torch.tensor([list(prompt)], device=next(model.parameters()).device)
    return model(input_ids=ids, logits_to_keep=1).logits[:, -1].float().cpu()


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
    :class:`edgespec.wireless.delay.LatencyProfile`, without the CU-HLM vocabulary work
    (``online_k_s``, ``topk_s``: ``edgespec.cuhlm.profile``)."""
    draft_token_s = _forward_time(draft, prompt, 1, repeats)
    target_token_s = _forward_time(target, prompt, 1, repeats)
    verify = {str(g): _forward_time(target, prompt, g + 1, repeats) for g in sorted(set(gammas))}
    logits = next_token_logits(draft, prompt)
    generator = torch.Generator().manual_seed(seed)
    token = logits.argmax(-1)
    uncertainty_s = median_time(
        lambda: perturbation_uncertainty(logits, token, uncertainty_samples, theta_max, generator),
        repeats,
    )
    return {
        "draft_token_s": draft_token_s,
        "target_token_s": target_token_s,
        "target_verify_s": verify,
        "uncertainty_s": uncertainty_s,
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

    return median_time(run, repeats) / len(prompt)


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

    return median_time(run, repeats)


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
    round's. :meth:`warm_up` runs every shape once (first calls allocate and pick kernels); given
    ``warm_tokens``, the constructor runs it for those token counts."""

    def __init__(
        self,
        target: torch.nn.Module,
        prompt: Sequence[int],
        contexts: Sequence[int],
        batch_sizes: Sequence[int],
        warm_tokens: Sequence[int] = (),
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
        if warm_tokens:
            self.warm_up(warm_tokens)

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
