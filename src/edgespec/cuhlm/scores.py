"""Text-level scores of CU-HLM completions (methods §6): exact match, semantic accuracy,
fidelity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from edgespec import scoring


def _field(record, name: str):
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _cosine(texts: Sequence[str], references: Sequence[str]) -> np.ndarray:
    if not texts:
        return np.zeros(0)
    a, b = scoring.embed(list(texts)), scoring.embed(list(references))
    return (a * b).sum(-1).to(torch.float64).numpy()


def text_scores(
    completion_texts: Sequence[str],
    records: Sequence[Any],
    reference_texts_llm: Sequence[str] | None,
) -> pd.DataFrame:
    """Per-prompt text scores of one variant (methods §6), one row per completion.

    ``records`` (:class:`edgespec.data.records.PromptRecord` or mappings with ``id``, ``task``,
    ``reference``, ``gold_answer``) align with ``completion_texts``; ``reference_texts_llm``
    are the LLM-only outputs of the same prompts (None: the columns that need them are NaN,
    e.g. when scoring LLM-only against itself is pointless). Columns: ``prompt_id``, ``task``,
    ``exact_match`` (1/0 against the gold answer, NaN without one), ``semantic_accuracy``
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
            "exact_match": np.asarray(exact, dtype=float),
            "semantic_accuracy": semantic,
            "semantic_reference": source,
            "similarity_to_llm": similarity_llm,
            "answer_fidelity": fidelity,
        }
    )
