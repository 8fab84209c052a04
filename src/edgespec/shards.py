"""Which datasets a model job decodes, and its outputs joined into what later stages read.

The heavy model stages (``decode_cuhlm``, ``mine_labels``) run one job per *shard*: a dataset
of at least one batch of prompts is a shard of its own, so that a cluster schedules datasets in
parallel and a retry redoes one dataset; consecutive datasets smaller than a batch share a
shard (:func:`pack_datasets`), because every model job pays a fixed cost (start-up, loading the
pair) and a batch that is not full costs nearly as much as one that is. The stages after them
read every dataset at once. Shards are joined in the order given (datasets sorted by name, the
order a single job used to read them in), rows and arrays alike, so the row ``i`` of a joined
table still belongs with row ``i`` of its joined hidden states; a shard's JSON summary of
counts is joined by summing them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from edgespec.artifacts import atomic_path, read_json, write_json, write_npz, write_parquet

SHARD_JOINER = "+"
"""Joins the names of the datasets a shard holds into the shard's name (a path component)."""


def pack_datasets(sizes: Mapping[str, int | None], batch_size: int) -> dict[str, list[str]]:
    """Shards of consecutive datasets (in the order of ``sizes``): name -> datasets.

    ``sizes`` gives the prompts each dataset brings to the stage (None where unknown). A
    dataset of at least ``batch_size`` prompts, or of unknown size, is a shard alone; smaller
    ones are gathered in order until together they fill a batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    shards: dict[str, list[str]] = {}
    pending: list[str] = []
    rows = 0

    def close() -> None:
        nonlocal pending, rows
        if pending:
            shards[SHARD_JOINER.join(pending)] = pending
        pending, rows = [], 0

    for name, size in sizes.items():
        if SHARD_JOINER in name:
            raise ValueError(f"dataset name {name!r} contains {SHARD_JOINER!r}")
        if size is None or size >= batch_size:
            close()
            shards[name] = [name]
            continue
        pending.append(name)
        rows += size
        if rows >= batch_size:
            close()
    close()
    return shards


def join_parquet(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> pd.DataFrame:
    """Row-wise concatenation of Parquet tables (same columns), index reset; ``attrs`` that
    every shard shares are kept."""
    frames = [pd.read_parquet(p) for p in paths]
    if not frames:
        raise ValueError(f"{out}: no shards to join")
    columns = list(frames[0].columns)
    for path, frame in zip(paths, frames, strict=True):
        if list(frame.columns) != columns:
            raise ValueError(f"{path}: columns {list(frame.columns)} differ from {columns}")
    nonempty = [f for f in frames if len(f)] or frames[:1]  # concat warns on empty frames
    joined = pd.concat(nonempty, ignore_index=True)
    joined.attrs = dict(frames[0].attrs) if all(f.attrs == frames[0].attrs for f in frames) else {}
    write_parquet(joined, out)
    return joined


def join_lines(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> None:
    """Concatenate text files of one record per line (JSONL) in order."""
    with atomic_path(out) as tmp, open(tmp, "wb") as dst:
        for path in paths:
            text = Path(path).read_bytes()
            dst.write(text if not text or text.endswith(b"\n") else text + b"\n")


def join_npz(paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> dict[str, np.ndarray]:
    """Concatenate each array of several ``.npz`` files along the first axis (same keys)."""
    shards = []
    for path in paths:
        with np.load(path) as data:
            shards.append({key: data[key] for key in data.files})
    if not shards:
        raise ValueError(f"{out}: no shards to join")
    keys = sorted(shards[0])
    for path, shard in zip(paths, shards, strict=True):
        if sorted(shard) != keys:
            raise ValueError(f"{path}: arrays {sorted(shard)} differ from {keys}")
    joined = {key: np.concatenate([s[key] for s in shards], axis=0) for key in keys}
    write_npz(out, **joined)
    return joined


def _sum_summaries(shards: Sequence[tuple[str, dict]], settings: frozenset[str], where: str):
    first_path, first = shards[0]
    joined = {}
    for key, value in first.items():
        name = f"{where}{key}"
        values = []
        for path, shard in shards:
            if key not in shard:
                raise ValueError(f"{path}: key {name!r} is missing (it is in {first_path})")
            values.append(shard[key])
        if isinstance(value, dict) and key not in settings:
            joined[key] = _sum_summaries(
                [(p, v) for (p, _), v in zip(shards, values, strict=True)], settings, f"{name}."
            )
        elif (
            key not in settings
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        ):
            joined[key] = sum(values)
        else:
            for (path, _), other in zip(shards, values, strict=True):
                if other != value:
                    raise ValueError(
                        f"{path}: {name} = {other!r} differs from {value!r} in {first_path}: "
                        "shards of one run must share their settings"
                    )
            joined[key] = value
    for path, shard in shards[1:]:
        extra = sorted(set(shard) - set(first))
        if extra:
            raise ValueError(f"{path}: keys {extra} are not in {first_path}")
    return joined


def join_summaries(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    settings: Sequence[str] = (),
) -> dict:
    """One JSON summary of several shards' summaries (same keys): numbers are counts or
    seconds and are summed, nested objects key by key; ``settings`` (key names, at any level)
    and every other value must be equal in every shard and are kept once."""
    shards = [(str(path), read_json(path)) for path in paths]
    if not shards:
        raise ValueError(f"{out}: no shards to join")
    joined = _sum_summaries(shards, frozenset(settings), "")
    write_json(joined, out)
    return joined


def join_shards(
    paths: Sequence[str | os.PathLike], out: str | os.PathLike, settings: Sequence[str] = ()
) -> None:
    """Join by the output's file type: ``.parquet``, ``.npz``, ``.json`` (a summary, see
    :func:`join_summaries`; ``settings`` are its keys that are not summed) or line-per-record
    text."""
    suffix = Path(out).suffix
    if suffix == ".parquet":
        join_parquet(paths, out)
    elif suffix == ".npz":
        join_npz(paths, out)
    elif suffix == ".json":
        join_summaries(paths, out, settings)
    else:
        join_lines(paths, out)
