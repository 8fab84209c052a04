"""The user-space link emulator: a process between device and edge that delays, rate-limits and
drops frames with retransmission (methods §11).

The link accepts the device's TCP connection, connects to the edge, and pumps whole frames
(``edgespec.testbed.wire``) in both directions, store and forward. Per answer it follows a
:class:`LinkPlan`: the uplink rate of every fading block (the same draws the simulator prices
with), the round-trip time, a packet error rate and the ARQ timeout. A frame of n bytes that
reaches the link at time a is released to the other side at

    uplink:   s = max(a, end of the previous uplink frame); done = s + 8 n / R_block + retx
              release = done + RTT / 2
    downlink: release = max(a + retx + RTT / 2, previous downlink release)   (no rate: the
              papers' convention; ``downlink_rate_bps`` adds 8 n / R_dl)

The frame travels as ceil(n / packet_bytes) packets; each transmission of a packet is lost with
probability PER (a seeded generator per answer), detected after ``arq_timeout_s`` and sent
again, so retx = sum over losses of (timeout + packet bits / R). Frames of one direction keep
their order. Every frame is recorded (bytes, rate, the computed terms, when it arrived and when
it really left). A closed connection on one side closes the other, so a dead edge reaches the
device as an end of stream at once. Torch-free.
"""

from __future__ import annotations

import math
import queue
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from edgespec.testbed.wire import HEADER_BYTES, FrameError, Kind, read_raw_frame

FRAME_S = 30.0
"""How long the rest of a begun frame may take to reach the link [s] (loopback: microseconds)."""


@dataclass(frozen=True)
class LinkPlan:
    """How the link treats one answer's frames.

    ``rates_bps`` the uplink rate of each block [bit/s] (a frame's header names its block);
    ``rtt_s`` [s]; ``packet_error_rate`` in [0, 1); ``packet_bytes`` per packet;
    ``arq_timeout_s`` [s] before a lost packet is sent again (None: one RTT);
    ``downlink_rate_bps`` [bit/s] or None (no downlink rate limit); ``loss_seed`` seeds the
    losses; ``corrupt``: (direction "up" or "down", frame index, "payload" or "length") of
    frames to damage on purpose (fault tests); ``label`` tags the records.
    """

    rates_bps: tuple[float, ...]
    rtt_s: float
    packet_error_rate: float = 0.0
    packet_bytes: int = 1500
    arq_timeout_s: float | None = None
    downlink_rate_bps: float | None = None
    loss_seed: int = 0
    corrupt: tuple[tuple[str, int, str], ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        rates = np.asarray(self.rates_bps, dtype=float)
        if rates.size == 0 or not np.all(np.isfinite(rates)) or np.any(rates <= 0):
            raise ValueError("a link plan needs finite uplink rates > 0, one per block")
        if not (math.isfinite(self.rtt_s) and self.rtt_s >= 0):
            raise ValueError(f"rtt_s must be >= 0, got {self.rtt_s}")
        if not 0 <= self.packet_error_rate < 1:
            raise ValueError(f"packet_error_rate must lie in [0, 1), got {self.packet_error_rate}")
        if self.packet_bytes < 1:
            raise ValueError(f"packet_bytes must be >= 1, got {self.packet_bytes}")

    def rate(self, block: int) -> float:
        if not 0 <= block < len(self.rates_bps):
            raise ValueError(f"frame block {block} outside the plan's {len(self.rates_bps)}")
        return float(self.rates_bps[block])

    @property
    def timeout_s(self) -> float:
        return self.rtt_s if self.arq_timeout_s is None else float(self.arq_timeout_s)


@dataclass(frozen=True)
class Transit:
    """One frame's time on the link [s]: first transmission, retransmissions (timeouts and
    resent packets), propagation (RTT / 2); packets sent once and lost transmissions."""

    tx_s: float
    retx_s: float
    prop_s: float
    packets: int
    lost: int


def transit(
    nbytes: int, rate_bps: float | None, plan: LinkPlan, rng: np.random.Generator
) -> Transit:
    """The time a frame of ``nbytes`` bytes spends on a link of ``rate_bps`` (None: no rate
    limit) under ``plan``'s packet losses, drawn from ``rng`` (one uniform per transmission)."""
    packets = max(1, math.ceil(nbytes / plan.packet_bytes))
    sizes = np.full(packets, plan.packet_bytes, dtype=float)
    sizes[-1] = nbytes - plan.packet_bytes * (packets - 1)
    seconds = (lambda b: 0.0) if rate_bps is None else (lambda b: 8.0 * b / rate_bps)
    lost, retx = 0, 0.0
    if plan.packet_error_rate > 0:
        for size in sizes:
            while rng.random() < plan.packet_error_rate:
                lost += 1
                retx += plan.timeout_s + seconds(size)
    return Transit(seconds(float(nbytes)), retx, plan.rtt_s / 2.0, packets, lost)


def _damage(data: bytes, how: str) -> bytes:
    """A frame with one bit flipped: the payload's last byte, or the length field's lowest bit
    (the receiver then waits for a byte that never comes, or checks a wrong checksum)."""
    raw = bytearray(data)
    if how == "length":
        raw[11] ^= 0x01
    elif how == "payload" and len(raw) > HEADER_BYTES:
        raw[-1] ^= 0x01
    else:
        raw[HEADER_BYTES - 1] ^= 0x01  # no payload: damage the checksum itself
    return bytes(raw)


@dataclass
class _Direction:
    name: str
    src: socket.socket
    dst: socket.socket
    busy_until: float = 0.0
    last_release: float = 0.0
    count: int = 0
    pending: queue.Queue = field(default_factory=queue.Queue)


class Link:
    """Two pumps (device to edge, edge to device) between two connected sockets."""

    def __init__(self, device: socket.socket, edge: socket.socket) -> None:
        self._lock = threading.Lock()
        self._plan: LinkPlan | None = None
        self._rng = np.random.default_rng(0)
        self.records: list[dict] = []
        self.error: str | None = None
        self._dirs = [_Direction("up", device, edge), _Direction("down", edge, device)]
        self._threads = []
        for d in self._dirs:
            for target in (self._read, self._write):
                t = threading.Thread(target=target, args=(d,), daemon=True)
                t.start()
                self._threads.append(t)

    def set_plan(self, plan: LinkPlan) -> None:
        """Follow ``plan`` from the next frame on; clears the records (call between answers)."""
        with self._lock:
            self._plan = plan
            self._rng = np.random.default_rng(plan.loss_seed)
            self.records = []
            for d in self._dirs:
                d.count = 0

    def take_records(self, wait_s: float = 5.0) -> list[dict]:
        """The records of the frames since :meth:`set_plan`, once every frame read has left
        (or ``wait_s`` has passed), in order of arrival."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.records) >= sum(d.count for d in self._dirs):
                    break
            time.sleep(0.005)
        with self._lock:
            out, self.records = self.records, []
        return sorted(out, key=lambda r: r["arrival"])

    def _read(self, d: _Direction) -> None:
        try:
            while True:
                kind, block, data = read_raw_frame(d.src, None, FRAME_S)
                arrival = time.perf_counter()
                with self._lock:
                    plan = self._plan
                    if plan is None:
                        raise RuntimeError("a frame reached the link before its plan")
                    up = d.name == "up"
                    rate = plan.rate(block) if up else plan.downlink_rate_bps
                    t = transit(len(data), rate, plan, self._rng)
                    start = max(arrival, d.busy_until)
                    done = start + t.tx_s + t.retx_s
                    d.busy_until = done
                    release = max(done + t.prop_s, d.last_release)
                    d.last_release = release
                    for where, index, how in plan.corrupt:
                        if where == d.name and index == d.count:
                            data = _damage(data, how)
                    record = {
                        "label": plan.label,
                        "direction": d.name,
                        "index": d.count,
                        "kind": Kind(kind).name if kind in Kind._value2member_map_ else str(kind),
                        "block": int(block),
                        "bytes": len(data),
                        "rate_bps": float(rate) if rate is not None else math.nan,
                        "tx_s": t.tx_s,
                        "retx_s": t.retx_s,
                        "prop_s": t.prop_s,
                        "packets": t.packets,
                        "lost": t.lost,
                        "arrival": arrival,
                        "release": release,
                    }
                    d.count += 1
                d.pending.put((release, data, record))
        except (FrameError, OSError, RuntimeError, ValueError) as exc:
            if not isinstance(exc, FrameError) or exc.problem != "closed":
                self.error = f"link {d.name}: {exc}"
            d.pending.put(None)

    def _write(self, d: _Direction) -> None:
        while True:
            item = d.pending.get()
            if item is None:
                break
            release, data, record = item
            wait = release - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                d.dst.sendall(data)
            except OSError:
                break
            record["sent"] = time.perf_counter()
            with self._lock:
                self.records.append(record)
        # one side is gone: close the other so its peer sees the end at once
        for sock in (d.dst, d.src):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for d in self._dirs:
            for sock in (d.src, d.dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def listen_local() -> socket.socket:
    """A TCP socket listening on an ephemeral loopback port (nothing leaves the machine)."""
    server = socket.create_server(("127.0.0.1", 0))
    return server


def connect_local(port: int, timeout_s: float = 30.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    return sock


def accept_local(server: socket.socket, timeout_s: float = 30.0) -> socket.socket:
    server.settimeout(timeout_s)
    sock, _ = server.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(None)
    return sock
