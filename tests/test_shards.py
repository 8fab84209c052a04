"""Shards of the model stages: which datasets share a job, and their outputs joined back into the
artifacts later stages read."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pandas as pd
import pytest

from edgespec.artifacts import write_json, write_npz, write_parquet
from edgespec.shards import join_shards, pack_datasets


def test_small_datasets_are_packed_in_order_until_they_fill_a_batch():
    sizes = {"a": 8, "b": 8, "c": 3, "d": 40, "e": 2, "f": None, "g": 5, "h": 5, "i": 9}
    assert pack_datasets(sizes, batch_size=16) == {
        "a+b": ["a", "b"],  # 16: a full batch
        "c": ["c"],  # closed early by the large dataset after it
        "d": ["d"],  # a batch or more: alone
        "e": ["e"],
        "f": ["f"],  # size unknown: alone
        "g+h+i": ["g", "h", "i"],  # 19 >= 16
    }
    assert pack_datasets({"a": 8, "b": 8}, batch_size=8) == {"a": ["a"], "b": ["b"]}
    assert pack_datasets({"a": 3, "b": 2}, batch_size=16) == {"a+b": ["a", "b"]}
    assert pack_datasets({}, batch_size=4) == {}
    with pytest.raises(ValueError, match="batch_size"):
        pack_datasets({"a": 1}, batch_size=0)
    with pytest.raises(ValueError, match="contains"):
        pack_datasets({"a+b": 1}, batch_size=4)


def test_tables_and_hidden_states_join_in_order_row_for_row(tmp_path):
    tables, hidden = [], []
    for i, rows in enumerate((3, 0, 2)):  # a dataset without mismatches is joined too
        frame = pd.DataFrame({"prompt_id": [f"d{i}-{r}" for r in range(rows)], "step": range(rows)})
        frame = frame.astype({"step": "int64"})
        frame.attrs = {"k_grid": [1, 2]}
        write_parquet(frame, tmp_path / f"t{i}.parquet")
        write_npz(
            tmp_path / f"h{i}.npz",
            draft=np.full((rows, 4), i, np.float16),
            target=np.full((rows, 5), i, np.float16),
        )
        tables.append(tmp_path / f"t{i}.parquet")
        hidden.append(tmp_path / f"h{i}.npz")
    join_shards(tables, tmp_path / "all.parquet")
    join_shards(hidden, tmp_path / "all.npz")
    joined = pd.read_parquet(tmp_path / "all.parquet")
    assert list(joined["prompt_id"]) == ["d0-0", "d0-1", "d0-2", "d2-0", "d2-1"]
    assert list(joined.index) == list(range(5)) and joined.attrs == {"k_grid": [1, 2]}
    with np.load(tmp_path / "all.npz") as arrays:
        assert arrays["draft"].shape == (5, 4) and arrays["target"].shape == (5, 5)
        assert list(arrays["draft"][:, 0]) == [0, 0, 0, 2, 2]  # row i stays with table row i


def test_completion_files_join_line_for_line(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"c{i}.jsonl"
        text = "".join(json.dumps({"prompt_id": f"p{i}-{j}"}) + "\n" for j in range(i))
        path.write_text(text if i != 2 else text.rstrip("\n"))  # last line without newline
        paths.append(path)
    old = os.umask(0o022)
    try:
        join_shards(paths, tmp_path / "all.jsonl")
    finally:
        os.umask(old)
    lines = (tmp_path / "all.jsonl").read_text().splitlines()
    assert [json.loads(x)["prompt_id"] for x in lines] == ["p1-0", "p2-0", "p2-1"]
    assert stat.S_IMODE((tmp_path / "all.jsonl").stat().st_mode) == 0o644


def test_shards_that_do_not_match_are_refused(tmp_path):
    write_parquet(pd.DataFrame({"a": [1]}), tmp_path / "a.parquet")
    write_parquet(pd.DataFrame({"b": [1]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"b\.parquet: columns \['b'\] differ"):
        join_shards([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "all.parquet")
    assert not (tmp_path / "all.parquet").exists()


def test_artifacts_get_the_usual_permissions(tmp_path):
    """Every writer that goes through a temporary file (mkstemp makes it 0600)."""
    from edgespec.data.records import PromptRecord, write_jsonl
    from edgespec.wisv.head import DecisionHead, save_head

    old = os.umask(0o002)  # a group-writable project folder
    try:
        write_json({"x": 1}, tmp_path / "a.json")
        write_parquet(pd.DataFrame({"a": [1]}), tmp_path / "a.parquet")
        write_npz(tmp_path / "a.npz", x=np.zeros(2))
        write_jsonl([PromptRecord("a-1", "Hi?", None, None, "qa", "t")], tmp_path / "a.jsonl")
        save_head(DecisionHead(3, 3), tmp_path / "a.pt", {"tau": 0.5})
    finally:
        os.umask(old)
    for name in ("a.json", "a.parquet", "a.npz", "a.jsonl", "a.pt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o664, name


def test_label_summaries_join_by_summing_counts_and_keeping_settings(tmp_path):
    """mine_labels runs per dataset: the joined summary is what one job over all would say."""
    shards = [
        {
            "prompts": 3,
            "mismatches": 7,
            "criterion": {"answer": 2, "similarity": 5},
            "label_max_new_tokens": 64,
            "seconds": 1.5,
        },
        {
            "prompts": 2,
            "mismatches": 0,
            "criterion": {"answer": 0, "similarity": 0},
            "label_max_new_tokens": 64,
            "seconds": 0.25,
        },
    ]
    paths = []
    for i, shard in enumerate(shards):
        write_json(shard, tmp_path / f"s{i}.json")
        paths.append(tmp_path / f"s{i}.json")
    join_shards(paths, tmp_path / "all.json", settings=["label_max_new_tokens"])
    joined = json.loads((tmp_path / "all.json").read_text())
    assert joined == {
        "prompts": 5,
        "mismatches": 7,
        "criterion": {"answer": 2, "similarity": 5},
        "label_max_new_tokens": 64,  # a setting: kept, not summed to 128
        "seconds": 1.75,
    }


def test_summaries_with_different_settings_are_refused(tmp_path):
    write_json({"n": 1, "label_max_new_tokens": 64, "marker": "####"}, tmp_path / "a.json")
    write_json({"n": 2, "label_max_new_tokens": 32, "marker": "####"}, tmp_path / "b.json")
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    with pytest.raises(ValueError, match=r"b\.json: label_max_new_tokens = 32 differs from 64"):
        join_shards(paths, tmp_path / "all.json", settings=["label_max_new_tokens"])
    write_json({"n": 2, "label_max_new_tokens": 64, "marker": "ANSWER"}, tmp_path / "b.json")
    with pytest.raises(ValueError, match=r"b\.json: marker = 'ANSWER' differs"):  # strings too
        join_shards(paths, tmp_path / "all.json", settings=["label_max_new_tokens"])
    write_json({"m": 2, "label_max_new_tokens": 64, "marker": "####"}, tmp_path / "b.json")
    with pytest.raises(ValueError, match=r"b\.json: key 'n' is missing"):
        join_shards(paths, tmp_path / "all.json", settings=["label_max_new_tokens"])
    assert not (tmp_path / "all.json").exists()
