"""Quality gates of the repository: ruff, snakefmt and Snakemake's linter report nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from edgespec.config import REPO_ROOT


def _tool(name: str) -> str:
    path = shutil.which(name) or str(REPO_ROOT / ".venv" / "bin" / name)
    if not shutil.which(path):
        pytest.skip(f"{name} is not installed (it comes with the test extras)")
    return path


def test_ruff_reports_nothing():
    proc = subprocess.run(
        [_tool("ruff"), "check", "src", "tests", "bench", "workflow/scripts"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_files_pass_snakefmt():
    rules = ["Snakefile", *sorted(str(p) for p in (REPO_ROOT / "workflow/rules").glob("*.smk"))]
    proc = subprocess.run(
        [_tool("snakefmt"), "--check", *rules], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snakemake_lint_reports_nothing(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--lint",
            "--snakefile",
            str(REPO_ROOT / "Snakefile"),
            "--directory",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr
