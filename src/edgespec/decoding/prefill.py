"""Prompt prefill: the ragged caches that decoding starts from.

:func:`prefill` computes the beginning that its prompts share once (a chat template's system
turn, typically) and feeds the rest in chunks of similar length, where one left-padded forward
would compute every padding slot as if it were a token. A run may instead read its prefills
from a store computed once for every run on the same prompts (:class:`Prefills`, met by
:class:`edgespec.decoding.prefill_store.PrefillStore`); :func:`prefill_newcomers` serves the
prompts a decode loop admits from either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from edgespec.decoding.cache import RaggedCachedModel, left_pad
from edgespec.decoding.config import DecodingConfig

MIN_SHARED_PREFIX = 8
"""Prompts that start with at least this many equal tokens are prefilled as one shared prefix
(a chat template's system turn, typically) and their own suffixes."""

PREFILL_PAD_SLACK = 1.25
"""A prefill chunk's padded size stays within this factor of its real tokens (plus a few):
prefilling is compute-bound on a CPU, so padding costs as much as real tokens."""


def _common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _shared_prefix_groups(
    prompts: Sequence[Sequence[int]], keep_last: int
) -> list[tuple[int, list[int]]]:
    """(shared prefix length, row indices) groups covering every row once.

    Rows sorted by their tokens put prompts with a common beginning side by side; a row joins
    the group before it while the group's common prefix stays at least
    :data:`MIN_SHARED_PREFIX` long. The prefix leaves each member at least ``keep_last`` tokens
    of its own. Rows left in a group of one, or in one whose prefix is too short, form the
    first group, which shares nothing (length 0).
    """
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    groups: list[tuple[int, list[int]]] = []
    for row in order:
        if groups:
            shared, members = groups[-1]
            common = _common_prefix_length(prompts[members[0]], prompts[row], shared)
            if common >= MIN_SHARED_PREFIX:
                groups[-1] = (common, members + [row])
                continue
        groups.append((len(prompts[row]), [row]))
    out, alone = [], []
    for shared, members in groups:
        shared = min(shared, min(len(prompts[i]) for i in members) - keep_last)
        if len(members) > 1 and shared >= MIN_SHARED_PREFIX:
            out.append((shared, members))
        else:
            alone += members
    # rows that share nothing are prefilled together, in chunks of similar length
    return ([(0, sorted(alone))] if alone else []) + out


def _length_chunks(members: list[int], lengths: Mapping[int, int]) -> list[list[int]]:
    """``members`` in order of length, cut where padding to the longest would cost more than
    :data:`PREFILL_PAD_SLACK` times the real tokens."""
    members = sorted(members, key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    total = 0
    for row in members:
        if chunks:
            padded = lengths[row] * (len(chunks[-1]) + 1)
            if padded <= PREFILL_PAD_SLACK * (total + lengths[row]) + MIN_SHARED_PREFIX:
                chunks[-1].append(row)
                total += lengths[row]
                continue
        chunks.append([row])
        total = lengths[row]
    return chunks


def prefill(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    pad_token_id: int,
    keep_hidden: bool = False,
    with_outputs: bool = True,
) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """A cache of ``prompts`` (row i holds prompt i) and, ``with_outputs``, the logits
    [B, 1, V] (and hidden states [B, 1, H] with ``keep_hidden``) at each prompt's last token.

    Equal to feeding the left-padded prompts in one forward, with less work: a prefix that
    several prompts share is computed once and its keys and values copied to their rows, and
    the rest is fed in chunks of similar length. Positions count valid slots, so every row
    computes what its unpadded prompt would. Without outputs a prompt may be empty.
    """
    if with_outputs and any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs a token to give outputs at")
    lengths_of = [len(p) for p in prompts]
    parts: list[tuple[RaggedCachedModel, tuple | None, list[int]]] = []
    for shared, members in _shared_prefix_groups(prompts, 1 if with_outputs else 0):
        base = None
        if shared:
            base = RaggedCachedModel(model, keep_hidden)
            prefix = torch.tensor([list(prompts[members[0]][:shared])], dtype=torch.long)
            base.feed(prefix, torch.ones_like(prefix, dtype=torch.bool), 1)
        rest = {i: lengths_of[i] - shared for i in members}
        for chunk in _length_chunks(members, rest):
            if base is not None:
                part = base.take_rows(torch.zeros(len(chunk), dtype=torch.long))
            else:
                part = RaggedCachedModel(model, keep_hidden)
                part.start(len(chunk))
            outs = None
            if max(rest[i] for i in chunk) > 0:
                ids, valid = left_pad([prompts[i][shared:] for i in chunk], pad_token_id, "cpu")
                outs = part.feed(ids, valid, 1)
            parts.append((part, outs, chunk))
    if not parts:
        empty = RaggedCachedModel(model, keep_hidden)
        empty.start(0)
        return empty, None
    combined = parts[0][0]
    for part, _, _ in parts[1:]:
        combined.join(part)
    placed = [row for _, _, chunk in parts for row in chunk]
    back = torch.empty(len(placed), dtype=torch.long)
    back[torch.tensor(placed)] = torch.arange(len(placed))
    if placed != sorted(placed):
        combined.select_rows(back)
    if not with_outputs:
        return combined, None
    logits = torch.cat([o[0] for _, o, _ in parts])[back]
    hidden = torch.cat([o[1] for _, o, _ in parts])[back] if keep_hidden else None
    return combined, (logits, hidden)


class Prefills(Protocol):
    """Prompt prefills computed elsewhere (``edgespec.decoding.prefill_store.PrefillStore``)."""

    def cache(
        self,
        role: str,
        model: torch.nn.Module,
        prompts: Sequence[Sequence[int]],
        keep_hidden: bool = False,
        with_outputs: bool = True,
    ) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
        """What :func:`prefill` of ``prompts`` in ``model`` (role "draft" or "target") returns;
        without outputs, the cache of each prompt but its last token."""
        ...


def prefill_newcomers(
    prefilled: Prefills | None,
    role: str,
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    with_outputs: bool,
) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """The newcomers' cache in ``model`` (and their last-token outputs, ``with_outputs``; else
    the cache of each prompt but its last token): read from ``prefilled`` where given,
    computed otherwise."""
    if prefilled is not None:
        return prefilled.cache(role, model, prompts, cfg.keep_hidden, with_outputs)
    heads = prompts if with_outputs else [p[:-1] for p in prompts]
    return prefill(model, heads, cfg.pad_token_id, cfg.keep_hidden, with_outputs=with_outputs)
