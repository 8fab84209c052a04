"""The Snakemake workflow itself: dry run on the default config, a real smoke run on tiny models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgespec.artifacts import read_json
from edgespec.config import REPO_ROOT

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile")]


def _run(args, cwd: Path, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_dry_run_default_config(tmp_path):
    proc = _run(["-n", "--cores", "2", "--directory", str(tmp_path)], tmp_path)
    for rule in ("fetch_models", "prepare_data", "collect_traces", "profile_latency"):
        assert rule in proc.stdout


def test_bad_config_fails_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("decoding:\n  max_new_tokens: lots\n")
    proc = _run(["-n", "--cores", "1", "--configfile", str(bad)], tmp_path, check=False)
    assert proc.returncode != 0
    assert "decoding.max_new_tokens" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    _run(
        [
            "--cores",
            "2",
            "--configfile",
            str(REPO_ROOT / "config" / "smoke.yaml"),
            "--directory",
            str(workdir),
            "--show-failed-logs",
        ],
        workdir,
    )
    return workdir


def test_smoke_run_writes_traces(smoke_run):
    for dataset in ("instructions", "arithmetic"):
        tokens = pd.read_parquet(smoke_run / f"results/traces/{dataset}/tokens.parquet")
        meta = read_json(smoke_run / f"results/traces/{dataset}/meta.json")
        assert len(tokens) == meta["tokens"] > 0
        for column in ("x_d", "y_d", "beta", "u", "draft_is_target_argmax", "nk_1", "tvd_1"):
            assert column in tokens
        assert tokens["beta"].between(0, 1).all() and tokens["u"].between(0, 1).all()
        vocab = meta["vocab_size"]
        assert (tokens[f"nk_{vocab}"] == 0).all() and (tokens[f"tvd_{vocab}"] == 0).all()
        with np.load(smoke_run / f"results/traces/{dataset}/hidden.npz") as hidden:
            assert hidden["draft"].shape[0] == hidden["target"].shape[0] == len(tokens)


def test_smoke_run_writes_latency_profile(smoke_run):
    profile = read_json(smoke_run / "results/latency/profile.json")
    assert profile["source"] == "measured"
    assert profile["draft_token_s"] > 0 and profile["target_token_s"] > 0
    assert set(profile["target_verify_s"]) == {"1", "4"}


def test_second_run_has_nothing_to_do(smoke_run):
    proc = _run(
        [
            "-n",
            "--cores",
            "2",
            "--configfile",
            str(REPO_ROOT / "config" / "smoke.yaml"),
            "--directory",
            str(smoke_run),
        ],
        smoke_run,
    )
    assert "Nothing to be done" in proc.stdout + proc.stderr
