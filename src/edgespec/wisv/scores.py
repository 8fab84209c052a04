"""Text scores of WISV completions (methods §6): exact match, answer fidelity to vanilla SD,
semantic accuracy; one row per prompt, computed once per decoded completions file so that the
evaluation jobs stay torch-free."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec import scoring

SCORE_COLUMNS = (
    "prompt_id",
    "task",
    "exact_match",
    "answer_fidelity",
    "semantic_accuracy",
    "identical_to_vanilla",
)


def _field(record, name: str):
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def text_scores(
    completion_texts: Sequence[str],
    records: Sequence[Any],
    vanilla_texts: Sequence[str],
    similarity=None,
) -> pd.DataFrame:
    """Per-prompt scores of one decoded WISV run (``SCORE_COLUMNS``).

    ``records`` (``PromptRecord`` or mappings with id, task, reference, gold_answer) align with
    ``completion_texts`` and with ``vanilla_texts``, vanilla SD's outputs of the same prompts.
    exact_match: 1/0 against the gold answer (NaN without one); answer_fidelity: the same final
    answer as vanilla SD (``scoring.answer_fidelity``); semantic_accuracy: cosine similarity
    (``similarity``, default the MiniLM ``scoring.semantic_similarity``) with the dataset
    reference, or with vanilla SD's output where the record has none; identical_to_vanilla:
    1/0.
    """
    n = len(completion_texts)
    if len(records) != n or len(vanilla_texts) != n:
        raise ValueError(f"{n} completions, {len(records)} records, {len(vanilla_texts)} vanilla")
    similarity = similarity or scoring.semantic_similarity
    texts = [str(t) for t in completion_texts]
    vanilla = [str(t) for t in vanilla_texts]
    golds = [_field(r, "gold_answer") for r in records]
    exact = [np.nan if v is None else v for v in scoring.exact_match(texts, golds)]
    refs = [str(_field(r, "reference") or v) for r, v in zip(records, vanilla, strict=True)]
    return pd.DataFrame(
        {
            "prompt_id": [_field(r, "id") for r in records],
            "task": [_field(r, "task") for r in records],
            "exact_match": np.asarray(exact, dtype=float),
            "answer_fidelity": np.asarray(scoring.answer_fidelity(texts, vanilla), dtype=float),
            "semantic_accuracy": np.asarray(similarity(texts, refs), dtype=float)
            if n
            else np.zeros(0),
            "identical_to_vanilla": np.asarray(
                [float(a == b) for a, b in zip(texts, vanilla, strict=True)]
            ),
        },
        columns=list(SCORE_COLUMNS),
    )
