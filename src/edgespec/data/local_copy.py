"""Rows of a local copy of a hub dataset, in its own published format, each with where it is.

A local copy is a JSON Lines file (GSM8K's ``test.jsonl``, Dolly's
``databricks-dolly-15k.jsonl``, CREAK's ``dev.json``), a JSON array or an object holding one
(Alpaca's ``alpaca_data.json``, StrategyQA's ``strategyqa_train.json``), a Parquet file (the
hub's own shards), a folder written by ``datasets.Dataset.save_to_disk``, or a folder of such
files (a hub snapshot) whose names start with the split. :func:`read_local_rows` gives every
row with its place (``<file>, line 7`` for a line-per-row file, ``<file>, record 6`` for the
rest, counted from 0 as the hub's rows are), so an adapter's error names the record it stops
at; a line that is not JSON (a file cut short) is named by its own line number, and a JSON
document cut short by the line where it breaks off.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgespec.data.records import DatasetError

LOCAL_FORMATS = (".jsonl", ".jsonlines", ".ndjson", ".json", ".parquet")

Located = list[tuple[str, Any]]
"""Rows with their places: (``"<file>, line 3"`` or ``"<file>, record 2"``, row)."""


class _BadLine(DatasetError):
    def __init__(self, path: Path, lineno: int, err: json.JSONDecodeError):
        super().__init__(
            f"{path}, line {lineno}: not valid JSON ({err.msg} at column {err.colno}); "
            "is the file cut short?"
        )
        self.lineno = lineno


def _json_lines(path: Path, lines: list[str]) -> Located:
    rows = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}, line {lineno}", json.loads(line)))
        except json.JSONDecodeError as err:
            raise _BadLine(path, lineno, err) from err
    return rows


def _records(path: Path, rows: list[Any]) -> Located:
    return [(f"{path}, record {index}", row) for index, row in enumerate(rows)]


def _json_rows(path: Path) -> Located:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as whole:
        lines = text.splitlines()
        try:  # not one JSON document: JSON Lines under a .json name (CREAK's dev.json)
            return _json_lines(path, lines)
        except _BadLine as bad:
            first = next(n for n, line in enumerate(lines, start=1) if line.strip())
            if bad.lineno > first:
                raise  # JSON Lines whose first rows parsed: this line is broken
            # one JSON document (an array over many lines) broken off where it ends
            raise DatasetError(
                f"{path}, line {whole.lineno}: not valid JSON ({whole.msg} at column "
                f"{whole.colno}); is the file cut short?"
            ) from whole
    if isinstance(data, list):
        return _records(path, data)
    if isinstance(data, dict):
        lists = {k: v for k, v in data.items() if isinstance(v, list)}
        if len(lists) == 1:  # {"data": [...]} and the like
            return _records(path, next(iter(lists.values())))
        lengths = {len(v) for v in data.values() if isinstance(v, list)}
        if lists and len(lists) == len(data) and len(lengths) == 1:  # column-oriented
            columns = list(data.values())
            rows = [dict(zip(data, row, strict=True)) for row in zip(*columns, strict=True)]
            return _records(path, rows)
    raise DatasetError(
        f"{path}: expected a JSON array of rows, JSON Lines, or an object holding one list "
        f"of rows; got a {type(data).__name__}"
    )


def _file_rows(path: Path) -> Located:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return _records(path, pq.read_table(path).to_pylist())  # nested fields stay nested
    if suffix == ".json":
        return _json_rows(path)
    if suffix in LOCAL_FORMATS:
        return _json_lines(path, path.read_text(encoding="utf-8").splitlines())
    raise DatasetError(
        f"{path}: unknown format '{suffix}'; a local copy is a {', '.join(LOCAL_FORMATS)} file "
        "or a folder written by datasets.Dataset.save_to_disk"
    )


def _folder_rows(folder: Path, split: str) -> Located:
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
        return [(f"{folder} (split '{split}'), record {i}", row) for i, row in enumerate(saved)]
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
    return [located for p in files for located in _file_rows(p)]


def read_local_rows(path: str | os.PathLike, split: str) -> Located:
    """The rows of a local copy (see the module), each with its place in the copy; ``split``
    picks the data files of a snapshot folder or the split of a saved DatasetDict."""
    path = Path(path)
    if path.is_dir():
        return _folder_rows(path, split)
    if not path.is_file():
        raise DatasetError(f"local copy not found: {path}")
    return _file_rows(path)
