"""WISV label mining (methods §4.2): which draft/target mismatches change the answer.

Follows AutoJudge's search for important tokens with its semi-greedy walk: walk the target's
greedy response; at each position where the draft's greedy choice differs, substitute the draft
token, let the target continue greedily, and compare the alternative with the original
response. The project chose the semi-greedy variant, not independent judging of each mismatch
against the original response, because its labels then depend on earlier decisions the way
SD's acceptances do at inference time.

Labels measure answers: both branches (the original response and every alternative) run until
the answer is stated (the configured answer marker followed by a complete answer) or EOS, under
their own budget ``label_max_new_tokens``, longer than the decoding budget; a mismatch of an
answer task whose two branches both state an answer is labeled by the answer (criterion
"answer"), every other one by the sentence-embedding similarity of the two branches (criterion
"similarity", the fallback).

The features of a mismatch are the *after-token* states: the last-layer states of the draft and
of the target after consuming the draft token at its position, the convention of
``edgespec.decoding.engine.DraftRound`` at decode time (methods §4.1). They come for free from
the branch: the target's first forward of the alternative and one draft forward over the draft
token.

Nothing is prefilled twice: each prompt's target and draft caches of prompt + response are kept
per row and cut to the mismatch's prefix for every branch (``edgespec.decoding.branching``); a
safe substitution's branch cache becomes the walk's cache. The prompts themselves are
prefilled without padding, their shared system turn once (``branching.prefill_rows``).
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

from edgespec.data.answers import marked_answer
from edgespec.decoding.branching import BranchBatch, RowCache, greedy_continue, prefill_rows

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
    "criterion",
)
CRITERIA = ("answer", "similarity")
"""How a label was decided: the two branches' stated answers, or their similarity."""

DEFAULT_ANSWER_MARKER = "The answer is"


@dataclass
class _Branch:
    """A finished response: its tokens, text and stated answer (None: none reached)."""

    tokens: list[int]
    text: str
    answer: Any


@dataclass
class _Walk:
    """The semi-greedy walk over one prompt's response (``edgespec.decoding.branching``
    caches: the target's covers at least prompt + response[:-1], the draft's prompt +
    response[:len(choices) - 1]; ``choices`` the draft's greedy token at each mined
    position)."""

    index: int
    response: list[int]
    target_cache: RowCache
    draft_cache: RowCache
    choices: list[int]
    border: int = 0
    judged: int = 0

    def next_mismatch(self) -> int | None:
        for p in range(self.border, len(self.choices)):
            if self.choices[p] != self.response[p]:
                return p
        return None


def _stated_answer(
    tokens: list[int], text: str, eos: set[int], marker: str, gold: str | None
) -> Any:
    """The branch's answer if it stated one completely (or stated one and ended at EOS)."""
    value, complete = marked_answer(text, marker, gold)
    if value is None:
        return None
    return value if complete or (tokens and tokens[-1] in eos) else None


def _answer_stop(
    prefixes: Sequence[list[int]],
    owners: Sequence[int],
    answer_task: Sequence[bool],
    golds: Sequence[str | None],
    decode_text: Callable[[list[int]], str],
    marker: str,
) -> Callable[[int, list[int]], bool]:
    """The stopping rule of a batch of branches: row b (prompt ``owners[b]``, response so far
    ``prefixes[b]`` + generated tokens) stops once an answer task's text states a complete
    answer."""

    def stop(row: int, tokens: list[int]) -> bool:
        i = owners[row]
        if not answer_task[i]:
            return False
        return marked_answer(decode_text(prefixes[row] + tokens), marker, golds[i])[1]

    return stop


def _draft_choices(
    draft: torch.nn.Module,
    caches: Sequence[RowCache | None],
    feeds: Sequence[list[int]],
    wanted: Sequence[int],
    pad_token_id: int,
) -> tuple[list[list[int]], list[RowCache]]:
    """Teacher-force the draft over ``feeds[b]`` after ``caches[b]``: its greedy choice after
    each of the last ``wanted[b]`` fed tokens, and its cache of everything fed."""
    batch = BranchBatch(draft, caches)
    choice, _ = batch.feed(feeds, max(wanted), pad_token_id, with_hidden=False)
    out = [choice[b, choice.shape[1] - n :].tolist() for b, n in enumerate(wanted)]
    return out, [batch.row_cache(b) for b in range(len(feeds))]


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
    similarity_threshold: float = 0.85,
    max_mismatches_per_prompt: int | None = None,
    hidden_dtype: Any = np.float32,
    *,
    label_max_new_tokens: int | None = None,
    answer_marker: str = DEFAULT_ANSWER_MARKER,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Mine (mismatch, label) pairs with AutoJudge's semi-greedy walk (module docstring).

    Per prompt (token ids, non-empty): the target's greedy response R0, at most
    ``label_max_new_tokens`` tokens (default ``max_new_tokens``), ending early at EOS or, for
    an answer task, once it states a complete answer (``marked_answer`` after
    ``answer_marker``). Mismatches are mined among the first ``max_new_tokens`` positions (the
    decoding budget: where decoding meets them): the draft, teacher-forced over the current
    response, proposes d != R[p] at p. Walking them in order, the target continues prompt +
    R[:p] + [d] greedily to the same total budget and stopping rule, giving the alternative A.

    A prompt is an *answer task* iff it has a gold answer. When R0 and A both state an answer,
    A is safe (label 0, risk 0) iff the answers agree (the target's own answer, as in
    AutoJudge), else important (label 1, risk 1): criterion "answer". Otherwise (open text, or
    a branch that never states an answer) s = ``similarity([text(A)], [text(R0)])``, A is
    safe iff s >= ``similarity_threshold`` and its risk is the graded 1 - s (clipped to
    [0, 1]): criterion "similarity". ``similarity`` None uses
    ``edgespec.scoring.semantic_similarity`` when needed. Texts are ``decode_text`` of the
    response tokens (prompt excluded).

    Semi-greedy: a safe substitution is kept and the walk continues on A; an important one
    keeps the current response. Answers are always compared with R0. At most
    ``max_mismatches_per_prompt`` are judged per prompt (None: all). Prompts are processed
    ``batch_size`` at a time, each walk step's branches batched together.

    Returns (table, draft_hidden [N, H_d], target_hidden [N, H_t]), one row per judged
    mismatch ordered by prompt then position, columns ``LABEL_COLUMNS``: prompt_id, step
    (0-based order within the prompt), position p, draft_token, target_token (the current
    response's token at p), label (1 = important), risk, similarity (NaN under the answer
    criterion), answer_task, criterion. The hidden states are the after-token states of the
    draft token (both models, state after consuming d at p; ``DraftRound`` convention), as
    ``hidden_dtype``.
    """
    n = len(prompts)
    label_budget = max_new_tokens if label_max_new_tokens is None else int(label_max_new_tokens)
    if len(prompt_ids) != n or len(golds) != n:
        raise ValueError("prompts, prompt_ids and golds need the same length")
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError("max_new_tokens and batch_size must be >= 1")
    if label_budget < max_new_tokens:
        raise ValueError(
            f"label_max_new_tokens ({label_budget}) must be >= max_new_tokens ({max_new_tokens})"
        )
    if max_mismatches_per_prompt is not None and max_mismatches_per_prompt < 1:
        raise ValueError("max_mismatches_per_prompt must be >= 1 or None")
    for i, prompt in enumerate(prompts):
        if len(prompt) < 1:
            raise ValueError(f"prompt {i} is empty")
    eos = set(int(t) for t in eos_token_ids)
    cap = max_mismatches_per_prompt if max_mismatches_per_prompt is not None else math.inf
    answer_task = [g is not None for g in golds]

    def judge_similarity(texts: list[str], refs: list[str]) -> list[float]:
        nonlocal similarity
        if similarity is None:
            from edgespec.scoring import semantic_similarity

            similarity = semantic_similarity
        scores = list(similarity(texts, refs))
        if len(scores) != len(texts):
            raise ValueError("similarity returned a wrong number of scores")
        return [float(s) for s in scores]

    rows: list[dict[str, Any]] = []
    h_draft_rows: list[torch.Tensor] = []
    h_target_rows: list[torch.Tensor] = []
    progress = tqdm(total=n, desc="mine labels", unit="prompt")
    for start in range(0, n, batch_size):
        chunk = list(range(start, min(start + batch_size, n)))

        def stop_rule(prefixes: Sequence[list[int]], owners: Sequence[int]):
            return _answer_stop(prefixes, owners, answer_task, golds, decode_text, answer_marker)

        # The original responses R0, after one prefill of the prompts.
        originals = greedy_continue(
            target,
            prefill_rows(target, [prompts[i][:-1] for i in chunk], pad_token_id),
            [[prompts[i][-1]] for i in chunk],
            [label_budget] * len(chunk),
            eos,
            stop=stop_rule([[] for _ in chunk], chunk),
            pad_token_id=pad_token_id,
        )
        refs: dict[int, _Branch] = {}
        for i, cont in zip(chunk, originals, strict=True):
            text = decode_text(list(cont.tokens))
            answer = _stated_answer(cont.tokens, text, eos, answer_marker, golds[i])
            refs[i] = _Branch(list(cont.tokens), text, answer if answer_task[i] else None)
        mined = [min(len(refs[i].tokens), max_new_tokens) for i in chunk]
        choices, draft_caches = _draft_choices(
            draft,
            prefill_rows(draft, [prompts[i][:-1] for i in chunk], pad_token_id),
            [[prompts[i][-1], *refs[i].tokens[: m - 1]] for i, m in zip(chunk, mined, strict=True)],
            mined,
            pad_token_id,
        )
        walks = [
            _Walk(i, list(refs[i].tokens), cont.cache, dcache, choice)
            for i, cont, dcache, choice in zip(chunk, originals, draft_caches, choices, strict=True)
        ]

        while True:
            walks = [w for w in walks if w.judged < cap and w.next_mismatch() is not None]
            jobs = walks
            if not jobs:
                break
            picks = [w.next_mismatch() for w in jobs]
            draft_tokens = [w.choices[p] for w, p in zip(jobs, picks, strict=True)]
            lengths = [len(prompts[w.index]) for w in jobs]
            # Target branches: the alternative responses, from the cached prefix prompt + R[:p].
            prefixes = [
                w.response[:p] + [d] for w, p, d in zip(jobs, picks, draft_tokens, strict=True)
            ]
            branches = greedy_continue(
                target,
                [
                    w.target_cache.prefix(n_p + p)
                    for w, n_p, p in zip(jobs, lengths, picks, strict=True)
                ],
                [[d] for d in draft_tokens],
                [
                    0 if d in eos else label_budget - p - 1
                    for p, d in zip(picks, draft_tokens, strict=True)
                ],
                eos,
                stop=stop_rule(prefixes, [w.index for w in jobs]),
                pad_token_id=pad_token_id,
            )
            # The draft's after-token state of d (and its next choice on the alternative).
            draft_batch = BranchBatch(
                draft,
                [
                    w.draft_cache.prefix(n_p + p)
                    for w, n_p, p in zip(jobs, lengths, picks, strict=True)
                ],
            )
            after_d, h_draft = draft_batch.feed([[d] for d in draft_tokens], 1, pad_token_id)

            alternatives = [pre + b.tokens for pre, b in zip(prefixes, branches, strict=True)]
            alt_texts = [decode_text(list(a)) for a in alternatives]
            verdicts: list[tuple[bool, float, float, str]] = [None] * len(jobs)  # type: ignore[list-item]
            fallback = []
            for k, w in enumerate(jobs):
                ref = refs[w.index]
                alt_answer = (
                    _stated_answer(
                        alternatives[k], alt_texts[k], eos, answer_marker, golds[w.index]
                    )
                    if answer_task[w.index]
                    else None
                )
                if ref.answer is not None and alt_answer is not None:
                    safe = alt_answer == ref.answer
                    verdicts[k] = (safe, 0.0 if safe else 1.0, math.nan, "answer")
                else:
                    fallback.append(k)
            if fallback:
                sims = judge_similarity(
                    [alt_texts[k] for k in fallback], [refs[jobs[k].index].text for k in fallback]
                )
                for k, s in zip(fallback, sims, strict=True):
                    risk = float(min(max(1.0 - s, 0.0), 1.0))
                    verdicts[k] = (s >= similarity_threshold, risk, s, "similarity")

            adopt = []
            for k, (w, p, d) in enumerate(zip(jobs, picks, draft_tokens, strict=True)):
                safe, risk, sim, criterion = verdicts[k]
                rows.append(
                    {
                        "prompt_id": prompt_ids[w.index],
                        "step": w.judged,
                        "position": p,
                        "draft_token": int(d),
                        "target_token": int(w.response[p]),
                        "label": 0 if safe else 1,
                        "risk": risk,
                        "similarity": sim,
                        "answer_task": bool(answer_task[w.index]),
                        "criterion": criterion,
                        "_order": w.index,
                    }
                )
                h_draft_rows.append(h_draft[k, -1])
                h_target_rows.append(branches[k].first_hidden)
                w.judged += 1
                w.border = p + 1
                if safe:
                    adopt.append(k)
            # Semi-greedy: a safe alternative becomes the walk's response (and caches).
            if adopt:
                feeds, wanted, keep_idx = [], [], []
                for k in adopt:
                    w, p = jobs[k], picks[k]
                    w.response = alternatives[k]
                    w.target_cache = branches[k].cache
                    m = min(len(w.response), max_new_tokens)
                    w.choices = w.choices[:p] + [draft_tokens[k]]
                    if m > p + 1:
                        w.choices.append(int(after_d[k, -1]))
                    if m > p + 2:
                        feeds.append(w.response[p + 1 : m - 1])
                        wanted.append(len(feeds[-1]))
                        keep_idx.append(k)
                    else:
                        w.draft_cache = draft_batch.row_cache(k)
                if keep_idx:
                    more, caches = _draft_choices(
                        draft,
                        [draft_batch.row_cache(k) for k in keep_idx],
                        feeds,
                        wanted,
                        pad_token_id,
                    )
                    for k, extra, cache in zip(keep_idx, more, caches, strict=True):
                        jobs[k].choices.extend(extra)
                        jobs[k].draft_cache = cache
        progress.update(len(chunk))
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
            "criterion": str,
        }
    )
    d_draft = draft.config.hidden_size if not h_draft_rows else h_draft_rows[0].shape[-1]
    d_target = target.config.hidden_size if not h_target_rows else h_target_rows[0].shape[-1]
    draft_hidden = (
        torch.stack(h_draft_rows).double().numpy()[order]
        if h_draft_rows
        else np.zeros((0, d_draft))
    )
    target_hidden = (
        torch.stack(h_target_rows).double().numpy()[order]
        if h_target_rows
        else np.zeros((0, d_target))
    )
    return table, draft_hidden.astype(hidden_dtype), target_hidden.astype(hidden_dtype)


def criterion_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many labels each criterion decided, and how many answer tasks fell back to the
    similarity because a branch never stated an answer (for the report)."""
    counts = {c: int((table["criterion"] == c).sum()) for c in CRITERIA}
    counts["answer_task_fallback"] = int(
        ((table["criterion"] == "similarity") & table["answer_task"]).sum()
    )
    return counts
