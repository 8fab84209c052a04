"""WISV label mining (methods §4.2): which draft/target mismatches change the answer.

Follows AutoJudge's search for important tokens with its semi-greedy walk: walk the target's
greedy response; at each position where the draft's greedy choice differs, substitute the draft
token, let the target continue greedily, and compare the alternative with the original
response (same final answer for answer tasks, sentence-embedding similarity for open text).
The project chose the semi-greedy variant, not independent judging of each mismatch against
the original response, because its labels then depend on earlier decisions the way SD's
acceptances do at inference time. Uses the decoding core for every greedy continuation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from edgespec.data.answers import (
    answers_match,
    extract_final_number,
    extract_yes_no,
    normalize_number,
)
from edgespec.decoding.engine import (
    DecodingConfig,
    generate_tokenwise,
    left_pad,
)

LABEL_COLUMNS = (
    "prompt_id",
    "step",
    "position",
    "draft_token",
    "target_token",
    "label",
    "risk",
    "similarity",
    "answer_task",
)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.inference_mode()
def _teacher_forced(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_token_id: int,
    batch_size: int,
    select: Callable[[int, np.ndarray | None], Sequence[int]],
    with_argmax: bool,
) -> list[tuple[np.ndarray | None, list[int], torch.Tensor]]:
    """Feed prompt + response and read the states that propose each response token.

    The state for response position j is the last-layer state after consuming the token before
    it (the last prompt token for j = 0): the ``DraftRound`` convention. Per row: (the model's
    argmax at every response position [L_r], or None without ``with_argmax``; the positions
    ``select(row, argmax)`` picked; their hidden states [len, H], float32 on the CPU).
    """
    out: list[tuple[np.ndarray | None, list[int], torch.Tensor]] = []
    device = _device(model)
    for start in range(0, len(prompts), batch_size):
        rows = list(range(start, min(start + batch_size, len(prompts))))
        seqs = [list(prompts[i]) + list(responses[i]) for i in rows]
        lengths = [len(responses[i]) for i in rows]
        ids, valid = left_pad(seqs, pad_token_id, device)
        positions = (valid.long().cumsum(1) - 1).clamp_min(0)
        keep = max(lengths) + 1
        result = model(
            input_ids=ids,
            attention_mask=valid.long(),
            position_ids=positions,
            use_cache=False,
            logits_to_keep=keep if with_argmax else 1,
            output_hidden_states=True,
        )
        hidden = result.hidden_states[-1][:, -keep:]
        choice = result.logits.argmax(-1).cpu().numpy() if with_argmax else None
        for row, (i, length) in enumerate(zip(rows, lengths, strict=True)):
            first = keep - length - 1  # column of the state proposing response token 0
            row_choice = choice[row, first : first + length] if choice is not None else None
            picked = [int(p) for p in select(i, row_choice)]
            index = torch.as_tensor([first + p for p in picked], dtype=torch.long, device=device)
            states = hidden[row].index_select(0, index).to("cpu", torch.float32)
            out.append((row_choice, picked, states))
        del result, hidden
    return out


def _greedy_continuations(
    target: torch.nn.Module,
    prefixes: Sequence[Sequence[int]],
    budgets: Sequence[int],
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    batch_size: int,
) -> list[list[int]]:
    """The target's greedy continuation of each prefix, at most ``budgets[i]`` new tokens.

    Rows are sorted by budget so that each batch runs to about the same length; a batch runs
    to its largest budget and each row is cut to its own (a greedy run with budget b is the
    first b tokens, EOS-cut, of a longer one).
    """
    out: list[list[int]] = [[] for _ in prefixes]
    todo = sorted((i for i, b in enumerate(budgets) if b > 0), key=lambda i: -budgets[i])
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        cfg = DecodingConfig(
            max_new_tokens=max(budgets[i] for i in chunk),
            temperature=0.0,
            eos_token_ids=tuple(eos_token_ids),
            pad_token_id=pad_token_id,
            batch_size=len(chunk),
        )
        generated = generate_tokenwise(
            [prefixes[i] for i in chunk], cfg, torch.Generator(), target=target
        )
        for i, tokens in zip(chunk, generated, strict=True):
            out[i] = tokens[: budgets[i]]
    return out


_YES_NO = ("yes", "no", "true", "false")


def _answer_key(text: str, gold: str | None) -> Any:
    """What "the final answer" of ``text`` is, in the form the gold answer takes.

    Numeric gold (or no gold): the final number; yes/no gold: the yes/no word; other gold:
    whether the text contains it (``answers_match``).
    """
    if gold is None or normalize_number(gold) is not None:
        return extract_final_number(text)
    if gold.strip().lower() in _YES_NO:
        return extract_yes_no(text)
    return answers_match(text, gold)


@dataclass
class _Walk:
    """The semi-greedy walk over one prompt's response."""

    index: int
    response: list[int]
    border: int = 0
    judged: int = 0
    stale: bool = True
    pending: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None
    """Mismatches (position, draft token, h_draft, h_target) at or after ``border``."""


def mine_labels(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[Any],
    golds: Sequence[str | None],
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    batch_size: int,
    decode_text: Callable[[list[int]], str],
    similarity: Callable[[list[str], list[str]], list[float]] | None = None,
    similarity_threshold: float = 0.9,
    max_mismatches_per_prompt: int | None = None,
    hidden_dtype: Any = np.float32,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Mine (mismatch, label) pairs with AutoJudge's semi-greedy walk (methods §4.2).

    Per prompt (token ids, non-empty): the target's greedy response R (at most
    ``max_new_tokens`` tokens, EOS included). The draft is teacher-forced over prompt + R; its
    argmax at response position p is its choice there. Walking the mismatches p (draft choice
    d != R[p]) in order, the target continues prefix = prompt + R[:p] + [d] greedily to the
    same total budget (or EOS), giving the alternative response A. The prompt is an *answer
    task* when it has a gold answer or when the original response has a final number: A is
    safe (label 0, risk 0) iff its final answer equals the original's (the target's own answer,
    as in AutoJudge). Otherwise (open text) s = ``similarity([text(A)], [text(R0)])`` and A is
    safe iff s >= ``similarity_threshold``, with soft risk 1 - s (clipped to [0, 1]).
    ``similarity`` None uses ``edgespec.scoring.semantic_similarity`` when an open-text prompt
    needs it. Texts are ``decode_text`` of the response tokens (prompt excluded).

    Semi-greedy: a safe substitution is kept, and the walk continues on A (the draft is
    teacher-forced again over it); an important one keeps the current response. Answers are
    always compared with the original response R0. At most ``max_mismatches_per_prompt``
    mismatches are judged per prompt (None: all). All continuations of one walk step are
    batched across prompts (``batch_size`` rows per forward).

    Returns (table, draft_hidden [N, H_d], target_hidden [N, H_t]) with one row per judged
    mismatch, ordered by prompt then position. Columns: prompt_id, step (0-based order within
    the prompt), position (index p in the response), draft_token, target_token (the current
    response's token at p, the target's greedy choice there), label (1 = important, 0 = safe),
    risk, similarity (NaN for answer tasks), answer_task. h_draft is the draft's last-layer
    state that proposed the draft token at p and h_target the target's state that scored it
    (both the state after the token before p; ``DraftRound`` convention), as ``hidden_dtype``.
    """
    n = len(prompts)
    if len(prompt_ids) != n or len(golds) != n:
        raise ValueError("prompts, prompt_ids and golds need the same length")
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError("max_new_tokens and batch_size must be >= 1")
    if max_mismatches_per_prompt is not None and max_mismatches_per_prompt < 1:
        raise ValueError("max_mismatches_per_prompt must be >= 1 or None")
    for i, prompt in enumerate(prompts):
        if len(prompt) < 1:
            raise ValueError(f"prompt {i} is empty")
    eos = tuple(int(t) for t in eos_token_ids)
    cap = max_mismatches_per_prompt if max_mismatches_per_prompt is not None else math.inf

    cfg = DecodingConfig(
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        eos_token_ids=eos,
        pad_token_id=pad_token_id,
        batch_size=batch_size,
    )
    originals = generate_tokenwise(prompts, cfg, torch.Generator(), target=target)
    ref_texts = [decode_text(list(r)) for r in originals]
    answer_task = [
        g is not None or extract_final_number(t) is not None
        for g, t in zip(golds, ref_texts, strict=True)
    ]
    ref_keys = [
        _answer_key(t, g) if a else None
        for t, g, a in zip(ref_texts, golds, answer_task, strict=True)
    ]

    walks = [_Walk(i, list(originals[i])) for i in range(n)]
    rows: list[dict[str, Any]] = []
    h_draft_rows: list[torch.Tensor] = []
    h_target_rows: list[torch.Tensor] = []
    progress = tqdm(total=n, desc="mine labels", unit="prompt")
    active = list(walks)
    while active:
        _refresh(
            draft, target, prompts, [w for w in active if w.stale], pad_token_id, batch_size, cap
        )
        jobs = [w for w in active if w.pending]
        finished = [w for w in active if not w.pending]
        progress.update(len(finished))
        if not jobs:
            break
        picks = [w.pending.pop(0) for w in jobs]
        prefixes, budgets = [], []
        for w, (p, d, _, _) in zip(jobs, picks, strict=True):
            prefixes.append(list(prompts[w.index]) + w.response[:p] + [d])
            budgets.append(0 if d in eos else max_new_tokens - p - 1)
        tails = _greedy_continuations(target, prefixes, budgets, eos, pad_token_id, batch_size)
        alternatives = [
            w.response[:p] + [d] + tail
            for w, (p, d, _, _), tail in zip(jobs, picks, tails, strict=True)
        ]
        alt_texts = [decode_text(list(a)) for a in alternatives]
        open_rows = [k for k, w in enumerate(jobs) if not answer_task[w.index]]
        sims: dict[int, float] = {}
        if open_rows:
            if similarity is None:
                from edgespec.scoring import semantic_similarity

                similarity = semantic_similarity
            scores = similarity(
                [alt_texts[k] for k in open_rows], [ref_texts[jobs[k].index] for k in open_rows]
            )
            if len(scores) != len(open_rows):
                raise ValueError("similarity returned a wrong number of scores")
            sims = {k: float(s) for k, s in zip(open_rows, scores, strict=True)}
        for k, (w, (p, d, h_d, h_t)) in enumerate(zip(jobs, picks, strict=True)):
            i = w.index
            if answer_task[i]:
                safe = _answer_key(alt_texts[k], golds[i]) == ref_keys[i]
                risk, sim = 0.0 if safe else 1.0, math.nan
            else:
                sim = sims[k]
                safe = sim >= similarity_threshold
                risk = float(min(max(1.0 - sim, 0.0), 1.0))
            rows.append(
                {
                    "prompt_id": prompt_ids[i],
                    "step": w.judged,
                    "position": p,
                    "draft_token": int(d),
                    "target_token": int(w.response[p]),
                    "label": 0 if safe else 1,
                    "risk": risk,
                    "similarity": sim,
                    "answer_task": bool(answer_task[i]),
                    "_order": i,
                }
            )
            h_draft_rows.append(h_d)
            h_target_rows.append(h_t)
            w.judged += 1
            w.border = p + 1
            if safe:
                w.response = alternatives[k]
                w.stale, w.pending = True, None
            if w.judged >= cap:
                w.pending = []
                w.stale = False
        active = [w for w in jobs if w.judged < cap]
        progress.update(len(jobs) - len(active))
    progress.close()

    table = pd.DataFrame(rows, columns=[*LABEL_COLUMNS, "_order"])
    order = np.lexsort((table["position"].to_numpy(), table["_order"].to_numpy()))
    table = table.iloc[order].drop(columns="_order").reset_index(drop=True)
    table = table.astype(
        {
            "position": np.int64,
            "step": np.int64,
            "draft_token": np.int64,
            "target_token": np.int64,
            "label": np.int64,
            "risk": np.float64,
            "similarity": np.float64,
            "answer_task": bool,
        }
    )
    d_draft = draft.config.hidden_size if not h_draft_rows else h_draft_rows[0].shape[-1]
    d_target = target.config.hidden_size if not h_target_rows else h_target_rows[0].shape[-1]
    draft_hidden = (
        torch.stack(h_draft_rows).numpy()[order] if h_draft_rows else np.zeros((0, d_draft))
    )
    target_hidden = (
        torch.stack(h_target_rows).numpy()[order] if h_target_rows else np.zeros((0, d_target))
    )
    return table, draft_hidden.astype(hidden_dtype), target_hidden.astype(hidden_dtype)


def _refresh(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    walks: Sequence[_Walk],
    pad_token_id: int,
    batch_size: int,
    cap: float,
) -> None:
    """Teacher-force the draft (and, where it disagrees, the target) over the walks' current
    responses and queue the mismatches at or after each border (at most the uncapped rest)."""
    if not walks:
        return

    def mismatches(k: int, choice: np.ndarray | None) -> list[int]:
        w = walks[k]
        found = np.flatnonzero(choice != np.asarray(w.response))
        found = found[found >= w.border]
        room = cap - w.judged
        return found.tolist() if math.isinf(room) else found[: int(room)].tolist()

    forced = _teacher_forced(
        draft,
        [prompts[w.index] for w in walks],
        [w.response for w in walks],
        pad_token_id,
        batch_size,
        mismatches,
        with_argmax=True,
    )
    need = [k for k, (_, picked, _) in enumerate(forced) if picked]
    scored = _teacher_forced(
        target,
        [prompts[walks[k].index] for k in need],
        [walks[k].response for k in need],
        pad_token_id,
        batch_size,
        lambda j, _: forced[need[j]][1],
        with_argmax=False,
    )
    target_states = {k: states for k, (_, _, states) in zip(need, scored, strict=True)}
    for k, w in enumerate(walks):
        choice, picked, h_draft = forced[k]
        w.pending = [
            (p, int(choice[p]), h_draft[j], target_states[k][j]) for j, p in enumerate(picked)
        ]
        w.stale = False
