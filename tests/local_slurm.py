"""A single-node SLURM on this machine for tests: munged, slurmctld and slurmd from Debian's
packages (``apt-get install slurm-wlm munge``), configured under one folder only (its own
configuration, munge key and socket, state, logs, free ports), so that it never meets the
machine's own SLURM; client commands reach it through wrappers that name its configuration.

One node (the machine's cores and memory as ``slurmd -C`` reports them),
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, no accounting, and
``MinJobAge`` long enough for every finished job to stay listed by ``scontrol`` and
``squeue`` through a test."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "sacct")
SLURM_CONF = """\
ClusterName=edgespectest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/run/munge.socket
SlurmUser={user}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=86400
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=edgespec Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def program(name: str) -> str | None:
    """Where a SLURM or munge program is (None if not installed); the daemons live in
    /usr/sbin, which is not on every user's PATH."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalSlurm:
    """munged, slurmctld and slurmd on this machine, configured under ``root`` only; client
    commands reach them through wrappers in ``root/bin`` that name this configuration (the
    executor plugin's job step clears SLURM_* variables, SLURM_CONF among them)."""

    def __init__(self, root: Path):
        self.root = root
        self.daemons: list[subprocess.Popen] = []
        self.bin = root / "bin"
        self.env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}

    def client(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.bin / args[0]), *args[1:]], capture_output=True, text=True, env=self.env
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def _write_config(self) -> None:
        for sub in ("bin", "run", "state", "spool", "log", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        probe = subprocess.run(
            [program("slurmd"), "-C"], capture_output=True, text=True, check=True
        ).stdout
        node = re.search(r"NodeName=(\S+)", probe).group(1)
        hardware = " ".join(
            re.findall(
                r"(?:CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=\d+",
                probe,
            )
        )
        conf = self.root / "slurm.conf"
        conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname().split(".")[0],
                node=node,
                hardware=hardware,
                ctld_port=free_port(),
                d_port=free_port(),
                root=self.root,
                user=os.environ.get("USER") or "root",
            )
        )
        self.node = node
        for name in CLIENTS:
            wrapper = self.bin / name
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={conf} exec {program(name)} "$@"\n')
            wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def _start(self, name: str, *args: str) -> None:
        out = open(self.root / "log" / f"{name}.out", "w")  # noqa: SIM115 - kept open for it
        env = {**self.env, "SLURM_CONF": str(self.root / "slurm.conf")}
        self.daemons.append(
            subprocess.Popen([program(name), *args], stdout=out, stderr=subprocess.STDOUT, env=env)
        )

    def start(self) -> None:
        self._write_config()
        run, munge = self.root / "run", self.root / "munge"
        # --force: the socket's folder lies under a private (0700) temporary folder
        self._start(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={munge / 'munge.key'}",
            f"--socket={run / 'munge.socket'}",
            f"--pid-file={run / 'munged.pid'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        deadline = time.time() + 20
        while not (run / "munge.socket").exists() and time.time() < deadline:
            time.sleep(0.2)
        self._start("slurmctld", "-D", "-i")
        self._start("slurmd", "-D", "-N", self.node)
        deadline = time.time() + 60
        while time.time() < deadline:
            if any(p.poll() is not None for p in self.daemons):
                break
            state = self.client("sinfo", "-h", "-o", "%T", check=False).strip()
            if state == "idle":
                return
            time.sleep(0.5)
        logs = "".join(
            f"\n--- {p.name}:\n" + p.read_text()[-1500:]
            for p in sorted((self.root / "log").glob("*.out"))
        )
        raise RuntimeError(f"SLURM did not come up (node not idle within 60 s):{logs}")

    def stop(self) -> None:
        """Cancel every job of this cluster, then stop the daemons (terminate, then kill)."""
        if len(self.daemons) == len(DAEMONS) and self.daemons[1].poll() is None:
            jobs = self.client("squeue", "-h", "-o", "%i", check=False).split()
            if jobs:
                self.client("scancel", *jobs, check=False)
                deadline = time.time() + 30
                while (
                    time.time() < deadline
                    and self.client("squeue", "-h", "-o", "%i", check=False).split()
                ):
                    time.sleep(0.5)
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
