"""The testbed's processes: device, edge and link, each ``python -m edgespec.testbed.workers``.

A worker talks to the orchestrator (``edgespec.testbed.session``) over a private control
connection (one end of a socket pair it inherits; commands and records travel there, never on
the measured link), pins itself to its CPU, loads its model with one thread and then obeys
commands: the device and edge connect their data sockets through the link and run their half
of each answer (``edgespec.testbed.tokenwise``, ``edgespec.testbed.rounds``); the link pumps
frames (``edgespec.testbed.link``). A command that fails answers ("error", text); the edge also
sends the text to the device as an ERROR frame, so the device stops with the edge's reason.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

log = logging.getLogger("edgespec.testbed")


def load_role(model_dir: str, models: dict, role: str, threads: int):
    """One model of a cached pair (``model_dir``, a fetch_models cache) as the decode stages
    load it (``edgespec.runconfig.load_models``): the run's dtype, linear-weight layout and
    quantisation (config key ``models``), on the CPU with ``threads`` threads."""
    import torch

    from edgespec.models.load import (
        layout_fits_threads,
        load_model,
        pair_source,
        use_transposed_layout,
    )
    from edgespec.models.precision import quantize_for_role, weights_dtype

    torch.set_num_threads(int(threads))
    quantize = models.get("quantize") or "none"
    dtype = weights_dtype(role, quantize, models.get("dtype") or "bfloat16")
    source = pair_source(model_dir, dtype)
    model = load_model(source / role, dtype, role)
    layout = models.get("linear_layout", "plain")
    if layout == "transposed" and layout_fits_threads(models.get("linear_layout_threads"), threads):
        use_transposed_layout({role: model}, {role: source}, quantize, threads)
    return quantize_for_role(model, role, quantize)


MODEL_OF = {"device": "draft", "edge": "target"}
"""The model each side runs."""


def _pin(cpus) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(int(c) for c in cpus))


class _Model:
    """The device's or edge's side: its model, prefill store, socket and (edge) rules."""

    def __init__(self, role: str, setup: dict) -> None:
        from edgespec.decoding.prefill_store import PrefillStore
        from edgespec.models.load import load_tokenizer, stop_token_ids

        self.role = role
        self.model = load_role(setup["model_dir"], setup["models"], MODEL_OF[role], 1)
        stores = setup.get("prefill") or []
        self.prefilled = PrefillStore.load(stores) if stores else None
        self.end = None
        self.rules = {}
        self.info = {"dtype": str(next(self.model.parameters()).dtype).removeprefix("torch.")}
        if role == "edge":
            source = Path(setup["model_dir"])
            tokenizer = load_tokenizer(source / "target", role="target")
            self.info["eos_token_ids"] = stop_token_ids(tokenizer, self.model)
            self.rules = _edge_rules(setup.get("heads") or {})
            self.server = _listen()
            self.info["port"] = self.server.getsockname()[1]

    def handle(self, command: str, arg):
        from edgespec.testbed.endpoint import Endpoint
        from edgespec.testbed.link import accept_local, connect_local

        if command == "connect":  # device: to the link
            self.end = Endpoint(connect_local(arg["port"]), arg["frame_s"])
            return "connected"
        if command == "accept":  # edge: the link's connection
            self.end = Endpoint(accept_local(self.server), arg["frame_s"])
            return "accepted"
        if command == "answer":
            return self._answer(arg)
        raise ValueError(f"unknown command {command!r} for the {self.role}")

    def _answer(self, job) -> dict:
        from edgespec.testbed.answer import TOKENWISE_METHODS
        from edgespec.testbed.rounds import device_rounds, edge_rounds
        from edgespec.testbed.tokenwise import device_tokenwise, edge_tokenwise

        self.end.reset()
        tokenwise = job.method in TOKENWISE_METHODS
        if self.role == "device":
            run = device_tokenwise if tokenwise else device_rounds
            record = run(self.end, self.model, job, self.prefilled)
        elif tokenwise:
            record = edge_tokenwise(self.end, self.model, job, self.prefilled)
        else:
            record = edge_rounds(self.end, self.model, job, self.rules[job.method], self.prefilled)
        clocks = record["clocks"]
        clocks.update(serialise=self.end.serialise_s, wait=self.end.wait_s)
        record["sent"] = list(self.end.sent)
        return record

    def fail(self, text: str) -> None:
        """Tell the device why (edge only; best effort: the socket may be gone)."""
        if self.role == "edge" and self.end is not None:
            from edgespec.testbed.wire import Kind, send_frame

            try:
                send_frame(self.end.sock, Kind.ERROR, 0, text.encode()[-4000:])
            except OSError:
                pass


def _listen():
    from edgespec.testbed.link import listen_local

    return listen_local()


def _edge_rules(heads: dict) -> dict:
    """method -> ``VariantRule`` of the edge's acceptance (``edgespec.wisv.decode``)."""
    from edgespec.wisv.decode import CSI_DECODE, variant_rule

    rules = {"vanilla_sd": variant_rule("vanilla_sd")}
    for method in ("wisv_fh", "wisv_sh"):
        if heads.get(method):
            rules[method] = variant_rule(CSI_DECODE, heads[method])
    return rules


class _LinkSide:
    """The link process: listens for the device, connects to the edge, pumps frames."""

    def __init__(self, setup: dict) -> None:
        self.server = _listen()
        self.info = {"port": self.server.getsockname()[1]}
        self.link = None
        self.edge = None

    def handle(self, command: str, arg):
        from edgespec.testbed.link import Link, accept_local, connect_local

        if command == "connect":
            self.edge = connect_local(arg["port"])
            return "connected"
        if command == "accept":
            self.link = Link(accept_local(self.server), self.edge)
            return "accepted"
        if command == "plan":
            self.link.set_plan(arg)
            return "planned"
        if command == "records":
            return {"records": self.link.take_records(arg), "error": self.link.error}
        raise ValueError(f"unknown command {command!r} for the link")

    def fail(self, text: str) -> None:
        pass


def main(argv: list[str]) -> int:
    role, fd, log_path = argv[0], int(argv[1]), argv[2] if len(argv) > 2 else ""
    if log_path:
        sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s {role}: %(message)s",
        force=True,
    )
    conn = Connection(fd)
    try:
        command, setup = conn.recv()
        if command != "setup":
            raise ValueError(f"expected setup, got {command!r}")
        _pin(setup.get("cpus"))
        side = _LinkSide(setup) if role == "link" else _Model(role, setup)
        conn.send(("ready", side.info))
    except Exception:  # noqa: BLE001 - reported to the orchestrator
        conn.send(("error", traceback.format_exc()))
        return 1
    while True:
        try:
            command, arg = conn.recv()
        except EOFError:
            return 0
        if command == "stop":
            return 0
        try:
            conn.send(("ok", side.handle(command, arg)))
        except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
            text = f"{type(exc).__name__}: {exc}"
            log.error("%s failed:\n%s", command, traceback.format_exc())
            side.fail(text)
            conn.send(("error", text))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
