"""HumanEval as an embedded dataset and pass@1 by the package's own harness in a subprocess."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgespec import scoring
from edgespec.code_execution import run_harness
from edgespec.cuhlm.scores import budget_columns
from edgespec.data.humaneval import (
    extract_code,
    harness_completion,
    load_humaneval,
    problem_for,
    record_id,
    task_id,
)
from edgespec.data.prepare import load_records
from edgespec.data.records import DatasetError, PromptRecord

ADD = {
    "task_id": "toy/0",
    "prompt": 'def add(a, b):\n    """The sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    "    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


def test_the_wheel_ships_all_164_problems_as_code_records():
    records = load_humaneval()
    assert len(records) == 164
    assert [r.id for r in records[:3]] == ["humaneval-000", "humaneval-001", "humaneval-002"]
    first = records[0]
    assert first.task == "code" and first.source == "humaneval" and first.gold_answer is None
    problem = problem_for(first.id)
    assert problem["task_id"] == "HumanEval/0"
    assert problem["prompt"] in first.prompt
    assert first.reference == problem["prompt"] + problem["canonical_solution"]
    # drawn like any embedded set: n of them, in source order
    drawn = load_records("humaneval", 5, np.random.default_rng(1))
    assert len(drawn) == 5 and [r.id for r in drawn] == sorted(r.id for r in drawn)


def test_ids_map_both_ways_and_reject_strangers():
    assert record_id("HumanEval/7") == "humaneval-007"
    assert task_id("humaneval-163") == "HumanEval/163"
    with pytest.raises(DatasetError, match="HumanEval task id"):
        record_id("MBPP/7")
    with pytest.raises(DatasetError, match="HumanEval prompt id"):
        task_id("inst-001")


def test_code_is_taken_from_the_first_fence_even_when_cut():
    reply = "Sure:\n```python\ndef f():\n    return 1\n```\nand\n```python\nx = 2\n```"
    assert extract_code(reply) == "def f():\n    return 1\n"
    assert extract_code("```\nprint(1)\n") == "print(1)\n"  # cut by the budget
    assert extract_code("    return 1") == "    return 1"  # no fence: the text itself
    whole = harness_completion("```python\ndef add(a, b):\n    return a + b\n```", ADD)
    assert whole == "\ndef add(a, b):\n    return a + b\n"
    assert harness_completion("    return a + b", ADD) == "    return a + b"


def test_the_harness_passes_a_right_completion_and_fails_a_wrong_one():
    results = run_harness([ADD, ADD], ["    return a + b\n", "    return a - b\n"], timeout_s=2.0)
    assert [r["passed"] for r in results] == [True, False]
    assert results[0]["result"] == "passed" and results[1]["result"].startswith("failed")
    assert [r["task_id"] for r in results] == ["toy/0", "toy/0"]


def test_a_completion_that_loops_forever_times_out_and_scores_zero():
    start = time.perf_counter()
    results = run_harness(
        [ADD, ADD], ["    while True:\n        pass\n", "    return a + b\n"], 1.0
    )
    assert [r["passed"] for r in results] == [False, True]
    assert results[0]["result"] == "timed out"
    assert time.perf_counter() - start < 20


def test_the_worker_deadline_scores_what_is_left_zero():
    """A loop that swallows the harness's own timeout exception is killed by the harness; a
    worker that overstays its deadline as a whole is killed with its process group."""
    stubborn = (
        "    while True:\n        try:\n            pass\n"
        "        except BaseException:\n            pass\n"
    )
    start = time.perf_counter()
    results = run_harness([ADD, ADD], [stubborn, "    return a + b\n"], 1.0, deadline_s=3.0)
    assert results[0]["passed"] is False
    assert time.perf_counter() - start < 15
    with pytest.raises(ValueError, match="2 problems but 1"):
        run_harness([ADD, ADD], ["x"])


def test_pass_at_1_scores_humaneval_records_only():
    records = load_humaneval()[:2]
    other = PromptRecord("inst-1", "Say hi.", "Hi.", None, "instruction", "instructions")
    right = "```python\n" + problem_for(records[0].id)["prompt"]
    right += problem_for(records[0].id)["canonical_solution"] + "```"
    scores = scoring.pass_at_1([right, "```python\npass\n```", "Hi."], [*records, other])
    assert scores == [1.0, 0.0, None]


def test_budget_columns_tell_a_cut_answer_from_a_stated_one():
    arithmetic = PromptRecord("a", "2+2?", None, "4", "arithmetic", "arithmetic")
    code = load_humaneval()[0]
    texts = ["2 + 2 = 4. The answer is 4.", "2 + 2 = ", "```python\npass\n```", "```python\npa"]
    records = [arithmetic, arithmetic, code, code]
    out = budget_columns(texts, records, [8, 10, 10, 10], 10, "The answer is")
    assert out["budget_exhausted"].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert out["answer_cut"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert out["new_tokens"].tolist() == [8, 10, 10, 10]
