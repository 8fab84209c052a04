"""Continuous batching: which prompts decode now, and what each has committed.

Prompts are admitted in order of length, at most ``batch_size`` rows decode together, a
finished row leaves the batch, and free rows are refilled from the queue (the newcomers are
prefilled on their own and their cache rows joined to the running batch) instead of letting
the last rounds of a batch run nearly empty. The decoded tokens do not depend on the schedule
for greedy decoding; sampled decoding draws from one generator in schedule order, so it is
reproducible for a given configuration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from edgespec.decoding.config import DecodingConfig


class Schedule:
    """Which prompts decode now: a length-ordered queue feeding at most ``batch_size`` rows.

    ``active[r]`` is the prompt index of batch row r; ``generated[p]`` the tokens committed so
    far for prompt p. Rows are refilled once a quarter of the batch is free (or it is empty),
    so each prefill of newcomers serves several rows.
    """

    def __init__(self, prompts: Sequence[Sequence[int]], cfg: DecodingConfig):
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        self.queue = deque(order)
        self.cfg = cfg
        self.active: list[int] = []
        self.generated: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        self.refill_at = max(1, cfg.batch_size // 4)
        self._eos = set(cfg.eos_token_ids)

    def admit(self) -> list[int]:
        """Prompts to admit now (appended to ``active``), possibly none."""
        free = self.cfg.batch_size - len(self.active)
        if not self.queue or (self.active and free < min(self.refill_at, len(self.queue))):
            return []
        new = [self.queue.popleft() for _ in range(min(free, len(self.queue)))]
        self.active.extend(new)
        return new

    def commit(self, committed: list[list[int]]) -> tuple[list[list[int]], list[bool]]:
        """Append each active row's committed tokens, cut at EOS or the token budget."""
        kept, finished = [], []
        for prompt_index, tokens in zip(self.active, committed, strict=True):
            out = self.generated[prompt_index]
            room = self.cfg.max_new_tokens - len(out)
            taken = []
            done = False
            for tok in tokens[: max(room, 0)]:
                taken.append(tok)
                if tok in self._eos:
                    done = True
                    break
            out.extend(taken)
            kept.append(taken)
            finished.append(done or len(out) >= self.cfg.max_new_tokens)
        return kept, finished

    def keep(self, finished: list[bool]) -> torch.Tensor | None:
        """Drop finished rows from ``active``; the kept row indices, or None if all are kept."""
        if not any(finished):
            return None
        keep = [r for r, f in enumerate(finished) if not f]
        self.active = [self.active[r] for r in keep]
        return torch.tensor(keep, dtype=torch.long)

    def results(self) -> list[list[int]]:
        return [self.generated[i] for i in range(len(self.generated))]
