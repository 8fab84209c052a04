"""Prompt datasets: schema validation, embedded sets, generated arithmetic, answers, splits."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import datasets as hf_datasets
import numpy as np
import pytest

from edgespec.config import ConfigError, check_local_copies
from edgespec.data import records as ds
from edgespec.data.answers import answers_match, extract_final_number
from edgespec.data.arithmetic import generate_arithmetic, generate_arithmetic_problems
from edgespec.data.chat import chat_token_ids
from edgespec.data.hub import HUB_DATASETS
from edgespec.data.prepare import assign_splits, load_records, split_sizes
from edgespec.data.records import EMBEDDED, DatasetError, PromptRecord, read_jsonl, write_jsonl

GOOD = {
    "id": "a-1",
    "prompt": "What is 2 + 2?",
    "reference": "2 + 2 = 4. The answer is 4.",
    "gold_answer": "4",
    "task": "arithmetic",
    "source": "mine",
}


def _write_lines(path: Path, objs) -> Path:
    lines = [o if isinstance(o, str) else json.dumps(o) for o in objs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "prompt"}, "prompt"),
        ({**GOOD, "prompt": "   "}, "prompt"),
        ({**GOOD, "id": 7}, "id"),
        ({**GOOD, "task": "poetry"}, "task"),
        ({**GOOD, "reference": ["x"]}, "reference"),
        ({**GOOD, "gold_answer": "four"}, "gold_answer"),
        ({**GOOD, "task": "yesno", "gold_answer": "maybe"}, "gold_answer"),
        ({**GOOD, "split": "test"}, "split"),
        ({**GOOD, "gold": "4"}, "gold"),
        ({k: v for k, v in GOOD.items() if k != "source"}, "source"),
    ],
)
def test_validation_error_names_field_and_line(tmp_path, bad, field):
    path = _write_lines(tmp_path / "mine.jsonl", [GOOD | {"id": "a-0"}, "", bad])
    with pytest.raises(DatasetError) as info:
        load_records("jsonl", 10, np.random.default_rng(0), path=str(path))
    message = str(info.value)
    assert "line 3" in message
    assert f"'{field}'" in message
    assert str(path) in message
    assert "jsonl" in message


def test_invalid_json_and_duplicate_ids_name_the_line(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [GOOD, "{not json"])
    with pytest.raises(DatasetError, match=r"line 2: invalid JSON"):
        read_jsonl(path)
    path = _write_lines(tmp_path / "y.jsonl", [GOOD, GOOD])
    with pytest.raises(DatasetError, match=r"line 2: field 'id' .*line 1"):
        read_jsonl(path)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=re.escape(str(missing))):
        load_records("jsonl", 3, np.random.default_rng(0), path=missing)
    with pytest.raises(DatasetError, match="needs a path"):
        load_records("jsonl", 3, np.random.default_rng(0))
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        load_records("nope", 3, np.random.default_rng(0))


def test_nullable_fields_may_be_absent_and_roundtrip(tmp_path):
    minimal = {"id": "q", "prompt": "Hi?", "task": "instruction", "source": "mine"}
    path = _write_lines(tmp_path / "m.jsonl", [minimal])
    (record,) = read_jsonl(path)
    assert record == PromptRecord("q", "Hi?", None, None, "instruction", "mine", None)

    records = [record, PromptRecord("r", "Ünïcode ×", "ref", "3.5", "arithmetic", "m", "calib")]
    out = tmp_path / "sub" / "out.jsonl"
    write_jsonl(records, out)
    assert read_jsonl(out) == records
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl"]  # no temp file left
    write_jsonl(records[:1], out)  # overwrite atomically
    assert read_jsonl(out) == records[:1]


# ---------------------------------------------------------------------------- embedded sets


def test_embedded_instructions_file():
    records = read_jsonl(ds.DEFAULT_DATA_DIR / "instructions.jsonl")
    assert len(records) >= 60
    assert len({r.id for r in records}) == len(records)
    assert len({r.prompt for r in records}) == len(records)
    for i, r in enumerate(records):
        assert r.id == f"inst-{i:03d}"
        assert r.task == "instruction" and r.source == "instructions"
        assert r.reference and r.reference.strip()
        assert r.gold_answer is None and r.split is None
        assert len(r.prompt.split()) <= 60
        assert len(r.reference.split()) <= 70


def test_load_instructions_sampling():
    all_records = load_records("instructions", 10_000, np.random.default_rng(0))
    assert len(all_records) >= 60
    a = load_records("instructions", 7, np.random.default_rng(3))
    b = load_records("instructions", 7, np.random.default_rng(3))
    c = load_records("instructions", 7, np.random.default_rng(4))
    assert a == b and a != c
    assert len(a) == 7 and len(set(a)) == 7
    order = [r.id for r in all_records]
    assert [order.index(r.id) for r in a] == sorted(order.index(r.id) for r in a)
    assert load_records("instructions", 0, np.random.default_rng(0)) == []
    with pytest.raises(DatasetError):
        load_records("instructions", -1, np.random.default_rng(0))


def test_embedded_names():
    assert EMBEDDED == ("instructions", "arithmetic", "humaneval")
    assert set(HUB_DATASETS) == {"gsm8k", "alpaca", "dolly", "strategyqa", "creak", "qed"}


# ---------------------------------------------------------------------------- arithmetic

PY_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.floordiv}
WORD_FOR = {2: "doubles", 3: "triples"}


def test_arithmetic_deterministic_and_seed_dependent():
    a = generate_arithmetic(40, np.random.default_rng(123))
    b = generate_arithmetic(40, np.random.default_rng(123))
    c = generate_arithmetic(40, np.random.default_rng(124))
    assert a == b
    assert {r.prompt for r in a} != {r.prompt for r in c}
    assert len({r.prompt for r in a} & {r.prompt for r in c}) < 5
    assert load_records("arithmetic", 40, np.random.default_rng(123)) == a


def test_arithmetic_gold_equals_recomputation():
    problems = generate_arithmetic_problems(300, np.random.default_rng(7))
    records = generate_arithmetic(300, np.random.default_rng(7))
    assert [p.to_record() for p in problems] == records
    assert len({r.id for r in records}) == 300 and len({r.prompt for r in records}) == 300
    ops_seen, step_counts, names = set(), set(), set()
    for p, r in zip(problems, records, strict=True):
        assert 2 <= len(p.steps) <= 4
        step_counts.add(len(p.steps))
        value = p.start
        for op, x in p.steps:
            ops_seen.add(op)
            if op == "/":
                assert value % x == 0
            value = PY_OPS[op](value, x)
            assert value >= 1  # every intermediate is a positive whole number
        assert r.gold_answer == str(value) == str(p.answer)
        assert r.task == "arithmetic" and r.source == "arithmetic"
        # The text states the start and every operand.
        assert re.search(rf"\b{p.start}\b", r.prompt)
        for op, x in p.steps:
            in_words = op == "*" and x in WORD_FOR and WORD_FOR[x][:-1] in r.prompt
            assert re.search(rf"\b{x}\b", r.prompt) or in_words
        # The worked solution: one equation per step, in order, ending with the answer.
        assert r.reference.endswith(f"The answer is {value}.")
        equations = re.findall(r"(\d+) ([+\-×÷]) (\d+) = (\d+)\.", r.reference)
        assert len(equations) == len(p.steps)
        sym = {"+": "+", "-": "-", "×": "*", "÷": "/"}
        for (a, s, b, c), (op, x) in zip(equations, p.steps, strict=True):
            assert sym[s] == op and int(b) == x and PY_OPS[op](int(a), int(b)) == int(c)
        assert extract_final_number(r.reference) == r.gold_answer
        names.add(r.prompt.split()[0])
    assert ops_seen == {"+", "-", "*", "/"}
    assert step_counts == {2, 3, 4}
    assert len(names) >= 10
    assert len({r.prompt.rsplit(".", 1)[-1] for r in records}) >= 10  # varied questions


# ---------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", "42"),
        ("She pays $1,234 in total.", "1234"),
        ("It costs 3.50 dollars", "3.5"),
        ("5.0", "5"),
        ("The temperature fell to -2 degrees.", "-2"),
        ("From 3-4 apples we get 7", "7"),
        ("pages 3-4", "4"),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),
        ("#### 1,000\nSome trailing 5", "1000"),
        ("first 12, then 1,234,567.", "1234567"),
        ("about .5 of it", "0.5"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_final_number(text, expected):
    assert extract_final_number(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("So the total is 1,234 dollars.", "1234", True),
        ("The answer is 18.00", "18", True),
        ("The answer is 17", "18", False),
        ("18 apples then 3 left", "18", False),
        ("no number", "18", False),
        ("Yes, because bananas are fruit.", "yes", True),
        ("No. It is not.", "yes", False),
        ("True: the claim holds", "yes", True),
        ("I am not sure", "no", False),
        ("It was written by George Orwell.", "George Orwell", True),
        ("It was written by Orwellian fans.", "Orwell", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


# ---------------------------------------------------------------------------- splits


def test_assign_splits_deterministic():
    records = generate_arithmetic(50, np.random.default_rng(0))
    a = assign_splits(records, 0.3, np.random.default_rng(9))
    b = assign_splits(records, 0.3, np.random.default_rng(9))
    c = assign_splits(records, 0.3, np.random.default_rng(10))
    assert a == b and a != c
    assert [r.id for r in a] == [r.id for r in records]
    assert sum(r.split == "calib" for r in a) == 15
    assert {r.split for r in a} == {"calib", "eval"}
    assert all(r.split is None for r in records)  # inputs untouched
    two = assign_splits(records[:2], 0.1, np.random.default_rng(0))
    assert sorted(r.split for r in two) == ["calib", "eval"]
    assert {r.split for r in assign_splits(records, 0.0, np.random.default_rng(0))} == {"eval"}
    with pytest.raises(DatasetError):
        assign_splits(records, 1.5, np.random.default_rng(0))


def test_a_train_split_is_disjoint_and_leaves_calibration_as_it_was():
    """Head-training prompts come after the calibration ones in the same permutation: the
    calibration split is the one without a train split, and the three are disjoint."""
    records = generate_arithmetic(50, np.random.default_rng(0))
    plain = assign_splits(records, 0.3, np.random.default_rng(9))
    three = assign_splits(records, 0.3, np.random.default_rng(9), train_fraction=0.4)
    assert [r.split == "calib" for r in three] == [r.split == "calib" for r in plain]
    counts = {s: sum(r.split == s for r in three) for s in ("calib", "train", "eval")}
    assert counts == {"calib": 15, "train": 20, "eval": 15}
    assert split_sizes(50, 0.3, 0.4) == counts
    assert split_sizes(50, 0.3) == {"calib": 15, "train": 0, "eval": 35}
    assert split_sizes(3, 0.3, 0.6)["eval"] == 1  # evaluation keeps a prompt
    with pytest.raises(DatasetError, match="train_fraction"):
        split_sizes(50, 0.5, 0.5)


# ---------------------------------------------------------------------------- hub adapters


@pytest.mark.parametrize("name", sorted(HUB_DATASETS))
def test_hub_offline_gives_helpful_error(monkeypatch, name):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'huggingface.co'")

    monkeypatch.setattr(hf_datasets, "load_dataset", offline)
    with pytest.raises(DatasetError) as info:
        load_records(name, 5, np.random.default_rng(0))
    message = str(info.value)
    assert f"'{name}'" in message and HUB_DATASETS[name].hub_id in message
    assert "unreachable" in message
    assert "'jsonl'" in message and "path" in message
    assert isinstance(info.value.__cause__, ConnectionError)


FAKE_ROWS = {
    "gsm8k": [{"question": "Q?", "answer": "2 * 3 = <<2*3=6>>6 apples.\n#### 6"}],
    "alpaca": [
        {"instruction": "Add.", "input": "1 and 2", "output": "3"},
        {"instruction": "Say hi.", "input": "", "output": "Hi!"},
    ],
    "dolly": [
        {
            "instruction": "Summarise.",
            "context": "Text.",
            "response": "Short.",
            "category": "summarization",
        }
    ],
    "strategyqa": [
        {
            "qid": "abc",
            "question": "Can a cat fly?",
            "answer": False,
            "facts": ["Cats have no wings."],
        }
    ],
    "creak": [
        {
            "ex_id": "dev_1",
            "sentence": "Paris is in France.",
            "label": "true",
            "explanation": "Paris is the capital of France.",
        }
    ],
    "qed": [
        {
            "example_id": 5,
            "question": "who wrote nineteen eighty four",
            "original_nq_answers": [{"start": 0, "end": 13, "string": "George Orwell"}],
            "annotation": {
                "selected_sentence": {
                    "start": 0,
                    "end": 10,
                    "string": "1984 is a novel by George Orwell.",
                }
            },
        },
    ],
}


def test_hub_adapters_convert_rows(monkeypatch):
    calls = []

    def fake(hub_id, config=None, split=None):
        calls.append((hub_id, config, split))
        name = next(k for k, a in HUB_DATASETS.items() if a.hub_id == hub_id)
        return FAKE_ROWS[name]

    monkeypatch.setattr(hf_datasets, "load_dataset", fake)
    out = {name: load_records(name, 10, np.random.default_rng(0)) for name in HUB_DATASETS}
    assert ("openai/gsm8k", "main", "test") in calls

    (g,) = out["gsm8k"]
    assert g.gold_answer == "6" and g.task == "arithmetic" and "<<" not in g.reference
    assert g.reference.endswith("The answer is 6.")
    a1, a2 = out["alpaca"]
    assert a1.prompt == "Add.\n\n1 and 2" and a1.reference == "3" and a2.prompt == "Say hi."
    assert out["dolly"][0].prompt == "Summarise.\n\nText." and out["dolly"][0].task == "instruction"
    (s,) = out["strategyqa"]
    assert s.gold_answer == "no" and s.task == "yesno" and "Cats have no wings." in s.reference
    (c,) = out["creak"]
    assert c.gold_answer == "yes" and "Paris is in France." in c.prompt
    (q,) = out["qed"]
    assert q.gold_answer == "George Orwell" and q.prompt.endswith("?") and q.task == "qa"
    for records in out.values():
        for r in records:
            ds.validate_record(r.to_dict(), "roundtrip")


# ---------------------------------------------------------------------------- tokenisation


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from edgespec.models.tiny import build_tiny_tokenizer

    corpus = [r.prompt for r in generate_arithmetic(30, np.random.default_rng(0))]
    return build_tiny_tokenizer(corpus + ["You are helpful.", "user assistant system"])


def test_chat_token_ids_uses_chat_template(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = chat_token_ids(tok, "Tom has 3 apples.")
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    expected = "<|im_start|>user\nTom has 3 apples.<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ids) == expected
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")

    with_system = chat_token_ids(tok, "Tom has 3 apples.", system="You are helpful.")
    assert tok.decode(with_system) == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n" + expected
    )
    assert with_system[-len(ids) :] == ids


def test_chat_token_ids_without_template(tiny_tokenizer):
    tok = tiny_tokenizer
    saved = tok.chat_template
    tok.chat_template = None
    try:
        ids = chat_token_ids(tok, "Tom has 3 apples.")
        assert ids == tok("Tom has 3 apples.", add_special_tokens=True)["input_ids"]
        sys_ids = chat_token_ids(tok, "Tom has 3 apples.", system="You are helpful.")
        assert tok.decode(sys_ids) == "You are helpful.\n\nTom has 3 apples."
    finally:
        tok.chat_template = saved


# ---------------------------------------------------------------------------- local copies


def _write_copy(rows, fmt: str, folder: Path, stem: str = "test") -> Path:
    """A local copy of a hub dataset in one of its published formats, written here."""
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path = folder / f"{stem}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "json":
        path = folder / f"{stem}.json"
        path.write_text(json.dumps(rows), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / f"{stem}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "saved":
        path = folder / "saved"
        hf_datasets.Dataset.from_list(rows).save_to_disk(str(path))
    else:  # a save_to_disk DatasetDict, the adapter's split among others
        path = folder / "saved_dict"
        split = HUB_DATASETS[stem].split
        hf_datasets.DatasetDict(
            {
                split: hf_datasets.Dataset.from_list(rows),
                "other": hf_datasets.Dataset.from_list(rows[:1]),
            }
        ).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "saved", "saved_dict"])
def test_every_hub_adapter_reads_a_local_copy(tmp_path, monkeypatch, fmt):
    def fake(hub_id, config=None, split=None):
        name = next(k for k, a in HUB_DATASETS.items() if a.hub_id == hub_id)
        return FAKE_ROWS[name]

    monkeypatch.setattr(hf_datasets, "load_dataset", fake)
    for name in HUB_DATASETS:
        from_hub = load_records(name, 10, np.random.default_rng(0))
        monkeypatch.setattr(hf_datasets, "load_dataset", _no_hub)
        copy = _write_copy(FAKE_ROWS[name], fmt, tmp_path / name, stem=name)
        local = load_records(name, 10, np.random.default_rng(0), path=copy)
        assert local == from_hub, (name, fmt)
        monkeypatch.setattr(hf_datasets, "load_dataset", fake)


def _no_hub(*args, **kwargs):
    raise AssertionError("a local copy must not go to the hub")


def test_gsm8k_test_jsonl_as_published(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_datasets, "load_dataset", _no_hub)
    path = tmp_path / "test.jsonl"
    rows = [
        {
            "question": "Natalia sold clips to 48 of her friends in April, and then she sold "
            "half as many clips in May. How many clips did she sell altogether?",
            "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
            "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
        },
        {"question": "What is 1,000 + 234?", "answer": "1,000 + 234 = 1,234\n#### 1,234"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    records = load_records("gsm8k", 5, np.random.default_rng(0), path=str(path))
    assert [r.gold_answer for r in records] == ["72", "1234"]
    assert records[0].id == "gsm8k-00000" and records[0].task == "arithmetic"
    assert "<<" not in records[0].reference and records[0].reference.endswith("The answer is 72.")


def test_local_copy_formats_of_the_original_releases(tmp_path, monkeypatch):
    monkeypatch.setattr(hf_datasets, "load_dataset", _no_hub)
    # CREAK ships JSON Lines named .json; QED's release names the question question_text and
    # nests the answers per rater
    creak = tmp_path / "dev.json"
    creak.write_text(
        json.dumps(FAKE_ROWS["creak"][0])
        + "\n"
        + json.dumps(FAKE_ROWS["creak"][0] | {"ex_id": "dev_2"})
        + "\n"
    )
    assert len(load_records("creak", 5, np.random.default_rng(0), path=creak)) == 2
    qed = tmp_path / "qed-dev.jsonlines"
    row = {
        "example_id": 7,
        "question_text": "who wrote nineteen eighty four",
        "original_nq_answers": [[{"start": 0, "end": 13, "string": "George Orwell"}]],
    }
    qed.write_text(json.dumps(row) + "\n")
    (record,) = load_records("qed", 5, np.random.default_rng(0), path=qed)
    assert record.gold_answer == "George Orwell" and record.prompt.endswith("?")
    # a folder of hub shards (a snapshot): the adapter's split is picked by file name
    snapshot = tmp_path / "gsm8k" / "main"
    _write_copy(FAKE_ROWS["gsm8k"], "parquet", snapshot, stem="test-00000-of-00001")
    _write_copy([{"question": "Q2?", "answer": "#### 1"}], "parquet", snapshot, stem="train-0")
    (g,) = load_records("gsm8k", 5, np.random.default_rng(0), path=tmp_path / "gsm8k")
    assert g.gold_answer == "6"


def test_bad_local_copy_names_dataset_and_file(tmp_path):
    bad = tmp_path / "alpaca_data.json"
    bad.write_text('{"instruction": "x"')  # cut short
    with pytest.raises(DatasetError) as info:
        load_records("alpaca", 5, np.random.default_rng(0), path=bad)
    assert "'alpaca'" in str(info.value) and str(bad) in str(info.value)
    with pytest.raises(DatasetError, match=r"'dolly': local copy not found: .*x\.csv"):
        load_records("dolly", 5, np.random.default_rng(0), path=tmp_path / "x.csv")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unknown format '.csv'"):
        load_records("dolly", 5, np.random.default_rng(0), path=tmp_path / "x.csv")


# ---------------------------------------------------------------------------- bad local copies

# Per adapter, the fields its records need: a row without one is rejected (never dropped), and
# the error names the field ("question" stands for QED's question_text too; "answers" for QED's
# two ways of stating an answer, original_nq_answers and annotation.selected_sentence).
REQUIRED = [
    ("gsm8k", ("question",), "question"),
    ("gsm8k", ("answer",), "answer"),
    ("alpaca", ("instruction",), "instruction"),
    ("alpaca", ("output",), "output"),
    ("dolly", ("instruction",), "instruction"),
    ("dolly", ("response",), "response"),
    ("strategyqa", ("question",), "question"),
    ("strategyqa", ("answer",), "answer"),
    ("creak", ("sentence",), "sentence"),
    ("creak", ("label",), "label"),
    ("qed", ("question",), "question"),
    ("qed", ("original_nq_answers", "annotation"), "original_nq_answers"),
]


@pytest.mark.parametrize(("name", "dropped", "field"), REQUIRED)
def test_a_record_without_a_required_field_is_rejected_with_its_line(
    tmp_path, monkeypatch, name, dropped, field
):
    monkeypatch.setattr(hf_datasets, "load_dataset", _no_hub)
    good = FAKE_ROWS[name][0]
    bad = {k: v for k, v in good.items() if k not in dropped}
    # three good rows, a blank line (still counted), the bad row on line 5, a good one after
    lines = [json.dumps(good)] * 3 + ["", json.dumps(bad), json.dumps(good)]
    copy = tmp_path / "copy.jsonl"
    copy.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError) as info:
        load_records(name, 10, np.random.default_rng(0), path=copy)
    message = str(info.value)
    assert f"dataset '{name}': {copy}, line 5: missing required field '{field}'" in message
    # a JSON array names the record (counted from 0), as do rows from the hub
    array = tmp_path / "copy.json"
    array.write_text(json.dumps([good, good, bad]))
    with pytest.raises(DatasetError, match=rf"{re.escape(str(array))}, record 2: .*'{field}'"):
        load_records(name, 10, np.random.default_rng(0), path=array)
    monkeypatch.setattr(hf_datasets, "load_dataset", lambda *a, **k: [good, bad])
    hub = HUB_DATASETS[name].hub_id
    with pytest.raises(DatasetError, match=rf"{re.escape(hub)} .*record 1: .*'{field}'"):
        load_records(name, 10, np.random.default_rng(0))


def test_a_yes_no_field_of_another_value_is_rejected(tmp_path):
    copy = _write_lines(tmp_path / "dev.jsonl", [{**FAKE_ROWS["creak"][0], "label": "maybe"}])
    with pytest.raises(DatasetError, match=r"line 1: field 'label' must be true/false"):
        load_records("creak", 5, np.random.default_rng(0), path=copy)


def test_a_line_cut_short_is_named_by_its_own_line(tmp_path):
    rows = [FAKE_ROWS["gsm8k"][0] | {"question": f"Q{i}?"} for i in range(6)]
    lines = [json.dumps(r) for r in rows]
    lines[3] = lines[3][:40]  # line 4 cut short, the file goes on
    for name in ("test.jsonl", "dev.json"):  # JSON Lines, also under a .json name (CREAK's)
        copy = tmp_path / name
        copy.write_text("\n".join(lines) + "\n")
        with pytest.raises(DatasetError) as info:
            load_records("gsm8k", 10, np.random.default_rng(0), path=copy)
        assert f"{copy}, line 4: not valid JSON" in str(info.value), name
        assert "line 1 column" not in str(info.value)


def test_a_pretty_printed_json_cut_short_is_named_where_it_breaks_off(tmp_path):
    rows = [FAKE_ROWS["alpaca"][0] | {"instruction": f"Task {i}."} for i in range(8)]
    text = json.dumps(rows, indent=2)
    cut = text[: len(text) * 2 // 3]
    copy = tmp_path / "alpaca_data.json"
    copy.write_text(cut)
    with pytest.raises(DatasetError) as info:
        load_records("alpaca", 10, np.random.default_rng(0), path=copy)
    assert f"{copy}, line {cut.count(chr(10)) + 1}: not valid JSON" in str(info.value)


def test_a_malformed_local_copy_fails_config_validation(tmp_path):
    good = FAKE_ROWS["strategyqa"][0]
    copy = _write_lines(tmp_path / "train.jsonl", [good, {"qid": "x", "answer": True}])
    config = {
        "data": {"datasets": {"sqa": {"source": "strategyqa", "n": 2, "path": "train.jsonl"}}}
    }
    with pytest.raises(ConfigError) as info:
        check_local_copies(config, base=tmp_path)
    message = str(info.value)
    assert "data.datasets.sqa.path" in message and f"{copy}, line 2" in message
    assert "missing required field 'question'" in message
    mine = _write_lines(tmp_path / "mine.jsonl", [GOOD, {**GOOD, "id": "a-2", "task": "poetry"}])
    config = {"data": {"datasets": {"own": {"source": "jsonl", "n": 2, "path": "mine.jsonl"}}}}
    with pytest.raises(ConfigError, match=rf"{re.escape(str(mine))}, line 2: field 'task'"):
        check_local_copies(config, base=tmp_path)
    _write_lines(tmp_path / "train.jsonl", [good])  # mended: no error
    config = {
        "data": {"datasets": {"sqa": {"source": "strategyqa", "n": 2, "path": "train.jsonl"}}}
    }
    check_local_copies(config, base=tmp_path)
