"""Start, drive and stop the testbed's three processes (methods §11).

:class:`Testbed` spawns the device, the edge and the link (``edgespec.testbed.workers``), pins
device and edge to one core each, loads their models, connects device to link to edge over
loopback TCP and then runs answers: per :class:`~edgespec.testbed.answer.AnswerJob` it gives
the link its plan, lets edge and device run their halves, and collects the three records.
Nothing waits without a bound: a worker that dies (its exit code is named), a device error
(the edge's ERROR text included) or an answer past its deadline raises :class:`TestbedError`,
and leaving the ``with`` block stops every process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

ROLES = ("edge", "device", "link")


class TestbedError(RuntimeError):
    """The testbed could not run an answer (a worker failed, died or timed out)."""

    __test__ = False  # not a pytest test class


class _Worker:
    def __init__(self, role: str, process: subprocess.Popen, conn: Connection) -> None:
        self.role = role
        self.process = process
        self.conn = conn

    def exited(self) -> int | None:
        return self.process.poll()

    def _exit_code(self) -> int | str:
        try:
            return self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return "unknown (still running)"

    def send(self, command: str, arg=None) -> None:
        self.conn.send((command, arg))

    def result(self, timeout_s: float, what: str):
        """The reply to the last command; TestbedError when it failed, the process died or
        ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.conn.poll(0.2):
                try:
                    status, value = self.conn.recv()
                except EOFError:
                    code = self._exit_code()
                    raise TestbedError(
                        f"the {self.role} process exited with code {code} {what}"
                    ) from None
                if status == "error":
                    raise TestbedError(f"the {self.role} failed {what}: {value}")
                return value
            code = self.exited()
            if code is not None:
                raise TestbedError(f"the {self.role} process exited with code {code} {what}")
            if time.monotonic() > deadline:
                raise TestbedError(f"the {self.role} gave no reply within {timeout_s:.0f} s {what}")

    def call(self, command: str, arg=None, timeout_s: float = 60.0):
        self.send(command, arg)
        return self.result(timeout_s, f"at {command}")


class Testbed:
    """Device, edge and link processes for a series of answers; a context manager.

    ``model_dir`` and ``models``: the cached pair and its load settings (see
    ``workers.load_role``); ``prefill``: prefill store files (empty: each side prefills);
    ``heads``: method -> decision-head file (wisv_fh, wisv_sh); ``frame_s``: how long the rest
    of a begun frame may take; ``log_path``: where the workers log (None: inherit stderr).
    """

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        model_dir,
        models: dict,
        prefill=(),
        heads: dict | None = None,
        frame_s: float = 30.0,
        log_path=None,
        start_timeout_s: float = 900.0,
    ) -> None:
        self.setup = {
            "model_dir": str(model_dir),
            "models": dict(models),
            "prefill": [str(p) for p in prefill],
            "heads": dict(heads or {}),
        }
        self.frame_s = frame_s
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.workers: dict[str, _Worker] = {}
        self.info: dict[str, dict] = {}

    def __enter__(self) -> Testbed:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            for role in ROLES:
                ours, theirs = socket.socketpair()
                command = [sys.executable, "-m", "edgespec.testbed.workers", role]
                command += [str(theirs.fileno()), str(self.log_path or "")]
                process = subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()]
                )
                theirs.close()
                self.workers[role] = _Worker(role, process, Connection(ours.detach()))
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            pins = {"device": cpus[:1], "edge": cpus[1:2] or cpus[:1], "link": []}
            for role, worker in self.workers.items():
                worker.send("setup", {**self.setup, "cpus": pins[role]})
            for role, worker in self.workers.items():
                self.info[role] = worker.result(self.start_timeout_s, "while starting")
            link, edge, device = (self.workers[r] for r in ("link", "edge", "device"))
            link.call("connect", {"port": self.info["edge"]["port"]})
            edge.call("accept", {"frame_s": self.frame_s})
            device.call("connect", {"port": self.info["link"]["port"], "frame_s": self.frame_s})
            link.call("accept")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self.info["edge"]["eos_token_ids"])

    @property
    def draft_dtype(self) -> str:
        return self.info["device"]["dtype"]

    def run(self, job, plan, deadline_s: float) -> tuple[dict, dict, list[dict]]:
        """One answer: (device record, edge record, link records); TestbedError on failure."""
        device, edge, link = (self.workers[r] for r in ("device", "edge", "link"))
        link.call("plan", plan)
        edge.send("answer", job)
        device.send("answer", job)
        what = f"during {job.label}"
        try:
            device_record = device.result(deadline_s, what)
        except TestbedError as err:
            try:
                edge.result(5.0, what)
            except TestbedError as edge_err:
                raise TestbedError(f"{err}; {edge_err}") from err
            raise
        edge_record = edge.result(60.0, what)
        reply = link.call("records", 5.0)
        if reply["error"]:
            raise TestbedError(f"the link failed {what}: {reply['error']}")
        return device_record, edge_record, reply["records"]

    def kill(self, role: str) -> None:
        """Kill one worker at once (SIGKILL): the fault tests' dead edge."""
        self.workers[role].process.kill()

    def __exit__(self, *exc) -> None:
        for worker in self.workers.values():
            if worker.exited() is None:
                try:
                    worker.send("stop")
                except OSError:
                    pass
        for worker in self.workers.values():
            try:
                worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.conn.close()
