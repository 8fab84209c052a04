"""The workflow on SLURM: what the two cluster profiles ask for, from dry runs parsed by the SLURM
executor plugin without submitting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.config import REPO_ROOT

if os.environ.get("EDGESPEC_REQUIRE_SLURM") != "1":  # in CI a missing plugin is an error
    pytest.importorskip("snakemake_executor_plugin_slurm")

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO_ROOT / "Snakefile")]
PROFILES = REPO_ROOT / "workflow" / "profiles"
CONFIGS = {name: str(REPO_ROOT / "config" / f"{name}.yaml") for name in ("smoke", "paper")}
STUDIES = ({"evaluate_cuhlm", "joint_kstar"}, {"evaluate_wisv"})

# A dry run that also prints, for every group job, the sbatch command the SLURM plugin would
# submit for it (its own get_submit_command) and the group's members.
GROUP_PROBE = """
import json, sys
import snakemake.jobs
from snakemake.cli import main
from snakemake_executor_plugin_slurm.submit_string import get_submit_command

shown = snakemake.jobs.GroupJob.log_info
PARAMS = dict(run_uuid="probe", slurm_logfile="probe.log", comment_str="probe", account="",
              partition="", workdir="")

def log_info(self):
    members = [[j.rule.name, j.resources.get("mem_mb"), j.resources.get("runtime")]
               for j in self.jobs]
    call = get_submit_command(self, PARAMS)
    print("GROUP " + json.dumps({"group": self.groupid, "members": members, "sbatch": call}),
          flush=True)
    shown(self)

snakemake.jobs.GroupJob.log_info = log_info
sys.exit(main())
"""


def _dry_run(profile: str, config: str, tmp_path: Path, *extra: str, env=None) -> str:
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "--workflow-profile", str(PROFILES / profile)]
        + ["--configfile", CONFIGS[config], *extra, "--directory", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _resources(stdout: str) -> dict[str, list[str]]:
    """Rule -> the resources line of each of its jobs in a dry run."""
    out: dict[str, list[str]] = {}
    for block in stdout.split("rule ")[1:]:
        rule = block.split(":", 1)[0]
        found = re.search(r"resources: (.*)", block)
        if found and re.fullmatch(r"\w+", rule):
            out.setdefault(rule, []).append(found.group(1))
    return out


MODEL_RULES = {
    "select_dtype",
    "prefill_prompts",
    "collect_traces",
    "optimize_k",
    "decode_cuhlm",
    "mine_labels",
    "decode_wisv",
    "decode_wisv_csi",
}


def test_cpu_profile_asks_for_no_gpu_and_sizes_jobs_from_the_pair(tmp_path):
    accounts = {"SBATCH_ACCOUNT": "acct", "SBATCH_PARTITION": "part"}
    smoke = _resources(_dry_run("slurm-cpu", "smoke", tmp_path, env=accounts))
    default = _resources(
        subprocess.run(
            [*SNAKEMAKE, "-n", "--workflow-profile", str(PROFILES / "slurm-cpu")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        ).stdout
    )
    for rules in (smoke, default):
        assert MODEL_RULES <= set(rules)
        assert not [line for lines in rules.values() for line in lines if "gpu" in line]
    # a model job's memory from the pair (what fetching it needs, plus 4 GB), its threads the
    # config's (models.threads, no cpus_per_task: the plugin asks for as many cpus)
    for rule in MODEL_RULES:
        assert all("mem_mb=6000," in line for line in smoke[rule]), rule  # tiny_random
        assert all("mem_mb=15240," in line for line in default[rule]), rule  # the default pair
    assert not [line for lines in smoke.values() for line in lines if "cpus_per_task" in line]
    # account and partition from sbatch's variables, added to the jobs' resources
    assert all("slurm_account=acct" in line for line in smoke["decode_cuhlm"])
    assert all("slurm_partition=part" in line for line in smoke["evaluate_wisv"])


def test_gpu_profile_asks_for_a_gpu_only_for_jobs_that_load_the_pair(tmp_path):
    """config/paper.yaml runs the models on the GPU (models.device cuda): its model stages ask
    for one; the evaluations, the reports' inputs and the latency profiles it gives (latency
    mode given) load no model and ask for none."""
    rules = _resources(_dry_run("slurm-gpu", "paper", tmp_path))
    for rule, lines in rules.items():
        gpu = rule in MODEL_RULES
        for line in lines:
            assert ("gpu=1" in line) == gpu, (rule, line)
            if gpu:  # and the profile's cores and memory for the papers' pairs
                memory = "mem_mb=8000," if rule == "select_dtype" else "mem_mb=64000,"
                assert memory in line and "cpus_per_task=8" in line, (rule, line)
    assert {"profile_latency", "evaluate_cuhlm", "evaluate_wisv", "joint_kstar"} <= set(rules)
    # measured latencies load the pair: then the profiles ask for the GPU too
    measured = tmp_path / "measured.yaml"
    measured.write_text("latency:\n  mode: measured\n")
    rules = _resources(_dry_run("slurm-gpu", "paper", tmp_path, str(measured)))
    assert all("gpu=1" in line for line in rules["profile_latency"] + rules["profile_batching"])
    # the smoke config keeps its models on the CPU: no job asks for a GPU there
    smoke = _resources(_dry_run("slurm-gpu", "smoke", tmp_path))
    assert not [line for lines in smoke.values() for line in lines if "gpu" in line]


def _group_jobs(profile: str, config: str, tmp_path: Path) -> list[dict]:
    # A cluster run sets no core count, so a group's cores are not capped there; a dry run
    # defaults to one core, which would hide a group's summed cores: give it plenty.
    proc = subprocess.run(
        [sys.executable, "-c", GROUP_PROBE, "-n", "--cores", "100000"]
        + ["--snakefile", str(REPO_ROOT / "Snakefile")]
        + ["--workflow-profile", str(PROFILES / profile), "--configfile", CONFIGS[config]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line[6:]) for line in proc.stdout.splitlines() if line.startswith("GROUP ")]


@pytest.mark.parametrize("profile", ["slurm-cpu", "slurm-gpu"])
@pytest.mark.parametrize(("config", "groups", "members"), [("smoke", 2, 24), ("paper", 3, 48)])
def test_group_jobs_ask_for_one_members_cores_and_memory_per_study(
    tmp_path, profile, config, groups, members
):
    """A group job runs its members one after another (the profiles' group_slots: 1): it asks
    for one core and its largest member's memory, for the sum of their runtimes; the
    evaluations of CU-HLM and WISV never share one."""
    jobs = _group_jobs(profile, config, tmp_path)
    assert len(jobs) == groups
    assert sum(len(job["members"]) for job in jobs) == members
    for job in jobs:
        rules = {rule for rule, _, _ in job["members"]}
        assert any(rules <= study for study in STUDIES), rules
        assert job["group"] == ("evaluate_wisv" if "evaluate_wisv" in rules else "evaluate_cuhlm")
        call = job["sbatch"]
        assert "--cpus-per-task=1" in call.split(), call
        assert f"--mem {max(mem for _, mem, _ in job['members'])} " in call, call
        assert f"-t {sum(minutes for _, _, minutes in job['members'])} " in call, call
        assert "gpu" not in call and "--gres" not in call
