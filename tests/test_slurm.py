"""The workflow on SLURM: what the two cluster profiles ask for (dry runs, parsed by the SLURM
executor plugin without submitting), and the smoke workflow run through sbatch on a real
single-node SLURM started here from Debian's packages (slurm-wlm, munge), with one job
cancelled by scancel and the run resumed.

The real-cluster test is marked ``cluster`` (and ``slow``): ``pytest -m cluster`` runs it. It
needs munged, slurmctld, slurmd and the SLURM client commands (``apt-get install slurm-wlm
munge``) and is skipped, saying why, where they are missing or do not start; with
``EDGESPEC_REQUIRE_SLURM=1`` (as CI sets) that is a failure instead. The daemons run on free
ports with their own configuration, key, sockets and state under a temporary folder, never the
machine's own SLURM (``local_slurm.LocalSlurm``), and are stopped when the tests end, failed or
not."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_slurm import CLIENTS, DAEMONS, LocalSlurm, program

from edgespec.config import REPO_ROOT
from edgespec.runcompare import compare_runs

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
    "decode_wisv_regime",
    "decode_wisv_csi",
    "testbed_run",
    "testbed_reference",
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
# members: 11 evaluate_cuhlm + joint_kstar, and evaluate_wisv for 2 pricing regimes (smoke: 6
# variants x 2 channels x 1 gamma x 2 = 24 in one group; paper: x 3 gammas = 72 in 3 of <= 30)
@pytest.mark.parametrize(("config", "groups", "members"), [("smoke", 2, 36), ("paper", 4, 84)])
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


# ---------------------------------------------------------------------------- a real SLURM


def _unavailable(reason: str):
    """Skip (a laptop without SLURM), or fail where a cluster test must run (CI)."""
    if os.environ.get("EDGESPEC_REQUIRE_SLURM") == "1":
        pytest.fail(f"EDGESPEC_REQUIRE_SLURM=1, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [name for name in (*DAEMONS, *CLIENTS) if program(name) is None]
    if missing:
        _unavailable(
            f"SLURM is not installed here (no {', '.join(missing)}): "
            "apt-get install slurm-wlm munge"
        )
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception as err:  # noqa: BLE001 - any failure to start is reported the same way
        cluster.stop()
        _unavailable(f"a local SLURM did not start: {type(err).__name__}: {err}")
    try:
        yield cluster
    finally:
        cluster.stop()


def _snakemake_through_slurm(workdir: Path, slurm: LocalSlurm, log: Path) -> subprocess.Popen:
    """The smoke workflow with the CPU profile, as a user would run it on a cluster without
    job accounting (squeue for the status), checking soon after each submission (the
    plugin's first check waits 40 s by default), without retries: a cancelled job fails."""
    args = [
        *SNAKEMAKE,
        "--workflow-profile",
        str(PROFILES / "slurm-cpu"),
        "--configfile",
        CONFIGS["smoke"],
        "--directory",
        str(workdir),
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--slurm-keep-successful-logs",
        "--retries",
        "0",
    ]
    out = open(log, "w")  # noqa: SIM115 - the process writes it; closed with the file object
    return subprocess.Popen(
        args,
        cwd=workdir,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=slurm.env,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> int:
    """The run's exit status; killed (its whole process group) if it overruns."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # Snakemake cancels its SLURM jobs on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise


def _cancel_a_running_decode(slurm: LocalSlurm, proc: subprocess.Popen) -> str | None:
    """scancel a decode_cuhlm job while it runs; its SLURM job id (None if none was caught
    running before the run ended)."""
    while proc.poll() is None:
        listed = slurm.client("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k", check=False)
        for line in listed.splitlines():
            jobid, comment = line.split("|", 1)
            if comment.startswith("rule_decode_cuhlm"):
                slurm.client("scancel", jobid, check=False)
                time.sleep(1)
                state = slurm.client("scontrol", "show", "job", jobid, check=False)
                if "JobState=CANCELLED" in state:
                    return jobid
        time.sleep(0.2)
    return None


# The smoke run's rules that run as SLURM jobs of their own (the others are local rules, or
# the grouped evaluations).
SLURM_RULES = MODEL_RULES | {
    "fit_calibration",
    "relabel_csi",
    "train_head",
    "score_cuhlm",
    "score_wisv",
    "simulate_multidevice",
}


def _submitted(log: Path) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", log.read_text())


@pytest.mark.slow
@pytest.mark.cluster
def test_smoke_workflow_through_sbatch_equals_a_local_run(slurm, tmp_path):
    """Every job that is not a local rule goes through sbatch (group jobs included); one is
    cancelled with scancel while it runs, the run is started again and completes; the results
    are a local run's."""
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    for workdir in (local, cluster):
        workdir.mkdir()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    # a local run beside it, on one core (a cluster job's threads, and so the same records)
    reference = subprocess.Popen(
        [*SNAKEMAKE, "--cores", "1", "--configfile", CONFIGS["smoke"], "--directory", str(local)],
        cwd=local,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    first = _snakemake_through_slurm(cluster, slurm, first_log)
    cancelled = _cancel_a_running_decode(slurm, first)
    assert _finish(first, timeout=1800) != 0, first_log.read_text()[-3000:]
    assert cancelled is not None, "no decode_cuhlm job was caught running"
    assert f"SLURM-job '{cancelled}' failed, SLURM status is: 'CANCELLED'" in first_log.read_text()
    assert _finish(reference, timeout=1800) == 0
    # resume: the same command again
    second = _snakemake_through_slurm(cluster, slurm, second_log)
    assert _finish(second, timeout=1800) == 0, second_log.read_text()[-3000:]
    assert compare_runs(local, cluster) == []  # the tables of the local run
    # the jobs really went through sbatch: every SLURM job id the runs report is known to
    # slurmctld (it keeps finished jobs for MinJobAge) and has its SLURM log, every rule that
    # is not a local rule ran as SLURM jobs, and only the cancelled job did not complete
    first_ids, second_ids = _submitted(first_log), _submitted(second_log)
    jobs = {}
    for line in slurm.client("scontrol", "show", "job", "-o").splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        jobs[fields["JobId"]] = fields
    assert sorted(first_ids + second_ids, key=int) == sorted(jobs, key=int)
    assert {jobid for jobid, job in jobs.items() if job["JobState"] != "COMPLETED"} == {cancelled}
    assert cancelled in first_ids
    root = cluster / ".snakemake" / "slurm_logs"  # <rule or group>/[<wildcards>/]<job id>.log
    logs = {path.stem: path.relative_to(root).parts[0] for path in root.rglob("*.log")}
    assert set(logs) == set(jobs)
    assert {logs[jobid] for jobid in jobs} == {f"rule_{rule}" for rule in SLURM_RULES} | {
        "group_evaluate_cuhlm_evaluate_cuhlm_joint_kstar",
        "group_evaluate_wisv_evaluate_wisv",
    }
    # the resumed run did only what the cancelled decode held back: the decode, CU-HLM's
    # evaluations, its scores, and the many-device simulation where the cancelled variant is
    # one of its methods (which decode is caught running varies)
    resumed = {logs[jobid] for jobid in second_ids}
    held_back = {
        "rule_decode_cuhlm",
        "group_evaluate_cuhlm_evaluate_cuhlm_joint_kstar",
        "rule_score_cuhlm",
    }
    assert held_back <= resumed <= held_back | {"rule_simulate_multidevice"}, resumed
    # each group job (all the smoke run's evaluations in two) asked for one core and 4 GB
    groups = [jobid for jobid in jobs if logs[jobid].startswith("group_")]
    assert len(groups) == 2
    for jobid in groups:
        assert jobs[jobid]["NumCPUs"] == "1" and "mem=4000M" in jobs[jobid]["TRES"], jobs[jobid]
