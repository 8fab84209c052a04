"""The prompt schema and its JSONL I/O.

Every record has ``id`` (str, unique within a dataset), ``prompt`` (non-empty str),
``reference`` (str or null: a reference answer text), ``gold_answer`` (str or null: a final
answer that can be checked exactly), ``task`` (one of :data:`TASKS`) and ``source`` (the dataset
name). The prepare step adds ``split`` ("calib", "train" or "eval"), see
``edgespec.data.prepare.assign_splits``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.artifacts import default_file_mode
from edgespec.data.answers import NUMERIC_GOLD

TASKS = ("arithmetic", "instruction", "qa", "yesno", "code")
SPLITS = ("calib", "train", "eval")
EMBEDDED = ("instructions", "arithmetic", "humaneval")
REQUIRED_FIELDS = ("id", "prompt", "task", "source")
NULLABLE_FIELDS = ("reference", "gold_answer", "split")  # may be absent (read as null)
ALL_FIELDS = REQUIRED_FIELDS[:2] + ("reference", "gold_answer") + REQUIRED_FIELDS[2:] + ("split",)

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3] / "data"
INSTRUCTIONS_FILE = "instructions.jsonl"


class DatasetError(ValueError):
    """A dataset cannot be loaded or a record is invalid; the message says where and why."""


@dataclass(frozen=True)
class PromptRecord:
    id: str
    prompt: str
    reference: str | None
    gold_answer: str | None
    task: str
    source: str
    split: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ALL_FIELDS}


def validate_record(obj: Any, where: str) -> PromptRecord:
    """Check one decoded JSON object against the schema; ``where`` prefixes every error."""
    if not isinstance(obj, Mapping):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(ALL_FIELDS))
    if unknown:
        raise DatasetError(
            f"{where}: unknown field(s) {', '.join(repr(u) for u in unknown)}; "
            f"allowed fields are {', '.join(ALL_FIELDS)}"
        )
    for field in REQUIRED_FIELDS:
        if field not in obj:
            raise DatasetError(f"{where}: missing required field '{field}'")
        value = obj[field]
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(
                f"{where}: field '{field}' must be a non-empty string, got {value!r}"
            )
    for field in NULLABLE_FIELDS:
        value = obj.get(field)
        if value is not None and not isinstance(value, str):
            raise DatasetError(
                f"{where}: field '{field}' must be a string or null, got {type(value).__name__}"
            )
    task = obj["task"]
    if task not in TASKS:
        raise DatasetError(f"{where}: field 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    split = obj.get("split")
    if split is not None and split not in SPLITS:
        raise DatasetError(
            f"{where}: field 'split' must be one of {', '.join(SPLITS)} or null, got {split!r}"
        )
    gold = obj.get("gold_answer")
    if gold is not None:
        if not gold.strip():
            raise DatasetError(f"{where}: field 'gold_answer' must be null or a non-empty string")
        if task == "arithmetic" and not NUMERIC_GOLD.match(gold.strip()):
            raise DatasetError(
                f"{where}: field 'gold_answer' of an arithmetic record must be a plain number "
                f"such as '42' or '-3.5', got {gold!r}"
            )
        if task == "yesno" and gold.strip().lower() not in ("yes", "no"):
            raise DatasetError(
                f"{where}: field 'gold_answer' of a yesno record must be 'yes' or 'no', "
                f"got {gold!r}"
            )
    return PromptRecord(
        id=obj["id"],
        prompt=obj["prompt"],
        reference=obj.get("reference"),
        gold_answer=gold,
        task=task,
        source=obj["source"],
        split=split,
    )


def read_jsonl(path: str | os.PathLike, dataset: str | None = None) -> list[PromptRecord]:
    """Read and validate a JSONL file in the schema; blank lines are skipped.

    Errors name the dataset (when given), the file, the 1-based line number and the field.
    """
    path = Path(path)
    label = f"dataset '{dataset}', " if dataset else ""
    if not path.is_file():
        raise DatasetError(f"{label}file not found: {path}")
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{label}{path}, line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{where}: invalid JSON ({err.msg})") from err
            record = validate_record(obj, where)
            if record.id in seen:
                raise DatasetError(
                    f"{where}: field 'id' value {record.id!r} repeats the id on line "
                    f"{seen[record.id]}; ids must be unique within a dataset"
                )
            seen[record.id] = lineno
            records.append(record)
    return records


def write_jsonl(records: Iterable[PromptRecord], path: str | os.PathLike) -> None:
    """Write records as JSONL atomically (a temp file in the same folder, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, default_file_mode())  # mkstemp's 0600 would hide it from the group
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
