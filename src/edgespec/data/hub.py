"""Adapters from the seeds' public datasets to the prompt schema.

GSM8K, Alpaca, Dolly-15k, StrategyQA, CREAK and QED go through ``datasets.load_dataset`` when a
hub is reachable; without one a ``DatasetError`` says how to give the same data as a local
JSONL file instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgespec.data.answers import extract_final_number
from edgespec.data.records import TASKS, DatasetError, PromptRecord


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class HubAdapter:
    """Where a hub dataset lives and how one row becomes a PromptRecord (None skips the row)."""

    hub_id: str
    config: str | None
    split: str
    to_record: Callable[[Mapping[str, Any], int], PromptRecord | None]


_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")


def _gsm8k_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    answer = str(row.get("answer") or "")
    gold = extract_final_number(answer)
    if not row.get("question") or gold is None:
        return None
    body = _CALC_ANNOTATION.sub("", answer.rsplit("####", 1)[0]).strip()
    reference = f"{body}\nThe answer is {gold}." if body else f"The answer is {gold}."
    return PromptRecord(
        f"gsm8k-{index:05d}", row["question"].strip(), reference, gold, "arithmetic", "gsm8k"
    )


def _instruction_row(source: str, context_key: str, answer_key: str):
    def adapt(row: Mapping[str, Any], index: int) -> PromptRecord | None:
        instruction = str(row.get("instruction") or "").strip()
        if not instruction:
            return None
        context = str(row.get(context_key) or "").strip()
        prompt = f"{instruction}\n\n{context}" if context else instruction
        reference = str(row.get(answer_key) or "").strip() or None
        return PromptRecord(f"{source}-{index:05d}", prompt, reference, None, "instruction", source)

    return adapt


def _yes_no(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return "yes"
    if text in ("false", "no", "0"):
        return "no"
    return None


def _strategyqa_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    question = str(row.get("question") or "").strip()
    gold = _yes_no(row.get("answer"))
    if not question or gold is None:
        return None
    facts = row.get("facts")
    if isinstance(facts, (list, tuple)):
        facts = " ".join(str(f).strip() for f in facts if str(f).strip())
    reference = f"{_cap(gold)}. {facts}".strip() if facts else _cap(gold) + "."
    rid = str(row.get("qid") or f"{index:05d}")
    return PromptRecord(
        f"strategyqa-{rid}", f"{question} Answer yes or no.", reference, gold, "yesno", "strategyqa"
    )


def _creak_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    sentence = str(row.get("sentence") or "").strip()
    gold = _yes_no(row.get("label"))
    if not sentence or gold is None:
        return None
    explanation = str(row.get("explanation") or "").strip()
    reference = f"{_cap(gold)}. {explanation}".strip()
    rid = str(row.get("ex_id") or f"{index:05d}")
    prompt = f'Is the following claim true? "{sentence}" Answer yes or no.'
    return PromptRecord(f"creak-{rid}", prompt, reference, gold, "yesno", "creak")


def _qed_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    question = str(row.get("question") or "").strip()
    if not question:
        return None
    question = _cap(question)
    if not question.endswith("?"):
        question += "?"
    gold = None
    for answer in row.get("original_nq_answers") or []:
        text = str(answer.get("string") if isinstance(answer, Mapping) else answer).strip()
        if text:
            gold = text
            break
    annotation = row.get("annotation") or {}
    selected = annotation.get("selected_sentence") if isinstance(annotation, Mapping) else None
    reference = None
    if isinstance(selected, Mapping):
        reference = str(selected.get("string") or "").strip() or None
    if gold is None and reference is None:
        return None
    rid = str(row.get("example_id") or f"{index:05d}")
    return PromptRecord(f"qed-{rid}", question, reference or gold, gold, "qa", "qed")


HUB_DATASETS: dict[str, HubAdapter] = {
    "gsm8k": HubAdapter("openai/gsm8k", "main", "test", _gsm8k_row),
    "alpaca": HubAdapter(
        "tatsu-lab/alpaca", None, "train", _instruction_row("alpaca", "input", "output")
    ),
    "dolly": HubAdapter(
        "databricks/databricks-dolly-15k",
        None,
        "train",
        _instruction_row("dolly", "context", "response"),
    ),
    "strategyqa": HubAdapter("ChilleD/StrategyQA", None, "test", _strategyqa_row),
    "creak": HubAdapter("amydeng2000/CREAK", None, "validation", _creak_row),
    "qed": HubAdapter("google-research-datasets/qed", None, "validation", _qed_row),
}

SCHEMA_HINT = (
    "one JSON object per line with fields id, prompt, reference (or null), gold_answer "
    f"(or null), task ({', '.join(TASKS)}) and source"
)


def load_hub(name: str) -> list[PromptRecord]:
    adapter = HUB_DATASETS[name]
    try:
        import datasets as hf_datasets

        rows = hf_datasets.load_dataset(adapter.hub_id, adapter.config, split=adapter.split)
    except Exception as err:  # offline: ConnectionError, OSError, hub client errors, ...
        raise DatasetError(
            f"dataset '{name}': could not load {adapter.hub_id}"
            f"{f' ({adapter.config})' if adapter.config else ''} split '{adapter.split}' "
            f"through datasets.load_dataset ({type(err).__name__}: {err}). The Hugging Face "
            "hub is probably unreachable from here. Give the same data as a local JSONL file "
            f"instead, with name 'jsonl' and path=<file> ({SCHEMA_HINT})."
        ) from err
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        record = adapter.to_record(row, index)
        if record is None:
            continue
        if record.id in seen:
            record = dataclasses.replace(record, id=f"{record.id}-{index}")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise DatasetError(f"dataset '{name}': {adapter.hub_id} gave no usable rows")
    return records
