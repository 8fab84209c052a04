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
``edgespec.decoding.rounds.DraftRound`` at decode time (methods §4.1). They come for free from
the branch: the target's first forward of the alternative and one draft forward over the draft
token.

Nothing is prefilled twice: each prompt's target and draft caches of prompt + response are kept
per row and cut to the mismatch's prefix for every branch (``edgespec.decoding.branching``); a
safe substitution's branch cache becomes the walk's cache. The prompts themselves are
prefilled without padding, their shared system turn once (``branching.prefill_rows``).

:func:`mine_labels` reads as the walk's steps: ``_start_walks`` (R0 and the draft's choices
along it), ``_choose_mismatches``, ``_substitute``, ``_continue_branches``,
``_draft_after_tokens``, ``_alternatives``, ``mining.judge_branches``, ``_record_labels``,
``_advance_walks`` and ``_assemble_table``. The settings (``MiningConfig``) and the judging of
a branch live in ``edgespec.wisv.mining``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from edgespec.decoding.branching import BranchBatch, RowCache, greedy_continue, prefill_rows
from edgespec.decoding.sampling import probabilities, sample
from edgespec.wisv.mining import (
    CRITERIA,
    Branch,
    MiningConfig,
    MiningTask,
    Similarity,
    Verdict,
    averaged_risks,
    judge_branches,
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
    "criterion",
)


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


@dataclass
class _Step:
    """One walk step's substitutions: walk k puts the draft token ``draft_tokens[k]`` at
    position ``positions[k]`` of its current response; ``prefixes[k]`` is the substituted
    branch so far (response[:p] + [d]) and ``cuts[k]`` = prompt length + p the length of the
    cached prefix the branch starts from."""

    walks: list[_Walk]
    positions: list[int]
    draft_tokens: list[int]
    prefixes: list[list[int]]
    cuts: list[int]


class _DraftAfter(NamedTuple):
    """The draft fed each substituted token: its batch (caches), its next greedy choice
    [B, 1] and its after-token state [B, 1, H_d]."""

    batch: BranchBatch
    choice: torch.Tensor
    hidden: torch.Tensor


@dataclass
class _Found:
    """The labels mined so far: table rows and the after-token states, in mining order."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    draft_states: list[torch.Tensor] = field(default_factory=list)
    target_states: list[torch.Tensor] = field(default_factory=list)


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


def _start_walks(
    draft: torch.nn.Module, target: torch.nn.Module, task: MiningTask, chunk: list[int]
) -> tuple[dict[int, Branch], list[_Walk]]:
    """The original responses R0 of the prompts ``chunk`` (after one prefill of the prompts
    per model), and a walk over each: the draft's greedy choices teacher-forced along R0's
    first ``max_new_tokens`` positions."""
    cfg = task.config
    heads = [list(task.prompts[i][:-1]) for i in chunk]
    originals = greedy_continue(
        target,
        prefill_rows(target, heads, cfg.pad_token_id),
        [[task.prompts[i][-1]] for i in chunk],
        [cfg.label_budget] * len(chunk),
        task.eos,
        stop=task.stop_rule([[] for _ in chunk], chunk),
        pad_token_id=cfg.pad_token_id,
    )
    refs = {i: task.branch(i, list(cont.tokens)) for i, cont in zip(chunk, originals, strict=True)}
    mined = [min(len(refs[i].tokens), cfg.max_new_tokens) for i in chunk]
    choices, draft_caches = _draft_choices(
        draft,
        prefill_rows(draft, heads, cfg.pad_token_id),
        [
            [task.prompts[i][-1], *refs[i].tokens[: m - 1]]
            for i, m in zip(chunk, mined, strict=True)
        ],
        mined,
        cfg.pad_token_id,
    )
    walks = [
        _Walk(i, list(refs[i].tokens), cont.cache, dcache, choice)
        for i, cont, dcache, choice in zip(chunk, originals, draft_caches, choices, strict=True)
    ]
    return refs, walks


def _choose_mismatches(walks: list[_Walk], cap: float) -> list[_Walk]:
    """The walks that judge another mismatch: fewer than ``cap`` judged, and a position past
    their border where the draft's choice differs from the current response."""
    return [w for w in walks if w.judged < cap and w.next_mismatch() is not None]


def _substitute(task: MiningTask, walks: list[_Walk]) -> _Step:
    """Each walk's next mismatch p and the branch that puts the draft's token d there."""
    positions = [w.next_mismatch() for w in walks]
    tokens = [w.choices[p] for w, p in zip(walks, positions, strict=True)]
    return _Step(
        walks,
        positions,
        tokens,
        [w.response[:p] + [d] for w, p, d in zip(walks, positions, tokens, strict=True)],
        [len(task.prompts[w.index]) + p for w, p in zip(walks, positions, strict=True)],
    )


def _continue_branches(
    target: torch.nn.Module, task: MiningTask, step: _Step, sampler=None, copies: int = 1
) -> list[Any]:
    """The target continues every substituted branch greedily (or drawing with ``sampler``,
    ``copies`` times each, copy-major) from its cached prefix, to the label budget in all (none
    after an EOS draft token) or the stated answer."""
    budget = task.config.label_budget
    return greedy_continue(
        target,
        [w.target_cache.prefix(cut) for w, cut in zip(step.walks, step.cuts, strict=True)] * copies,
        [[d] for d in step.draft_tokens] * copies,
        [
            0 if d in task.eos else budget - p - 1
            for p, d in zip(step.positions, step.draft_tokens, strict=True)
        ]
        * copies,
        task.eos,
        stop=task.stop_rule(step.prefixes * copies, [w.index for w in step.walks] * copies),
        keep_caches=sampler is None,
        pad_token_id=task.config.pad_token_id,
        sampler=sampler,
    )


def _sampled_verdicts(
    target: torch.nn.Module,
    task: MiningTask,
    step: _Step,
    refs: dict[int, Branch],
    generator: torch.Generator,
) -> list[list[Verdict]]:
    """The verdicts of K - 1 continuations of every substituted branch drawn at the mining's
    continuation temperature (``MiningConfig.continuations``): one list per draw."""
    copies = task.config.continuations - 1
    if copies < 1:
        return []
    temperature = task.config.continuation_temperature

    def sampler(logits: torch.Tensor) -> torch.Tensor:
        return sample(probabilities(logits, temperature), generator)

    branches = _continue_branches(target, task, step, sampler, copies)
    n = len(step.walks)
    originals = [refs[w.index] for w in step.walks]
    return [
        judge_branches(task, originals, _alternatives(task, step, branches[k * n : (k + 1) * n]))
        for k in range(copies)
    ]


def _draft_after_tokens(draft: torch.nn.Module, task: MiningTask, step: _Step) -> _DraftAfter:
    """The draft's after-token state of each substituted token (and its next choice on the
    alternative), from its cached prefix."""
    batch = BranchBatch(
        draft, [w.draft_cache.prefix(cut) for w, cut in zip(step.walks, step.cuts, strict=True)]
    )
    choice, hidden = batch.feed([[d] for d in step.draft_tokens], 1, task.config.pad_token_id)
    return _DraftAfter(batch, choice, hidden)


def _alternatives(task: MiningTask, step: _Step, branches: list[Any]) -> list[Branch]:
    """The substituted branches as finished responses: prefix + the target's continuation."""
    return [
        task.branch(w.index, pre + b.tokens)
        for w, pre, b in zip(step.walks, step.prefixes, branches, strict=True)
    ]


def _record_labels(
    found: _Found,
    task: MiningTask,
    step: _Step,
    verdicts: list[Verdict],
    after: _DraftAfter,
    branches: list[Any],
) -> None:
    """One label row per judged substitution, with both models' after-token states."""
    for k, (w, p, d) in enumerate(zip(step.walks, step.positions, step.draft_tokens, strict=True)):
        verdict = verdicts[k]
        found.rows.append(
            {
                "prompt_id": task.prompt_ids[w.index],
                "step": w.judged,
                "position": p,
                "draft_token": int(d),
                "target_token": int(w.response[p]),
                "label": 0 if verdict.safe else 1,
                "risk": verdict.risk,
                "similarity": verdict.similarity,
                "answer_task": bool(task.answer_task[w.index]),
                "criterion": verdict.criterion,
                "_order": w.index,
            }
        )
        found.draft_states.append(after.hidden[k, -1])
        found.target_states.append(branches[k].first_hidden)


def _advance_walks(
    draft: torch.nn.Module,
    task: MiningTask,
    step: _Step,
    verdicts: list[Verdict],
    alternatives: list[Branch],
    branches: list[Any],
    after: _DraftAfter,
) -> None:
    """Move every walk past its judged mismatch. Semi-greedy: a safe alternative becomes the
    walk's response, with the branch's target cache and the draft's choices (and cache) along
    the new response; an important one keeps the current response."""
    max_new = task.config.max_new_tokens
    feeds, wanted, keep_idx = [], [], []
    for k, (w, p) in enumerate(zip(step.walks, step.positions, strict=True)):
        w.judged += 1
        w.border = p + 1
        if not verdicts[k].safe:
            continue
        w.response = alternatives[k].tokens
        w.target_cache = branches[k].cache
        m = min(len(w.response), max_new)
        w.choices = w.choices[:p] + [step.draft_tokens[k]]
        if m > p + 1:
            w.choices.append(int(after.choice[k, -1]))
        if m > p + 2:
            feeds.append(w.response[p + 1 : m - 1])
            wanted.append(len(feeds[-1]))
            keep_idx.append(k)
        else:
            w.draft_cache = after.batch.row_cache(k)
    if keep_idx:
        more, caches = _draft_choices(
            draft,
            [after.batch.row_cache(k) for k in keep_idx],
            feeds,
            wanted,
            task.config.pad_token_id,
        )
        for k, extra, cache in zip(keep_idx, more, caches, strict=True):
            step.walks[k].choices.extend(extra)
            step.walks[k].draft_cache = cache


def _assemble_table(
    found: _Found, draft: torch.nn.Module, target: torch.nn.Module, hidden_dtype: Any
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The label table (``LABEL_COLUMNS``, ordered by prompt then position, typed) and the
    after-token states in the same order, as ``hidden_dtype``."""
    table = pd.DataFrame(found.rows, columns=[*LABEL_COLUMNS, "_order"])
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

    def states(rows: list[torch.Tensor], model: torch.nn.Module) -> np.ndarray:
        if not rows:
            return np.zeros((0, model.config.hidden_size)).astype(hidden_dtype)
        return torch.stack(rows).double().numpy()[order].astype(hidden_dtype)

    return table, states(found.draft_states, draft), states(found.target_states, target)


def mine_labels(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[Any],
    golds: Sequence[str | None],
    config: MiningConfig,
    decode_text: Callable[[list[int]], str],
    similarity: Similarity | None = None,
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Mine (mismatch, label) pairs with AutoJudge's semi-greedy walk (module docstring).

    Per prompt (token ids, non-empty): the target's greedy response R0, at most
    ``config.label_budget`` tokens, ending early at EOS or, for an answer task, once it states
    a complete answer (``marked_answer`` after ``config.answer_marker``). Mismatches are mined
    among the first ``config.max_new_tokens`` positions (the decoding budget: where decoding
    meets them): the draft, teacher-forced over the current response, proposes d != R[p] at p.
    Walking them in order, the target continues prompt + R[:p] + [d] greedily to the same total
    budget and stopping rule, giving the alternative A.

    A prompt is an *answer task* iff it has a gold answer. When R0 and A both state an answer,
    A is safe (label 0, risk 0) iff the answers agree (the target's own answer, as in
    AutoJudge), else important (label 1, risk 1): criterion "answer". Otherwise (open text, or
    a branch that never states an answer) s = ``similarity([text(A)], [text(R0)])``, A is
    safe iff s >= ``config.similarity_threshold`` and its risk is the graded 1 - s (clipped to
    [0, 1]): criterion "similarity". ``similarity`` None uses
    ``edgespec.scoring.semantic_similarity`` when needed. Texts are ``decode_text`` of the
    response tokens (prompt excluded).

    With ``config.continuations`` K > 1 the risk is graded: the mean over the greedy verdict and
    K - 1 continuations of prompt + R[:p] + [d] drawn at ``config.continuation_temperature``
    (one seeded generator, ``config.seed``), each judged like A; the label and the walk stay
    the greedy ones'.

    Semi-greedy: a safe substitution is kept and the walk continues on A; an important one
    keeps the current response. Answers are always compared with R0. At most
    ``config.max_mismatches_per_prompt`` are judged per prompt (None: all). Prompts are
    processed ``config.batch_size`` at a time, each walk step's branches batched together.

    Returns (table, draft_hidden [N, H_d], target_hidden [N, H_t]), one row per judged
    mismatch ordered by prompt then position, columns ``LABEL_COLUMNS``: prompt_id, step
    (0-based order within the prompt), position p, draft_token, target_token (the current
    response's token at p), label (1 = important), risk, similarity (NaN under the answer
    criterion), answer_task, criterion. The hidden states are the after-token states of the
    draft token (both models, state after consuming d at p; ``DraftRound`` convention), as
    ``config.hidden_dtype``.
    """
    task = MiningTask(prompts, prompt_ids, golds, config, decode_text, similarity)
    found = _Found()
    n, size = len(prompts), config.batch_size
    progress = tqdm(total=n, desc="mine labels", unit="prompt")
    generator = torch.Generator().manual_seed(config.seed)
    for start in range(0, n, size):
        chunk = list(range(start, min(start + size, n)))
        refs, walks = _start_walks(draft, target, task, chunk)
        while walks := _choose_mismatches(walks, config.cap):
            step = _substitute(task, walks)
            branches = _continue_branches(target, task, step)
            after = _draft_after_tokens(draft, task, step)
            alternatives = _alternatives(task, step, branches)
            verdicts = judge_branches(task, [refs[w.index] for w in step.walks], alternatives)
            draws = _sampled_verdicts(target, task, step, refs, generator)
            _record_labels(found, task, step, averaged_risks(verdicts, draws), after, branches)
            _advance_walks(draft, task, step, verdicts, alternatives, branches, after)
        progress.update(len(chunk))
    progress.close()
    return _assemble_table(found, draft, target, config.hidden_dtype)


def criterion_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many labels each criterion decided, and how many answer tasks fell back to the
    similarity because a branch never stated an answer (for the report)."""
    counts = {c: int((table["criterion"] == c).sum()) for c in CRITERIA}
    counts["answer_task_fallback"] = int(
        ((table["criterion"] == "similarity") & table["answer_task"]).sum()
    )
    return counts


def label_summary(
    table: pd.DataFrame, golds: Sequence[str | None], config: MiningConfig, seconds: float
) -> dict[str, Any]:
    """The counts of one mining (rule mine_labels' summary.json): prompts (one per gold
    answer, None for open text), answer-task prompts, mismatches, important and safe labels,
    ``criterion_counts``, the label budget [tokens] and the wall time ``seconds`` [s]."""
    return {
        "prompts": len(golds),
        "answer_task_prompts": sum(g is not None for g in golds),
        "mismatches": len(table),
        "important": int(table["label"].sum()),
        "safe": int((table["label"] == 0).sum()),
        "criterion": criterion_counts(table),
        "label_max_new_tokens": config.label_max_new_tokens,
        "continuations": config.continuations,
        "risk_graded": int(((table["risk"] > 0) & (table["risk"] < 1)).sum()),
        "seconds": seconds,
    }
