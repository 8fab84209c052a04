"""Adapters from the seeds' public datasets to the prompt schema.

GSM8K, Alpaca, Dolly-15k, StrategyQA, CREAK and QED go through ``datasets.load_dataset`` when a
hub is reachable. Each adapter also reads a local copy in the dataset's own published format
(``path=``, config key ``data.datasets.<name>.path``): a JSON Lines file (GSM8K's
``test.jsonl``, Dolly's ``databricks-dolly-15k.jsonl``, CREAK's ``dev.json``), a JSON array
(Alpaca's ``alpaca_data.json``, StrategyQA's ``strategyqa_train.json``), a Parquet file (the
hub's own shards), a folder written by ``datasets.Dataset.save_to_disk``, or a folder of such
files (a hub snapshot) whose names start with the split. Rows from a local copy go through the
same adapter as rows from the hub, so the records are the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
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
    # The hub names the field question; QED's own qed-*.jsonlines release, question_text.
    question = str(row.get("question") or row.get("question_text") or "").strip()
    if not question:
        return None
    question = _cap(question)
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


LOCAL_FORMATS = (".jsonl", ".jsonlines", ".ndjson", ".json", ".parquet")


def _json_rows(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None  # not one JSON document: JSON Lines under a .json name (CREAK's dev.json)
    if data is None:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1:  # {"data": [...]} and the like
            return next(iter(lists.values()))
        lengths = {len(v) for v in data.values() if isinstance(v, list)}
        if lists and len(lists) == len(data) and len(lengths) == 1:  # column-oriented
            columns = list(data.values())
            return [dict(zip(data, row, strict=True)) for row in zip(*columns, strict=True)]
    raise DatasetError(
        f"{path}: expected a JSON array of rows, JSON Lines, or an object holding one list "
        f"of rows; got a {type(data).__name__}"
    )


def _file_rows(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()  # nested fields stay lists and dicts
    if suffix == ".json":
        return _json_rows(path)
    if suffix in LOCAL_FORMATS:
        with path.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    raise DatasetError(
        f"{path}: unknown format '{suffix}'; a local copy is a {', '.join(LOCAL_FORMATS)} file "
        "or a folder written by datasets.Dataset.save_to_disk"
    )


def _folder_rows(folder: Path, split: str) -> list[Any]:
    is_saved = (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()
    if is_saved:
        import datasets as hf_datasets

        saved = hf_datasets.load_from_disk(str(folder))
        if isinstance(saved, hf_datasets.DatasetDict):
            if split not in saved and len(saved) == 1:
                split = next(iter(saved))
            if split not in saved:
                raise DatasetError(
                    f"{folder}: the saved dataset has splits {sorted(saved)}, not '{split}'"
                )
            saved = saved[split]
        return list(saved)
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in LOCAL_FORMATS and p.name.startswith(split)
    )
    if not files:
        raise DatasetError(
            f"{folder}: neither a folder written by datasets.Dataset.save_to_disk nor one "
            f"holding '{split}*' data files ({', '.join(LOCAL_FORMATS)})"
        )
    return [row for p in files for row in _file_rows(p)]


def read_local_rows(path: str | os.PathLike, split: str) -> list[Any]:
    """The rows of a local copy of a dataset in its own published format (see the module)."""
    path = Path(path)
    if path.is_dir():
        return _folder_rows(path, split)
    if not path.is_file():
        raise DatasetError(f"local copy not found: {path}")
    return _file_rows(path)


def load_hub(name: str, path: str | os.PathLike | None = None) -> list[PromptRecord]:
    """Records of hub dataset ``name``: from the hub, or from ``path``, a local copy."""
    adapter = HUB_DATASETS[name]
    if path is not None:
        try:
            rows = read_local_rows(path, adapter.split)
        except DatasetError as err:
            raise DatasetError(f"dataset '{name}': {err}") from err
        except (OSError, ValueError) as err:  # unreadable file, bad JSON or Parquet
            raise DatasetError(
                f"dataset '{name}': cannot read the local copy {path} ({type(err).__name__}: {err})"
            ) from err
        origin = str(path)
    else:
        try:
            import datasets as hf_datasets

            rows = hf_datasets.load_dataset(adapter.hub_id, adapter.config, split=adapter.split)
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
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise DatasetError(
                f"dataset '{name}': row {index} of {origin} is a {type(row).__name__}, "
                "not an object"
            )
        record = adapter.to_record(row, index)
        if record is None:
            continue
        if record.id in seen:
            record = dataclasses.replace(record, id=f"{record.id}-{index}")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise DatasetError(f"dataset '{name}': {origin} gave no usable rows")
    return records
