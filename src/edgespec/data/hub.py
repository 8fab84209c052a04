"""Adapters from the seeds' public datasets to the prompt schema.

GSM8K, Alpaca, Dolly-15k, StrategyQA, CREAK and QED go through ``datasets.load_dataset`` when a
hub is reachable. Each adapter also reads a local copy in the dataset's own published format
(``path=``, config key ``data.datasets.<name>.path``): a JSON Lines file (GSM8K's
``test.jsonl``, Dolly's ``databricks-dolly-15k.jsonl``, CREAK's ``dev.json``), a JSON array
(Alpaca's ``alpaca_data.json``, StrategyQA's ``strategyqa_train.json``), a Parquet file (the
hub's own shards), a folder written by ``datasets.Dataset.save_to_disk``, or a folder of such
files (a hub snapshot) whose names start with the split (``edgespec.data.local_copy``). Rows
from a local copy go through the same adapter as rows from the hub, so the records are the same;
a row without a field its record needs is an error naming the file, the line (or the record)
and the field, never a prompt silently left out.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgespec.data.answers import extract_final_number
from edgespec.data.local_copy import LOCAL_FORMATS, read_local_rows
from edgespec.data.records import TASKS, DatasetError, PromptRecord


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class HubAdapter:
    """Where a hub dataset lives and how one row becomes a PromptRecord; a row without the
    fields the record needs raises :class:`DatasetError` naming the field (never skipped)."""

    hub_id: str
    config: str | None
    split: str
    to_record: Callable[[Mapping[str, Any], int], PromptRecord]


_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")


def _text(row: Mapping[str, Any], *keys: str) -> str:
    """The stripped text of the first of ``keys`` that holds some (a release may name a field
    differently); :class:`DatasetError` naming the field when none does."""
    for key in keys:
        value = row.get(key)
        text = "" if value is None else str(value).strip()
        if text:
            return text
    also = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
    raise DatasetError(f"missing required field '{keys[0]}'{also}")


def _present(row: Mapping[str, Any], key: str) -> str:
    """A field the release always has, which may be empty (a reference answer): its text."""
    if key not in row or row[key] is None:
        raise DatasetError(f"missing required field '{key}'")
    return str(row[key]).strip()


def _gsm8k_row(row: Mapping[str, Any], index: int) -> PromptRecord:
    question, answer = _text(row, "question"), _text(row, "answer")
    gold = extract_final_number(answer)
    if gold is None:
        raise DatasetError("field 'answer' holds no final number (GSM8K ends it '#### <number>')")
    body = _CALC_ANNOTATION.sub("", answer.rsplit("####", 1)[0]).strip()
    reference = f"{body}\nThe answer is {gold}." if body else f"The answer is {gold}."
    return PromptRecord(f"gsm8k-{index:05d}", question, reference, gold, "arithmetic", "gsm8k")


def _instruction_row(source: str, context_key: str, answer_key: str):
    def adapt(row: Mapping[str, Any], index: int) -> PromptRecord:
        instruction = _text(row, "instruction")
        reference = _present(row, answer_key) or None
        context = str(row.get(context_key) or "").strip()
        prompt = f"{instruction}\n\n{context}" if context else instruction
        return PromptRecord(f"{source}-{index:05d}", prompt, reference, None, "instruction", source)

    return adapt


def _yes_no(row: Mapping[str, Any], key: str) -> str:
    """A yes/no field (a bool, or its spelling) as "yes" or "no"."""
    value = row.get(key)
    if value is None:
        raise DatasetError(f"missing required field '{key}'")
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return "yes"
    if text in ("false", "no", "0"):
        return "no"
    raise DatasetError(f"field '{key}' must be true/false or yes/no, got {value!r}")


def _strategyqa_row(row: Mapping[str, Any], index: int) -> PromptRecord:
    question, gold = _text(row, "question"), _yes_no(row, "answer")
    facts = row.get("facts")
    if isinstance(facts, (list, tuple)):
        facts = " ".join(str(f).strip() for f in facts if str(f).strip())
    reference = f"{_cap(gold)}. {facts}".strip() if facts else _cap(gold) + "."
    rid = str(row.get("qid") or f"{index:05d}")
    return PromptRecord(
        f"strategyqa-{rid}", f"{question} Answer yes or no.", reference, gold, "yesno", "strategyqa"
    )


def _creak_row(row: Mapping[str, Any], index: int) -> PromptRecord:
    sentence, gold = _text(row, "sentence"), _yes_no(row, "label")
    explanation = str(row.get("explanation") or "").strip()
    reference = f"{_cap(gold)}. {explanation}".strip()
    rid = str(row.get("ex_id") or f"{index:05d}")
    prompt = f'Is the following claim true? "{sentence}" Answer yes or no.'
    return PromptRecord(f"creak-{rid}", prompt, reference, gold, "yesno", "creak")


def _qed_row(row: Mapping[str, Any], index: int) -> PromptRecord:
    # The hub names the field question; QED's own qed-*.jsonlines release, question_text.
    question = _cap(_text(row, "question", "question_text"))
    if not question.endswith("?"):
        question += "?"
    gold = None
    answers = list(row.get("original_nq_answers") or [])
    if answers and isinstance(answers[0], list | tuple):  # the release nests one list per rater
        answers = [a for group in answers for a in group]
    for answer in answers:
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
        raise DatasetError(
            "missing required field 'original_nq_answers' (or 'annotation.selected_sentence'): "
            "the record has no answer"
        )
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


def load_hub(name: str, path: str | os.PathLike | None = None) -> list[PromptRecord]:
    """Records of hub dataset ``name``: from the hub, or from ``path``, a local copy.

    Every row becomes a record or stops the load: a row without a field the record needs
    raises :class:`DatasetError` naming the dataset, the file and line (or the record index)
    and the field; none is skipped."""
    adapter = HUB_DATASETS[name]
    if path is not None:
        try:
            rows = read_local_rows(path, adapter.split)
        except DatasetError as err:
            raise DatasetError(f"dataset '{name}': {err}") from err
        except (OSError, ValueError) as err:  # unreadable file, bad Parquet
            raise DatasetError(
                f"dataset '{name}': cannot read the local copy {path} ({type(err).__name__}: {err})"
            ) from err
        origin = str(path)
    else:
        try:
            import datasets as hf_datasets

            hub_rows = hf_datasets.load_dataset(adapter.hub_id, adapter.config, split=adapter.split)
        except Exception as err:  # offline: ConnectionError, OSError, hub client errors, ...
            raise DatasetError(
                f"dataset '{name}': could not load {adapter.hub_id}"
                f"{f' ({adapter.config})' if adapter.config else ''} split '{adapter.split}' "
                f"through datasets.load_dataset ({type(err).__name__}: {err}). The Hugging Face "
                "hub is probably unreachable from here. Give a local copy in the dataset's own "
                f"format with path=<file or folder> (config key data.datasets.<name>.path: "
                f"{', '.join(LOCAL_FORMATS)}, or a save_to_disk folder), or the data converted "
                f"to the prompt schema with source 'jsonl' and path=<file> ({SCHEMA_HINT})."
            ) from err
        origin = adapter.hub_id
        where = f"{adapter.hub_id} (split '{adapter.split}'), record"
        rows = [(f"{where} {index}", row) for index, row in enumerate(hub_rows)]
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for index, (where, row) in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DatasetError(f"dataset '{name}': {where}: a {type(row).__name__}, not an object")
        try:
            record = adapter.to_record(row, index)
        except DatasetError as err:
            raise DatasetError(f"dataset '{name}': {where}: {err}") from err
        if record.id in seen:
            record = dataclasses.replace(record, id=f"{record.id}-{index}")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise DatasetError(f"dataset '{name}': {origin} holds no rows")
    return records
