"""The Snakemake workflow itself: dry runs and real smoke runs on tiny models
(every rule through the report), including a run killed midway and resumed, what a config change
reruns, and a second working directory on the first one's model cache.

Tests that run jobs are marked ``slow`` (minutes): ``pytest -m "not slow"`` skips them."""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from edgespec.artifacts import current_umask, read_json
from edgespec.config import REPO_ROOT
from edgespec.data.prepare import split_sizes
from edgespec.report import HEADLINE_COLUMNS
from edgespec.variants import CUHLM_VARIANTS, WISV_VARIANTS

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile")]
SMOKE = ["--configfile", str(REPO_ROOT / "config" / "smoke.yaml")]
COMPARED = [
    "results/traces/instructions/tokens.parquet",
    "results/cuhlm/calibration/fit.json",
    "results/cuhlm/calibration/kstar.json",
    "results/report/cuhlm_summary.csv",
    "results/report/cuhlm_headline.csv",
    "results/report/wisv_summary.csv",
    "results/report/wisv_headline.csv",
    "results/report/multidevice_summary.csv",
    "results/report/multidevice_headline.csv",
]


def _run(args, cwd: Path, check=True, env=None) -> subprocess.CompletedProcess:
    env = None if env is None else {**os.environ, **env}
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _job_counts(output: str) -> dict[str, int]:
    """Rule -> number of jobs, from the "Job stats" table of a (dry) run; {} if nothing to do."""
    if "Nothing to be done" in output:
        return {}
    table = output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {rule: int(n) for rule, n in re.findall(r"^(\w+)\s+(\d+)$", table, re.M)}


def _write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_dry_run_default_config(tmp_path):
    proc = _run(["-n", "--cores", "2", "--directory", str(tmp_path)], tmp_path)
    for rule in (
        "fetch_models",
        "select_dtype",
        "prepare_data",
        "collect_traces",
        "profile_latency",
        "fit_calibration",
        "optimize_k",
        "decode_cuhlm",
        "evaluate_cuhlm",
        "report_cuhlm",
        "mine_labels",
        "relabel_csi",
        "train_head",
        "profile_head",
        "decode_wisv",
        "evaluate_wisv",
        "report_wisv",
        "profile_batching",
        "simulate_multidevice",
        "report_multidevice",
    ):
        assert rule in proc.stdout, rule


def test_small_datasets_share_model_jobs_until_they_fill_a_batch(tmp_path):
    """The default's two datasets bring 8 evaluation and 8 calibration prompts each to a batch
    of 16: one decode_cuhlm job per variant and one mine_labels job decode both."""
    proc = _run(["-n", "--cores", "2", "--directory", str(tmp_path)], tmp_path)
    counts = _job_counts(proc.stdout)
    assert counts["decode_cuhlm"] == len(CUHLM_VARIANTS) and counts["mine_labels"] == 1
    assert "results/cuhlm/decode/hlm/arithmetic+instructions/tokens.parquet" in proc.stdout
    assert "results/wisv/labels/arithmetic+instructions/mismatches.parquet" in proc.stdout
    bigger = _write_yaml(tmp_path / "batch.yaml", {"decoding": {"batch_size": 8}})
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(bigger), "--directory", str(tmp_path)],
        tmp_path,
    )
    counts = _job_counts(proc.stdout)
    assert counts["decode_cuhlm"] == 2 * len(CUHLM_VARIANTS) and counts["mine_labels"] == 2


def test_a_dataset_may_set_its_own_calibration_share(tmp_path):
    """20 HumanEval problems with calib_fraction 0.2 bring 16 evaluation prompts, a batch:
    their own decode jobs; at data.calib_fraction (0.5) their 10 would share a job with
    arithmetic's 2."""
    study = _write_yaml(
        tmp_path / "split.yaml",
        {
            "data": {
                "datasets": {
                    "humaneval": {"source": "humaneval", "n": 20, "calib_fraction": 0.2},
                    "arithmetic": {"source": "arithmetic", "n": 4},
                }
            },
            "cuhlm": {"variants": ["llm_only", "hlm", "uhlm_risk_prone"]},
            "multidevice": {"enabled": False},
        },
    )
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(study), "--directory", str(tmp_path)],
        tmp_path,
    )
    assert "results/cuhlm/decode/hlm/humaneval/tokens.parquet" in proc.stdout
    assert "results/cuhlm/decode/hlm/arithmetic/tokens.parquet" in proc.stdout
    assert _job_counts(proc.stdout)["decode_cuhlm"] == 3 * 2


def test_a_train_split_trains_the_head_apart_from_calibration(tmp_path):
    """With data.train_fraction the head's labels are mined on the train split: 16 prompts of
    each dataset at 0.25 + 0.25 give 4 calibration, 4 training and 8 evaluation prompts; one
    mining job takes both datasets' 4."""
    three = _write_yaml(
        tmp_path / "three.yaml", {"data": {"calib_fraction": 0.25, "train_fraction": 0.25}}
    )
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(three), "--directory", str(tmp_path)],
        tmp_path,
    )
    assert "results/wisv/labels/arithmetic+instructions/mismatches.parquet" in proc.stdout
    counts = _job_counts(proc.stdout)
    assert counts["mine_labels"] == 1 and counts["collect_traces"] == 2
    bad = _write_yaml(
        tmp_path / "bad.yaml", {"data": {"train_fraction": 0.5, "calib_fraction": 0.5}}
    )
    failed = _run(["-n", "--configfile", str(bad), "--directory", str(tmp_path)], tmp_path, False)
    assert failed.returncode != 0 and "train_fraction" in failed.stdout + failed.stderr


def test_a_quantised_draft_is_measured_and_a_quantised_target_needs_float32(tmp_path):
    draft_only = _write_yaml(
        tmp_path / "q.yaml", {"models": {"dtype": "bfloat16", "quantize": "int8_dynamic_draft"}}
    )
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(draft_only), "--directory", str(tmp_path)],
        tmp_path,
    )
    assert _job_counts(proc.stdout)["check_quantization"] == 1
    both = _write_yaml(
        tmp_path / "q.yaml", {"models": {"dtype": "bfloat16", "quantize": "int8_dynamic"}}
    )
    proc = _run(["-n", "--cores", "1", "--configfile", str(both)], tmp_path, check=False)
    assert proc.returncode != 0
    assert "models.quantize" in proc.stdout + proc.stderr


def test_bad_config_fails_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("decoding:\n  max_new_tokens: lots\n")
    proc = _run(["-n", "--cores", "1", "--configfile", str(bad)], tmp_path, check=False)
    assert proc.returncode != 0
    assert "decoding.max_new_tokens" in proc.stdout + proc.stderr


def test_missing_dataset_file_fails_before_any_job(tmp_path):
    cfg = tmp_path / "own.yaml"
    cfg.write_text("data:\n  datasets:\n    own: {source: jsonl, n: 3, path: absent.jsonl}\n")
    proc = _run(
        ["-n", "--cores", "1", "--configfile", str(cfg), "--directory", str(tmp_path)],
        tmp_path,
        check=False,
    )
    assert proc.returncode != 0
    assert "absent.jsonl" in proc.stdout + proc.stderr


def test_paper_config_prepares_exactly_the_papers_datasets(tmp_path):
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(REPO_ROOT / "config/paper.yaml")], tmp_path
    )
    prepared = set(re.findall(r"output: results/data/([\w-]+)\.jsonl", proc.stdout))
    assert prepared == {"gsm8k", "alpaca", "strategyqa", "creak", "qed", "dolly"}
    counts = _job_counts(proc.stdout)
    assert counts["prepare_data"] == counts["mine_labels"] == counts["collect_traces"] == 6
    # datasets of at least a batch (32) are shards of their own: a job per variant and dataset
    assert counts["decode_cuhlm"] == len(CUHLM_VARIANTS) * 6
    assert counts["join_cuhlm_decode"] == len(CUHLM_VARIANTS) and counts["join_labels"] == 1
    # every WISV decode too, each per dataset, joined per decode: 3 regime-free channel-blind
    # variants x 3 gammas once; per pricing regime (2) head_relabel_no_csi x 3 gammas and the
    # CSI head x 3 gammas x 2 channels x 5 fading seeds
    assert counts["decode_wisv"] == 3 * 3 * 6 and counts["join_wisv_decode"] == 3 * 3
    assert counts["decode_wisv_regime"] == 2 * 3 * 6
    assert counts["decode_wisv_csi"] == 2 * 3 * 2 * 5 * 6
    assert counts["join_wisv_regime_decode"] == 2 * (3 + 3 * 2 * 5)
    assert counts["prefill_prompts"] == 6


def test_study_config_decodes_its_sizes_with_the_claims_variants(tmp_path):
    """config/study.yaml (methods §6): every HumanEval problem, 148 of them evaluated, four
    CU-HLM variants on three datasets of their own shards, one WISV gamma."""
    proc = _run(
        ["-n", "--cores", "2", "--configfile", str(REPO_ROOT / "config/study.yaml")], tmp_path
    )
    counts = _job_counts(proc.stdout)
    assert counts["prepare_data"] == counts["collect_traces"] == 3
    assert counts["decode_cuhlm"] == 4 * 3 and counts["join_cuhlm_decode"] == 4
    cfg = yaml.safe_load((REPO_ROOT / "config/study.yaml").read_text())
    sizes = {
        name: split_sizes(spec["n"], spec["calib_fraction"], spec.get("train_fraction"))
        for name, spec in cfg["data"]["datasets"].items()
    }
    assert {name: size["eval"] for name, size in sizes.items()} == {
        "humaneval": 148,
        "instructions": 52,
        "arithmetic": 268,
    }
    assert sizes["arithmetic"]["train"] == 502  # WISV's label-mining pool


def test_data_files_are_inputs(tmp_path):
    own = tmp_path / "own.jsonl"
    own.write_text(
        '{"id": "o-1", "prompt": "Hi?", "task": "qa", "source": "own"}\n'
        '{"id": "o-2", "prompt": "Bye?", "task": "qa", "source": "own"}\n'
    )
    target = ["results/data/own.jsonl", "results/data/instructions.jsonl"]
    cfg = _write_yaml(
        tmp_path / "both.yaml",
        {
            "data": {
                "datasets": {
                    "own": {"source": "jsonl", "n": 2, "path": "own.jsonl"},
                    "instructions": {"source": "instructions", "n": 2},
                }
            }
        },
    )
    args = [*target, "--cores", "1", f"--configfile={cfg}"]  # `=`: it takes no targets
    dry = _run(["-n", *args], tmp_path)
    # the embedded file relative to the working directory (a moved checkout reruns nothing)
    embedded = os.path.relpath(REPO_ROOT / "data" / "instructions.jsonl", tmp_path)
    assert f"input: {embedded}\n" in dry.stdout and not embedded.startswith("/")
    assert "input: own.jsonl" in dry.stdout
    # prepare_data may download from a dataset hub: it runs where Snakemake runs
    run = _run(args, tmp_path)
    assert "localrule prepare_data:" in run.stdout + run.stderr
    assert _job_counts(_run(["-n", *args], tmp_path).stdout) == {}
    # the data is edited (Snakemake compares checksums of small inputs: a touch is not enough)
    with own.open("a") as fh:
        fh.write('{"id": "o-3", "prompt": "Why?", "task": "qa", "source": "own"}\n')
    later = time.time() + 5
    os.utime(own, (later, later))
    assert _job_counts(_run(["-n", *args], tmp_path).stdout) == {"prepare_data": 1}


def test_given_latency_without_a_priced_gamma_fails_before_any_job(tmp_path):
    cfg = _write_yaml(
        tmp_path / "lat.yaml",
        {
            "latency": {"mode": "given", "given": {"target_verify_s": {"1": 0.02, "4": 0.03}}},
            "wisv": {"gammas": [4, 8]},
        },
    )
    proc = _run(["-n", "--cores", "1", "--configfile", str(cfg)], tmp_path, check=False)
    assert proc.returncode != 0 and "Job stats" not in proc.stdout
    out = proc.stdout + proc.stderr
    assert "latency.given.target_verify_s" in out and "gamma 8 (priced by wisv.gammas)" in out


def test_failed_job_shows_its_error_and_a_retry_gets_more(tmp_path):
    # A hub dataset with the hub out of reach fails in its job (a malformed local copy would
    # fail the configuration instead, before any job).
    cfg = _write_yaml(
        tmp_path / "hub.yaml", {"data": {"datasets": {"gsm8k": {"source": "gsm8k", "n": 3}}}}
    )
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    # the target before --configfile, which would take it for a second config file
    base = ["results/data/gsm8k.jsonl", "--cores", "1", "--configfile", str(cfg)]
    cause = "could not load openai/gsm8k (main) split 'test'"
    # without a profile: the job echoes its error where Snakemake reports the failure
    proc = _run(["--retries", "1", *base], tmp_path, check=False, env=offline)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert f"DatasetError: dataset 'gsm8k': {cause}" in out
    first, retry = re.findall(r"resources: .*", out)[:2]
    assert "mem_mb=2000" in first and "runtime=10," in first
    assert "mem_mb=4000" in retry and "runtime=20," in retry  # a retry gets more
    # the profiles also print the failed job's log
    profile = ["--workflow-profile", str(REPO_ROOT / "workflow/profiles/default")]
    proc = _run([*profile, *base], tmp_path, check=False, env=offline)
    out = proc.stdout + proc.stderr
    log_tail = out.split("Logfile logs/prepare_data/gsm8k.log:", 1)[1]
    assert "Traceback" in log_tail and cause in log_tail


def test_a_malformed_local_copy_fails_before_any_job(tmp_path):
    """A local dataset copy is read when the configuration is checked: a record without its
    question stops the run there, named by file, line and field, before any model job."""
    copy = tmp_path / "test.jsonl"
    rows = [{"question": "Q?", "answer": "#### 6"}, {"answer": "#### 7"}]
    copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _write_yaml(
        tmp_path / "local.yaml",
        {"data": {"datasets": {"gsm8k": {"source": "gsm8k", "n": 2, "path": "test.jsonl"}}}},
    )
    proc = _run(
        ["-n", "--cores", "1", "--configfile", str(cfg), "--directory", str(tmp_path)],
        tmp_path,
        check=False,
    )
    assert proc.returncode != 0 and "Job stats" not in proc.stdout
    out = proc.stdout + proc.stderr
    assert "config key 'data.datasets.gsm8k.path'" in out
    assert "test.jsonl, line 2: missing required field 'question'" in out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    _run(["--cores", "2", *SMOKE, "--directory", str(workdir)], workdir)
    return workdir


@pytest.mark.slow
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


@pytest.mark.slow
def test_smoke_run_reports_every_variant(smoke_run):
    cuhlm = pd.read_csv(smoke_run / "results/report/cuhlm_summary.csv")
    assert set(cuhlm["variant"]) == set(CUHLM_VARIANTS)
    assert set(cuhlm["channel"]) == {"rayleigh_snr-20", "rayleigh_snr10"}
    assert set(cuhlm["profile"]) == {"primary", "paper_hw"}
    assert len(cuhlm) == len(CUHLM_VARIANTS) * 2 * 2
    hlm = cuhlm[cuhlm["variant"] == "hlm"]
    assert np.allclose(hlm["throughput_gain"], 1.0)
    # Every delay figure is a median over the configured fading seeds with its interval.
    assert (cuhlm["fading_seeds"] == 20).all()
    for column in ("throughput_tps", "throughput_gain", "end_to_end_latency_s", "skip_rate"):
        point, low, high = (cuhlm[c] for c in (column, f"{column}_lo", f"{column}_hi"))
        assert ((low <= point + 1e-12) & (point <= high + 1e-12)).all(), column
    online = cuhlm[(cuhlm["variant"] == "cuhlm_online") & (cuhlm["profile"] == "primary")]
    assert (online["throughput_tps_lo"] < online["throughput_tps_hi"]).all()
    exact = cuhlm[cuhlm["variant"] == "cuhlm_exact"]
    assert (exact["output_tvd_mean"] < 1e-6).all()
    headline = pd.read_csv(smoke_run / "results/report/cuhlm_headline.csv")
    assert list(headline.columns) == list(HEADLINE_COLUMNS)
    assert {206.0, 1014.0} <= set(headline["paper"])
    # every quality claim carries its floor, detectable difference and verdict
    claims = headline[headline["floor"].notna()]
    assert len(claims) == 4 and (claims["floor"] == 100.0).all()
    # a verdict wherever the smoke data give the figure an interval (it has no HumanEval)
    measured = claims[claims["ours_lo"].notna()]
    assert len(measured) >= 2
    assert measured["verdict"].str.match(r"reproduced|refuted|undecided at n=\d+").all()
    joint = pd.read_csv(smoke_run / "results/cuhlm/calibration/joint_kstar.csv")
    assert set(joint["channel"]) == {"rayleigh_snr-20", "rayleigh_snr10"}
    assert joint["decoded"].sum() == 1
    kstar = read_json(smoke_run / "results/cuhlm/calibration/kstar.json")
    assert (
        kstar["joint"]["channel"] == "rayleigh_snr10"
        and kstar["replay"]["mean_abs_x_d_diff"] < 1e-4
    )
    markdown = (smoke_run / "results/report/cuhlm_summary.md").read_text()
    for text in ("cuhlm_exact", "cuhlm_joint", "emulated paper hardware", "Joint k* and u_th"):
        assert text in markdown, text
    wisv = pd.read_csv(smoke_run / "results/report/wisv_summary.csv")
    assert set(wisv["variant"]) == set(WISV_VARIANTS)
    assert "head_relabel_no_csi" in set(wisv["variant"])
    assert set(wisv["channel"]) == {"poor", "good"}
    # Common fading: channel-blind variants over every fading seed, the CSI head over its
    # decoded seeds; every figure with its intervals.
    seeds = wisv.set_index("variant")["seeds"]
    assert (seeds.drop(["wisv_fh", "wisv_sh"]) == 20).all() and (
        seeds[["wisv_fh", "wisv_sh"]] == 1
    ).all()
    for column in ("e2e_latency_s", "latency_reduction", "aal", "rounds_per_answer"):
        assert {column, f"{column}_lo", f"{column}_hi", f"{column}_seed_lo"} <= set(wisv.columns)
    for column in ("task_accuracy", "semantic_accuracy", "answer_fidelity", "accuracy_drop"):
        assert {column, f"{column}_lo", f"{column}_hi"} <= set(wisv.columns)
    vanilla = wisv[wisv["variant"] == "vanilla_sd"]
    assert np.allclose(vanilla["latency_reduction"], 0.0)
    headline = pd.read_csv(smoke_run / "results/report/wisv_headline.csv")
    assert list(headline.columns) == list(HEADLINE_COLUMNS)
    # four figures per pricing regime, and the paper's hardware-testbed latency beside the
    # emulated testbed's
    assert len(headline) == 2 * 4 + 1 and (headline["ours_lo"] <= headline["ours_hi"]).all()
    assert headline["where"].str.startswith(("measured: ", "testbed: ")).all()
    markdown = (smoke_run / "results/report/wisv_summary.md").read_text()
    assert "from the stated answers" in markdown and "head_relabel_no_csi" in markdown
    for name in (
        "cuhlm_throughput_vs_snr",
        "cuhlm_gain_vs_snr",
        "cuhlm_joint_kstar_vs_snr",
        "cuhlm_accuracy_vs_throughput",
        "cuhlm_k_distribution",
        "cuhlm_skip_vs_threshold",
        "wisv_latency_vs_channel",
        "wisv_aal_vs_gamma",
        "wisv_accuracy_vs_tau",
    ):
        assert (smoke_run / f"results/report/{name}.png").stat().st_size > 1000


@pytest.mark.slow
def test_smoke_run_simulates_many_devices_on_one_edge(smoke_run):
    runs = pd.read_parquet(smoke_run / "results/multidevice/vanilla_sd/good.parquet")
    assert sorted(runs["devices"].unique()) == [1, 2, 4, 8, 16, 32]
    assert set(runs["uplink"]) == {"equal_split", "tdma"} and runs["replicate"].nunique() == 20
    assert set(runs["policy"]) == {"base", "max_batch=4", "window=50 ms"}
    # One device in replicate 0 is the single-device evaluation (WISV charges the prefill as
    # every method now does): its throughput is the evaluation's under fading seed 0.
    costs = pd.read_parquet(smoke_run / "results/wisv/measured/metrics/vanilla_sd/good/g4.parquet")
    seed0 = costs[costs["fading_index"] == 0]
    one = runs[(runs["devices"] == 1) & (runs["replicate"] == 0)]
    np.testing.assert_allclose(
        one["aggregate_tps"], seed0["tokens"].sum() / seed0["latency_s"].sum(), rtol=1e-9
    )
    assert (one["single_device_rel_diff"] < 1e-9).all()
    # More devices: more aggregate throughput, fuller batches, a busier edge.
    base = runs[(runs["uplink"] == "equal_split") & (runs["policy"] == "base")]
    med = base.groupby("devices").median(numeric_only=True)
    assert med["aggregate_tps"].is_monotonic_increasing
    assert (
        med.loc[32, "mean_batch"] > 1
        and med.loc[32, "edge_utilisation"] > med.loc[1, "edge_utilisation"]
    )
    summary = pd.read_csv(smoke_run / "results/report/multidevice_summary.csv")
    assert set(summary["method"]) == {
        "hlm",
        "uhlm_risk_prone",
        "cuhlm_online",
        "vanilla_sd",
        "wisv_sh",
    }
    assert set(summary["channel"]) == {"good", "mixed"}
    assert len(summary) == 5 * 2 * 4 * 6
    for column in ("aggregate_tps", "token_latency_p95_s", "edge_utilisation"):
        point, low, high = (summary[c] for c in (column, f"{column}_lo", f"{column}_hi"))
        assert ((low <= point + 1e-12) & (point <= high + 1e-12)).all(), column
    assert (summary.loc[summary["method"] == "wisv_sh", "fading_seeds"] == 1).all()
    capacity = pd.read_csv(smoke_run / "results/report/multidevice_capacity.csv")
    assert len(capacity) == 5 * 2 * 4
    assert (capacity["knee_n_lo"] <= capacity["knee_n_hi"]).all()
    ranking = pd.read_csv(smoke_run / "results/report/multidevice_ranking.csv")
    assert len(ranking) == 5 * 2 * 4 and set(ranking["rank"]) == {1, 2, 3, 4, 5}
    headline = pd.read_csv(smoke_run / "results/report/multidevice_headline.csv")
    assert list(headline.columns) == list(HEADLINE_COLUMNS)  # quality columns left empty
    assert (headline["ours_lo"] <= headline["ours_hi"]).all() and len(headline) == 5 * 5
    markdown = (smoke_run / "results/report/multidevice_summary.md").read_text()
    assert "## Knee and ranking" in markdown and "## Warnings" in markdown
    assert "Equal work on the edge" in markdown and "Which protocol overtakes which" in markdown
    for name in ("multidevice_scaling", "multidevice_utilisation", "multidevice_policies"):
        assert (smoke_run / f"results/report/{name}.png").stat().st_size > 1000


@pytest.mark.slow
def test_second_run_has_nothing_to_do(smoke_run):
    proc = _run(["-n", "--cores", "2", *SMOKE, "--directory", str(smoke_run)], smoke_run)
    assert "Nothing to be done" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_html_report_bundles_figures(smoke_run):
    _run(
        ["--cores", "1", *SMOKE, "--directory", str(smoke_run), "--report", "report.html"],
        smoke_run,
    )
    html = (smoke_run / "report.html").read_text(errors="ignore")
    assert "cuhlm_throughput_vs_snr.png" in html and "wisv_latency_vs_channel.png" in html
    assert "multidevice_scaling.png" in html


@pytest.mark.slow
def test_killed_run_resumes_to_identical_artifacts(smoke_run, tmp_path):
    """Kill a run in the middle of a stage, start it again: same artifacts as the clean run."""
    args = [*SNAKEMAKE, "--cores", "2", *SMOKE, "--directory", str(tmp_path)]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 120
    # Wait until a model stage is under way, then kill the whole process group.
    while time.time() < deadline and not list(tmp_path.glob("results/cuhlm/decode/*/")):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # A killed Snakemake leaves its lock: release it, as the README says, then resume.
    _run(["--unlock", *SMOKE, "--directory", str(tmp_path)], tmp_path)
    _run(["--cores", "2", *SMOKE, "--directory", str(tmp_path), "--rerun-incomplete"], tmp_path)
    for rel in COMPARED:
        a, b = smoke_run / rel, tmp_path / rel
        if rel.endswith(".parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))
        else:
            assert filecmp.cmp(a, b, shallow=False), rel


# What a config change reruns, one key of each class, from the dry run after a complete smoke
# run (Snakemake's default rerun triggers: params, mtime, input, software-env, code).
RERUNS = {
    "threads": ({"models": {"threads": 2}}, {}),
    "theta_tv": (
        {"cuhlm": {"theta_tv": 0.05}},
        {
            "optimize_k": 1,
            "joint_kstar": 1,
            # only the variants that use k* (offline, exact, joint) or theta_tv (online); the
            # smoke datasets (3 evaluation prompts each, batch 6) share one shard
            "decode_cuhlm": 4,
            "join_cuhlm_decode": 4,
            "evaluate_cuhlm": len(CUHLM_VARIANTS),  # every evaluation reads kstar.json (|V|)
            "score_cuhlm": 1,
            "report_cuhlm": 1,
            # the CU-HLM methods of the many-device simulation read k* (hlm, uhlm_risk_prone,
            # cuhlm_online), on the good channel and the mixed population
            "simulate_multidevice": 6,
            "report_multidevice": 1,
            # the testbed's cuhlm_online device reads theta_tv (both channels, its reference)
            "testbed_run": 2,
            "testbed_reference": 1,
            "report_testbed": 1,
            "all": 1,
        },
    ),
    "head hyper-parameter": (
        {"wisv": {"head": {"epochs": 31}}},
        {
            "train_head": 2,  # one head per pricing regime; not mine_labels or relabel_csi
            # head_no_csi (any); head_relabel_no_csi per regime; the CSI head per regime and
            # channel (seed 0)
            "decode_wisv": 1,
            "decode_wisv_regime": 2,
            "decode_wisv_csi": 2 * 2,
            "join_wisv_decode": 1,
            "join_wisv_regime_decode": 6,
            "score_wisv": 1,  # one job scores every decode
            "evaluate_wisv": 2 * 4 * 2,  # per regime, the four head variants on both channels
            "report_wisv": 1,
            # wisv_sh in the many-device simulation is charged its head's measured time (good
            # channel, mixed population)
            "simulate_multidevice": 2,
            "report_multidevice": 1,
            "testbed_run": 2,  # the testbed's WISV edge reads the measured regime's head
            "testbed_reference": 1,
            "report_testbed": 1,
            "all": 1,
        },
    ),
    "channel SNR": (
        {"channels": {"snr_db": [-20, 0, 10]}},
        # re-priced, and the joint k* table re-solved from the saved curves: no decoding
        {"evaluate_cuhlm": len(CUHLM_VARIANTS), "joint_kstar": 1, "report_cuhlm": 1, "all": 1},
    ),
    "head time": (
        {"latency": {"given": {"head_round_s": 0.001}}},
        {
            # the head's time is part of a measured-regime round's cost T_0: that regime's
            # pricing, relabeling, head and CSI decodes follow; the testbed regime's do not
            "profile_head": 1,
            "wisv_pricing": 1,
            "relabel_csi": 1,
            "train_head": 1,
            "decode_wisv": 1,
            "decode_wisv_regime": 1,
            "decode_wisv_csi": 2,
            "join_wisv_decode": 1,
            "join_wisv_regime_decode": 3,
            "score_wisv": 1,
            "evaluate_wisv": 14,
            "report_wisv": 1,
            "simulate_multidevice": 2,  # wisv_sh, good and mixed
            "report_multidevice": 1,
            "testbed_run": 2,
            "testbed_reference": 1,
            "report_testbed": 1,
            "all": 1,
        },
    ),
    "report-only": (
        {"cuhlm": {"risk_budgets": [0.1]}},
        # the joint (u_th, k) table states the budgets at which its choice moves
        {"risk_thresholds": 1, "joint_kstar": 1, "report_cuhlm": 1, "all": 1},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("change", sorted(RERUNS))
def test_a_config_change_reruns_exactly_its_dependants(smoke_run, tmp_path, change):
    override, expected = RERUNS[change]
    cfg = _write_yaml(tmp_path / "change.yaml", override)
    proc = _run(["-n", "--cores", "2", *SMOKE, str(cfg), "--directory", str(smoke_run)], smoke_run)
    assert _job_counts(proc.stdout) == expected, proc.stdout[-3000:]


@pytest.mark.slow
def test_a_dtype_change_does_not_fetch_again(smoke_run, tmp_path):
    cfg = _write_yaml(tmp_path / "change.yaml", {"models": {"dtype": "bfloat16"}})
    proc = _run(["-n", "--cores", "2", *SMOKE, str(cfg), "--directory", str(smoke_run)], smoke_run)
    counts = _job_counts(proc.stdout)
    assert "fetch_models" not in counts and "prepare_data" not in counts
    # they decode in bf16 (the two small smoke datasets are mined as one shard)
    assert counts["collect_traces"] == 2 and counts["mine_labels"] == 1


@pytest.mark.slow
def test_artifacts_are_readable_by_the_group(smoke_run):
    want = 0o666 & ~current_umask()
    for rel in (
        "results/traces/instructions/tokens.parquet",
        "results/traces/instructions/hidden.npz",
        "results/traces/instructions/meta.json",
        "results/wisv/labels/hidden.npz",
        "results/data/arithmetic.jsonl",
        "results/wisv/measured/head/wisv_head.pt",
        "resources/models/tiny_random/target/model.safetensors",
    ):
        assert stat.S_IMODE((smoke_run / rel).stat().st_mode) == want, rel


@pytest.mark.slow
def test_new_working_directory_reuses_a_filled_model_cache(smoke_run, tmp_path):
    """The cluster set-up: one model folder, many workflow clones. A new clone that points at
    a filled cache fetches nothing, and the cache is not touched."""
    cache = smoke_run / "resources" / "models"
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}
    cfg = _write_yaml(tmp_path / "shared.yaml", {"models": {"cache_dir": str(cache)}})
    workdir = tmp_path / "clone"
    workdir.mkdir()
    args = ["--cores", "1", "--directory", str(workdir), *SMOKE, str(cfg)]
    # downloads run where Snakemake runs (the login node of a cluster)
    run = _run(["results/models/provenance.json", *args], workdir)
    assert "localrule fetch_models:" in run.stdout + run.stderr
    log = (workdir / "logs" / "fetch_models.log").read_text()
    assert "is complete; reusing it" in log and "loading" not in log
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == before
    record = read_json(workdir / "results/models/provenance.json")
    assert record["model_dir"] == str(cache / "tiny_random") and record["dtype"] == "float32"
    assert not list(workdir.glob("resources/models/*"))  # nothing fetched here


def _checkout_copy(dest: Path) -> Path:
    """A second checkout at ``dest``: the files git tracks here (and new ones it would track),
    fresh, as a clone writes them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        if (REPO_ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO_ROOT / rel, dest / rel)
    return dest


@pytest.mark.slow
def test_a_checkout_elsewhere_with_the_results_plans_nothing(tmp_path):
    """Inputs and params name no absolute path of the checkout: a second checkout at another
    path and depth, given the first one's results, model cache and .snakemake metadata, has
    nothing to do (a moved checkout reruns nothing)."""
    first = _checkout_copy(tmp_path / "one" / "edgespec")
    second = _checkout_copy(tmp_path / "two" / "deeper" / "edgespec")
    run = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "config/smoke.yaml"]
    subprocess.run(run, cwd=first, check=True, capture_output=True)
    for moved in ("results", "resources", ".snakemake", "logs", "benchmarks"):
        shutil.copytree(first / moved, second / moved, symlinks=True)  # times kept
    recorded = "".join(p.read_text() for p in (second / ".snakemake/metadata").iterdir())
    assert str(first) not in recorded
    proc = subprocess.run([*run, "-n"], cwd=second, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
