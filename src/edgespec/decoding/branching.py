"""Per-row KV caches that are cut to a prefix and re-batched: branches from shared prefixes.

Label mining (methods §4.2) continues many alternative branches, each from a prefix of a
response that a model has already decoded. Prefilling each branch's prefix from scratch costs
one forward over the whole prompt and response per branch, far more than the branch itself on
a CPU. Here the keys and values computed once are kept per row (:class:`RowCache`, the valid
slots of one sequence, no padding), cut to any prefix length without copying
(:meth:`RowCache.prefix`), and stacked left-padded into a batch (:class:`BranchBatch`) that
feeds new tokens on top through the ragged cache's feed
(:meth:`edgespec.decoding.cache.RaggedCachedModel.forward`): a validity mask hides the padding
and position ids count valid slots only, so each row computes what an unpadded sequence would.
:func:`greedy_continue` decodes greedily on such a batch until EOS, a budget or a caller's stop
rule. :func:`prefill_rows` computes first caches with ``prefill.prefill``: a prefix that several
prompts share (a chat template's system turn) once, and the rest in chunks of similar length,
where one left-padded batch would compute every padding slot as if it were a token. Nothing
here is paper-specific.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from edgespec.decoding.cache import RaggedCachedModel, left_pad
from edgespec.decoding.prefill import prefill
from edgespec.decoding.sampling import greedy_tokens


@dataclass
class RowCache:
    """The keys and values of one sequence's first ``len(self)`` tokens, per layer
    [kv_heads, n, head_dim] (views are fine: nothing here writes into them)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def __len__(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0

    def prefix(self, length: int) -> RowCache:
        """The cache of the first ``length`` tokens."""
        if not 0 <= length <= len(self):
            raise ValueError(f"prefix length {length} outside 0..{len(self)}")
        return RowCache([k[:, :length] for k in self.keys], [v[:, :length] for v in self.values])


def _valid_slots(cache: DynamicCache, valid: torch.Tensor, row: int) -> RowCache:
    """A copy of row ``row``'s valid slots (``valid`` [B, S]) of a batched cache."""
    mask = valid[row]
    keys = [layer.keys[row][:, mask].clone() for layer in cache.layers]
    values = [layer.values[row][:, mask].clone() for layer in cache.layers]
    return RowCache(keys, values)


class BranchBatch:
    """A batch of rows, each continuing its own cached prefix on one causal LM.

    ``rows[b]`` is row b's prefix cache (None: empty prefix). Every :meth:`feed` appends new
    tokens per row (ragged lengths, left-padded with invalid slots) and returns the greedy
    choice and the last-layer hidden state at the last ``keep`` fed positions. The rows live in
    a :class:`~edgespec.decoding.cache.RaggedCachedModel` (``ragged``), whose feed runs every
    forward.
    """

    def __init__(self, model: torch.nn.Module, rows: Sequence[RowCache | None]):
        if not rows:
            raise ValueError("a branch batch needs at least one row")
        self.ragged = RaggedCachedModel(model)
        device = self.ragged.device
        lengths = [0 if r is None else len(r) for r in rows]
        width = max(lengths)
        valid = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
        for b, n in enumerate(lengths):
            valid[b, width - n :] = True
        self.ragged.slot_valid = valid
        self.ragged.next_position = torch.as_tensor(lengths, dtype=torch.long, device=device)
        self.ragged.cache = DynamicCache()
        if width > 0:
            filled = next(r for r in rows if r is not None and len(r) > 0)
            layers = []
            for layer in range(len(filled.keys)):
                ref_k, ref_v = filled.keys[layer], filled.values[layer]
                k = ref_k.new_zeros((len(rows), ref_k.shape[0], width, ref_k.shape[2]))
                v = ref_v.new_zeros((len(rows), ref_v.shape[0], width, ref_v.shape[2]))
                for b, (row, n) in enumerate(zip(rows, lengths, strict=True)):
                    if n:
                        k[b, :, width - n :] = row.keys[layer].to(k.device)
                        v[b, :, width - n :] = row.values[layer].to(v.device)
                layers.append((k, v))
            self.ragged.cache = DynamicCache(ddp_cache_data=layers)

    def __len__(self) -> int:
        return self.ragged.num_rows

    @torch.inference_mode()
    def feed(
        self,
        tokens: Sequence[Sequence[int]],
        keep: int,
        pad_token_id: int = 0,
        with_hidden: bool = True,
        sampler: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ``tokens[b]`` (at least one) to row b.

        Returns (argmax [B, keep] long, hidden [B, keep, H] in the model dtype or None without
        ``with_hidden``), both on the CPU, at the last ``keep`` fed positions of each row: the
        greedy next token after each of them and the last-layer state after consuming it. A row
        with fewer than ``keep`` new tokens has padding in its first entries: read its last
        ``len(tokens[b])`` only. ``sampler`` (logits [B, keep, V] -> tokens [B, keep]) replaces
        the argmax, e.g. a seeded draw at a temperature.
        """
        if len(tokens) != len(self):
            raise ValueError(f"{len(tokens)} token lists for {len(self)} rows")
        width = max(len(t) for t in tokens)
        if min(len(t) for t in tokens) < 1 or not 1 <= keep <= width:
            raise ValueError(f"every row needs a new token, and keep={keep} must lie in 1..{width}")
        ids, new_valid = left_pad(tokens, pad_token_id, "cpu")
        out = self.ragged.forward(ids, new_valid, keep, with_hidden)
        logits = out.logits[:, -keep:]
        choice = (greedy_tokens(logits) if sampler is None else sampler(logits)).cpu()
        hidden = out.hidden_states[-1][:, -keep:].cpu() if with_hidden else None
        return choice, hidden

    def row_cache(self, row: int) -> RowCache:
        """Row ``row``'s valid slots: the cache of everything it has consumed (a copy)."""
        return _valid_slots(self.ragged.cache, self.ragged.slot_valid, row)

    def select_rows(self, rows: Sequence[int]) -> None:
        self.ragged.select_rows(torch.as_tensor(list(rows), dtype=torch.long))


def prefill_rows(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], pad_token_id: int = 0
) -> list[RowCache | None]:
    """Each prompt's cache (None for an empty prompt), from ``prefill.prefill``: shared prefixes
    computed once, the rest in chunks of similar length, no forward over padding only."""
    if not prompts:
        return []
    ragged, _ = prefill(model, prompts, pad_token_id, with_outputs=False)
    if ragged.cache is None:
        return [None] * len(prompts)
    return [
        _valid_slots(ragged.cache, ragged.slot_valid, row) if prompt else None
        for row, prompt in enumerate(prompts)
    ]


@dataclass
class Continuation:
    """One row's greedy continuation: ``tokens`` generated after the fed ones; ``first_hidden``
    [H] the state after the last fed token; ``cache`` every consumed token (prefix, fed tokens,
    generated ones but the last); ``stopped_by`` "eos", "budget" or "rule"."""

    tokens: list[int]
    first_hidden: torch.Tensor
    cache: RowCache | None
    stopped_by: str


def greedy_continue(
    model: torch.nn.Module,
    rows: Sequence[RowCache | None],
    feeds: Sequence[Sequence[int]],
    budgets: Sequence[int],
    eos_token_ids: Sequence[int],
    stop: Callable[[int, list[int]], bool] | None = None,
    keep_caches: bool = True,
    pad_token_id: int = 0,
    sampler: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> list[Continuation]:
    """Feed ``feeds[b]`` after ``rows[b]`` and continue greedily, at most ``budgets[b]`` tokens.

    A row ends at an EOS token (kept), at its budget, or when ``stop(b, tokens)`` says so after
    a token (the caller's rule, e.g. a complete final answer). Budget 0 feeds and stops. Rows
    leave the batch as they finish. ``sampler`` (``BranchBatch.feed``) draws every next token
    instead of the argmax (a sampled continuation).
    """
    n = len(rows)
    if not (len(feeds) == len(budgets) == n):
        raise ValueError("rows, feeds and budgets need the same length")
    if any(b < 0 for b in budgets):
        raise ValueError("budgets must be >= 0")
    eos = set(int(t) for t in eos_token_ids)
    batch = BranchBatch(model, rows)
    choice, hidden = batch.feed(feeds, 1, pad_token_id, sampler=sampler)
    results: list[Continuation | None] = [None] * n
    generated: list[list[int]] = [[] for _ in range(n)]
    active = list(range(n))
    next_tokens = choice[:, -1].tolist()
    first_hidden = hidden[:, -1]
    while True:
        keep_rows, finished = [], []
        for slot, b in enumerate(active):
            if budgets[b] == 0:
                finished.append((slot, b, "budget"))
                continue
            tok = int(next_tokens[slot])
            generated[b].append(tok)
            if tok in eos:
                finished.append((slot, b, "eos"))
            elif len(generated[b]) >= budgets[b]:
                finished.append((slot, b, "budget"))
            elif stop is not None and stop(b, generated[b]):
                finished.append((slot, b, "rule"))
            else:
                keep_rows.append(slot)
        for slot, b, why in finished:
            cache = batch.row_cache(slot) if keep_caches else None
            results[b] = Continuation(generated[b], first_hidden[b], cache, why)
        if not keep_rows:
            break
        if len(keep_rows) < len(active):
            batch.select_rows(keep_rows)
            active = [active[s] for s in keep_rows]
        feed = [[generated[b][-1]] for b in active]
        choice, _ = batch.feed(feed, 1, pad_token_id, with_hidden=False, sampler=sampler)
        next_tokens = choice[:, -1].tolist()
    return results  # type: ignore[return-value]
