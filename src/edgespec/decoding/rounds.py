"""Rounds of gamma draft tokens (WISV, methods §4.1).

The device drafts gamma tokens, the edge scores all of them in one forward pass, an
:data:`AcceptanceRule` decides which to keep, and the round commits the longest accepted prefix
plus a recovered (repair) or bonus token. Rows commit different numbers of tokens; the ragged
cache hides the rejected drafts' slots (:mod:`edgespec.decoding.cache`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from edgespec.decoding.cache import RaggedCachedModel, left_pad
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import Prefills, prefill_newcomers
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.sampling import (
    VerificationResult,
    draw_tokens,
    greedy_tokens,
    greedy_verify,
    probabilities,
    rejection_sample,
)
from edgespec.decoding.schedule import Schedule


@dataclass
class DraftRound:
    """One gamma-token round for the active rows, as the edge sees it.

    ``draft_tokens`` [B, G]; ``target_logits`` [B, G+1, V]; ``draft_probs`` [B, G, V] and
    ``target_probs`` [B, G+1, V] at the decoding temperature (None when decoding greedily:
    greedy rules read the logits); hidden states [B, G, H], present when the decoding config
    keeps them: the *after-token* last-layer states of x_i, at x_i's own position after
    consuming it, so that a judge sees the token it judges (methods §4.1). The target's come
    from the verification pass (its positions 1..G); the draft's state of x_i (i < G) from the
    drafting step that consumed x_i, and that of x_G from one extra draft forward over x_G.
    ``prompt_indices`` name the rows' prompts.
    """

    prompt_indices: list[int]
    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor | None
    target_logits: torch.Tensor
    draft_hidden: torch.Tensor | None
    target_hidden: torch.Tensor | None
    generated_lengths: torch.Tensor


AcceptanceRule = Callable[[DraftRound, torch.Generator], VerificationResult]
"""Maps a round to its verification outcome (which prefix is kept, which token repairs)."""


def strict_acceptance(temperature: float) -> AcceptanceRule:
    """Vanilla speculative decoding: greedy matching at temperature 0, rejection sampling above."""

    def rule(round_: DraftRound, generator: torch.Generator) -> VerificationResult:
        if temperature == 0:
            return greedy_verify(round_.draft_tokens, round_.target_logits)
        return rejection_sample(
            round_.draft_tokens, round_.draft_probs, round_.target_probs, generator
        )

    return rule


@dataclass
class RoundStats:
    """Per round and row: tokens drafted, accepted, committed (after EOS/budget cuts)."""

    prompt_index: int
    round_index: int
    num_drafted: int
    num_accepted: int
    num_committed: int
    num_mismatches: int


@torch.inference_mode()
def generate_rounds(
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    generator: torch.Generator,
    draft: torch.nn.Module,
    target: torch.nn.Module,
    gamma: int,
    acceptance: AcceptanceRule | None = None,
    on_round: Callable[[DraftRound, VerificationResult], None] | None = None,
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
) -> tuple[list[list[int]], list[RoundStats]]:
    """Decode in rounds of ``gamma`` draft tokens; returns new tokens per prompt and round stats.

    The default ``acceptance`` is strict (lossless) verification at ``cfg.temperature``.
    ``progress`` counts the committed tokens and finished prompts, and is closed at the end
    (which logs the final tokens/s). ``prefilled`` serves the prompts' prefills (a
    :class:`Prefills`) instead of computing them.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    for i, prompt in enumerate(prompts):
        if len(prompt) < 1:
            raise ValueError(f"prompt {i} is empty")
    acceptance = acceptance or strict_acceptance(cfg.temperature)
    greedy = cfg.temperature == 0
    stats: list[RoundStats] = []
    rounds_done: dict[int, int] = {}
    schedule = Schedule(prompts, cfg)
    dm = RaggedCachedModel(draft, cfg.keep_hidden)
    tm = RaggedCachedModel(target, cfg.keep_hidden)
    draft_pending: list[list[int]] = []
    target_pending: list[list[int]] = []
    while schedule.queue or schedule.active:
        new = schedule.admit()
        if new:
            # Both models see each prompt but its last token, which every round feeds first.
            for role, m in (("draft", dm), ("target", tm)):
                newcomer, _ = prefill_newcomers(
                    prefilled, role, m.model, [prompts[i] for i in new], cfg, with_outputs=False
                )
                m.join(newcomer)
            draft_pending += [[prompts[i][-1]] for i in new]
            target_pending += [[prompts[i][-1]] for i in new]
        batch = len(schedule.active)
        # Draft gamma tokens; the first step also consumes what the draft has not seen yet.
        pend_ids, pend_valid = left_pad(draft_pending, cfg.pad_token_id, "cpu")
        draft_width = pend_ids.shape[1] + gamma - 1
        tokens, probs_list, hidden_list = [], [], []
        step_ids, step_valid = pend_ids, pend_valid
        for step in range(gamma):
            logits, hidden = dm.feed(step_ids, step_valid, 1)
            z = logits[:, -1]
            p = None if greedy else probabilities(z, cfg.temperature)
            tok = draw_tokens(p, z, cfg.temperature, generator)
            tokens.append(tok)
            probs_list.append(p)
            if hidden is not None and step > 0:
                hidden_list.append(hidden[:, -1])  # after-token state of x_step
            step_ids, step_valid = tok.unsqueeze(1), torch.ones((batch, 1), dtype=torch.bool)
        if cfg.keep_hidden:
            # One extra draft forward over x_gamma gives its after-token state; the draft cache
            # then holds all gamma drafts.
            _, hidden = dm.feed(step_ids, step_valid, 1)
            hidden_list.append(hidden[:, -1])
            draft_width += 1
        draft_tokens = torch.stack(tokens, 1)
        t_ids, t_valid = left_pad(
            [tp + row for tp, row in zip(target_pending, draft_tokens.tolist(), strict=True)],
            cfg.pad_token_id,
            "cpu",
        )
        target_logits, target_hidden = tm.feed(t_ids, t_valid, gamma + 1)
        round_ = DraftRound(
            prompt_indices=list(schedule.active),
            draft_tokens=draft_tokens,
            draft_probs=None if greedy else torch.stack(probs_list, 1),
            target_probs=None if greedy else probabilities(target_logits, cfg.temperature),
            target_logits=target_logits,
            draft_hidden=torch.stack(hidden_list, 1) if hidden_list else None,
            target_hidden=target_hidden[:, 1:] if target_hidden is not None else None,
            generated_lengths=torch.tensor([len(schedule.generated[p]) for p in schedule.active]),
        )
        verdict = acceptance(round_, generator)
        if on_round is not None:
            on_round(round_, verdict)
        n = verdict.num_accepted
        committed = [
            row[: int(k) + 1] for row, k in zip(verdict.output_tokens.tolist(), n, strict=True)
        ]
        mismatches = (draft_tokens != greedy_tokens(target_logits[:, :gamma])).sum(1)
        kept, finished = schedule.commit(committed)
        if progress is not None:
            progress.advance(sum(len(k) for k in kept), sum(finished))
        for row, p in enumerate(schedule.active):
            index = rounds_done.get(p, 0)
            stats.append(
                RoundStats(p, index, gamma, int(n[row]), len(kept[row]), int(mismatches[row]))
            )
            rounds_done[p] = index + 1
        # Roll back: the target saw all gamma drafts, keep the accepted ones. The draft fed
        # gamma - 1 drafts (gamma with keep_hidden), keep the accepted ones among them; an
        # accepted x_gamma it has not fed yet goes into its pending tokens.
        tm.invalidate_last(gamma - n, t_ids.shape[1])
        fed = gamma if cfg.keep_hidden else gamma - 1
        dm.invalidate_last((fed - n).clamp_min(0), draft_width)
        final = [row[-1] for row in committed]
        target_pending = [[f] for f in final]
        draft_pending = [
            ([int(draft_tokens[r, -1])] if int(n[r]) > fed else []) + [final[r]]
            for r in range(batch)
        ]
        rows = schedule.keep(finished)
        if rows is not None:
            dm.select_rows(rows)
            tm.select_rows(rows)
            target_pending = [target_pending[r] for r in rows.tolist()]
            draft_pending = [draft_pending[r] for r in rows.tolist()]
        dm.compact()
        tm.compact()
    stats.sort(key=lambda s: (s.prompt_index, s.round_index))
    if progress is not None:
        progress.close()
    return schedule.results(), stats
