"""Text-level scores of CU-HLM completions (methods §6): exact match, pass@1, semantic
accuracy, fidelity, and whether the token budget ran out before an answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from edgespec import scoring
from edgespec.data.answers import marked_answer
from edgespec.data.humaneval import TASK as CODE_TASK


def _field(record, name: str):
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _cosine(texts: Sequence[str], references: Sequence[str]) -> np.ndarray:
    if not texts:
        return np.zeros(0)
    a, b = scoring.embed(list(texts)), scoring.embed(list(references))
    return (a * b).sum(-1).to(torch.float64).numpy()


def _answered(text: str, record, answer_marker: str | None) -> bool:
    """Whether a completion states its answer: after ``answer_marker`` where the record has a
    gold answer, in a closed code block for code; never for open text."""
    if _field(record, "task") == CODE_TASK:
        return text.count("```") >= 2
    gold = _field(record, "gold_answer")
    if gold is None or not answer_marker:
        return False
    return marked_answer(text, answer_marker, gold)[0] is not None


def budget_columns(
    texts: Sequence[str],
    records: Sequence[Any],
    lengths: Sequence[int],
    max_new_tokens: int,
    answer_marker: str | None,
) -> dict[str, np.ndarray]:
    """``new_tokens`` (per completion), ``budget_exhausted`` (1 where it used every one of
    ``max_new_tokens``: no end-of-sequence before the budget) and ``answer_cut`` (1 where the
    budget ran out before the answer was stated, :func:`_answered`)."""
    if not len(texts) == len(records) == len(lengths):
        raise ValueError(f"{len(texts)} texts, {len(records)} records, {len(lengths)} lengths")
    new_tokens = np.asarray(lengths, dtype=float)
    exhausted = new_tokens >= max_new_tokens
    answered = np.array(
        [_answered(t, r, answer_marker) for t, r in zip(texts, records, strict=True)]
    )
    return {
        "new_tokens": new_tokens,
        "budget_exhausted": exhausted.astype(float),
        "answer_cut": (exhausted & ~answered).astype(float),
    }


def text_scores(
    completion_texts: Sequence[str],
    records: Sequence[Any],
    reference_texts_llm: Sequence[str] | None,
    code_timeout_s: float = 3.0,
) -> pd.DataFrame:
    """Per-prompt text scores of one variant (methods §6), one row per completion.

    ``records`` (:class:`edgespec.data.records.PromptRecord` or mappings with ``id``, ``task``,
    ``reference``, ``gold_answer``) align with ``completion_texts``; ``reference_texts_llm``
    are the LLM-only outputs of the same prompts (None: the columns that need them are NaN,
    e.g. when scoring LLM-only against itself is pointless). Columns: ``prompt_id``, ``task``,
    ``dataset`` (the record's source), ``exact_match`` (1/0 against the gold answer, NaN
    without one), ``pass_at_1`` (1/0 where the record is a HumanEval problem, its tests run by
    the package's harness in a subprocess with ``code_timeout_s`` seconds per problem, NaN
    elsewhere), ``semantic_accuracy``
    (cosine similarity of sentence embeddings with the dataset reference, or with the LLM-only
    output where the record has none), ``semantic_reference`` ("dataset", "llm_only" or
    None), ``similarity_to_llm`` (with the LLM-only output) and ``answer_fidelity`` (same
    final answer as the LLM-only output, :func:`edgespec.scoring.answer_fidelity`).
    """
    n = len(completion_texts)
    if len(records) != n:
        raise ValueError(f"{n} completions but {len(records)} records")
    if reference_texts_llm is not None and len(reference_texts_llm) != n:
        raise ValueError(f"{n} completions but {len(reference_texts_llm)} LLM-only texts")
    texts = [str(t) for t in completion_texts]
    golds = [_field(r, "gold_answer") for r in records]
    exact = [np.nan if v is None else v for v in scoring.exact_match(texts, golds)]
    passed = [np.nan if v is None else v for v in scoring.pass_at_1(texts, records, code_timeout_s)]

    semantic_ref: list[str | None] = []
    source: list[str | None] = []
    for i, r in enumerate(records):
        ref = _field(r, "reference")
        if ref:
            semantic_ref.append(str(ref))
            source.append("dataset")
        elif reference_texts_llm is not None:
            semantic_ref.append(str(reference_texts_llm[i]))
            source.append("llm_only")
        else:
            semantic_ref.append(None)
            source.append(None)
    semantic = np.full(n, np.nan)
    have = [i for i in range(n) if semantic_ref[i] is not None]
    semantic[have] = _cosine([texts[i] for i in have], [semantic_ref[i] for i in have])

    if reference_texts_llm is not None:
        llm = [str(t) for t in reference_texts_llm]
        similarity_llm = _cosine(texts, llm)
        fidelity = np.asarray(scoring.answer_fidelity(texts, llm), dtype=float)
    else:
        similarity_llm = np.full(n, np.nan)
        fidelity = np.full(n, np.nan)
    return pd.DataFrame(
        {
            "prompt_id": [_field(r, "id") for r in records],
            "task": [_field(r, "task") for r in records],
            "dataset": [_field(r, "source") for r in records],
            "exact_match": np.asarray(exact, dtype=float),
            "pass_at_1": np.asarray(passed, dtype=float),
            "semantic_accuracy": semantic,
            "semantic_reference": source,
            "similarity_to_llm": similarity_llm,
            "answer_fidelity": fidelity,
        }
    )


def score_variants(
    outputs: Mapping[str, tuple[Sequence[str], Sequence[int]]],
    records: Sequence[Any],
    max_new_tokens: int,
    answer_marker: str | None,
    code_timeout_s: float = 3.0,
    reference: str = "llm_only",
) -> pd.DataFrame:
    """Every variant's :func:`text_scores` and :func:`budget_columns`, one table with a
    ``variant`` column first; ``outputs`` maps a variant to its completion texts and their
    token counts, aligned with ``records``, and must hold ``reference`` (LLM-only)."""
    if reference not in outputs:
        raise KeyError(f"the reference variant {reference!r} has no completions")
    reference_texts = outputs[reference][0]
    frames = []
    for variant, (texts, lengths) in outputs.items():
        scores = text_scores(texts, records, reference_texts, code_timeout_s)
        for column, values in budget_columns(
            texts, records, lengths, max_new_tokens, answer_marker
        ).items():
            scores[column] = values
        scores.insert(0, "variant", variant)
        frames.append(scores)
    return pd.concat(frames, ignore_index=True)
