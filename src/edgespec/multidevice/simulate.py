"""The discrete-event simulation of N devices, one shared uplink band and one batching edge
(methods §10); torch-free.

Each device runs its program (``edgespec.multidevice.workload``): a list of legs, each one of

- ``WAIT`` s: time that contends for nothing (the device's own compute, propagation);
- ``UP`` w: a transmission of w full-band seconds over the shared band
  (``edgespec.multidevice.uplink``);
- ``VERIFY`` t: a verification request to the edge over t new tokens per row, batched with
  other devices' (priced by ``edge.EdgeCost``: one flattened forward over the batch's rows);
- ``SOLO`` s: an edge job of s seconds served alone (a prompt's prefill), in the same queue;
- ``END``: the current step (a token or a round) is committed.

A device never has more than one leg in progress; its next leg starts when the previous ends.
The event queue orders every start and end by time, ties by the order they were scheduled, so
a run is deterministic. A device's waits are added up inline (no event each), and its steps'
end times are recorded as they happen.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from edgespec.multidevice.edge import BatchingPolicy, EdgeCost
from edgespec.multidevice.uplink import make_uplink

WAIT, UP, VERIFY, SOLO, END = range(5)
LEG_NAMES = ("WAIT", "UP", "VERIFY", "SOLO", "END")


@dataclass
class SimulationResult:
    """What one run of :func:`simulate` measured.

    ``step_ends``: per device, the time each of its steps (tokens, rounds, prefills) ended [s];
    ``finish_s``: per device, when its last step ended [s]; ``edge_busy_s``: seconds the edge
    computed; ``batch_sizes``: the size of each verification batch, in order; ``solo_jobs``:
    edge jobs served alone; ``served``: every request the edge finished, as (device, leg
    index), in the order they finished; ``edge_wait_s``: summed time requests waited in the
    queue [s]; ``uplink_busy_s``: seconds the band carried data; ``transmissions``: uplink
    transmissions started; ``extrapolated_batches``: verification batches whose mean tokens
    per row lay above the largest timed count; ``prefill_busy_s``: the part of ``edge_busy_s``
    spent on jobs served alone (prefills).
    """

    step_ends: list[np.ndarray]
    finish_s: np.ndarray
    edge_busy_s: float
    batch_sizes: list[int]
    solo_jobs: int
    served: list[tuple[int, int]] = field(repr=False)
    edge_wait_s: float
    uplink_busy_s: float
    transmissions: int
    extrapolated_batches: int = 0
    prefill_busy_s: float = 0.0

    @property
    def makespan_s(self) -> float:
        return float(self.finish_s.max()) if len(self.finish_s) else 0.0

    def step_latencies(self, device: int) -> np.ndarray:
        """Each step's latency on ``device`` [s]: its end minus the previous step's end (the
        device starts at 0)."""
        ends = self.step_ends[device]
        return np.diff(ends, prepend=0.0)


def _edge_requests(program) -> int:
    known = getattr(program, "edge_requests", None)
    if known is not None:
        return int(known)
    return sum(1 for op, _ in getattr(program, "legs", program) if op in (VERIFY, SOLO))


def simulate(
    programs,
    uplink: str,
    edge: EdgeCost,
    policy: BatchingPolicy,
    slot_s: float = 0.0,
    unlimited_edge: bool = False,
) -> SimulationResult:
    """Run the devices' ``programs`` (sequences of ``(leg, value)``; ``.legs`` of
    ``workload.DeviceProgram`` or plain lists) to the end.

    ``uplink``: ``equal_split`` or ``tdma`` (slot ``slot_s`` seconds, device i owning slot i);
    ``edge`` prices a batch of verification requests from their tokens per row; ``policy``:
    when the edge starts a batch and how large. ``unlimited_edge`` serves every request at
    once, alone, at its single-request time (an edge with unlimited capacity: no queue, no
    batching).
    """
    legs_of = [getattr(p, "legs", p) for p in programs]
    devices = len(legs_of)
    if devices < 1:
        raise ValueError("need at least one device")
    heap: list = []
    counter = itertools.count()

    def schedule(time, action, *args):
        heapq.heappush(heap, (time, next(counter), action, args))

    pointer = [0] * devices
    ends: list[list[float]] = [[] for _ in range(devices)]
    finish = np.zeros(devices)
    pending = [_edge_requests(p) for p in programs]
    could_send = sum(1 for p in pending if p > 0)  # devices with an edge request ahead
    queue: list[tuple[int, int, int, float, float]] = []  # (device, leg, kind, value, arrival)
    state = {
        "busy": False,
        "kick": False,
        "busy_s": 0.0,
        "solo_s": 0.0,
        "wait_s": 0.0,
        "solo": 0,
        "window": -1.0,
    }
    batch_sizes: list[int] = []
    served: list[tuple[int, int]] = []
    max_batch = policy.largest_batch(devices)
    top_tokens = max(edge.times.table)
    extrapolated = 0

    def advance(device: int, now: float) -> None:
        legs = legs_of[device]
        i = pointer[device]
        t = now
        n = len(legs)
        while i < n:
            op, value = legs[i]
            if op == WAIT:
                t += value
                i += 1
                continue
            if op == END:
                ends[device].append(t)
                i += 1
                continue
            if t > now:  # the next leg contends: start it at its own time
                pointer[device] = i
                schedule(t, resume, device)
                return
            pointer[device] = i + 1
            if op == UP:
                link.start(device, value, t)
            else:
                arrive(device, i, op, value, t)
            return
        pointer[device] = n
        finish[device] = t

    def resume(now: float, device: int) -> None:
        advance(device, now)

    def link_done(device: int, now: float) -> None:
        advance(device, now)

    link = make_uplink(uplink, schedule, link_done, devices, slot_s)

    def arrive(device: int, leg: int, kind: int, value: float, now: float) -> None:
        if unlimited_edge:
            if kind == SOLO:
                state["solo"] += 1
                state["solo_s"] += value
                duration = value
            else:
                batch_sizes.append(1)
                duration = edge.alone_s(int(value))
            state["busy_s"] += duration
            schedule(now + duration, finish_alone, device, leg)
            return
        queue.append((device, leg, kind, value, now))
        if not state["busy"] and not state["kick"]:
            # Decide once every request arriving at this instant is in the queue: after the
            # events already scheduled for now.
            state["kick"] = True
            schedule(now, kick)

    def kick(now: float) -> None:
        state["kick"] = False
        try_start(now)

    def served_once(device: int, leg: int) -> None:
        nonlocal could_send
        served.append((device, leg))
        pending[device] -= 1
        if pending[device] < 0:
            raise RuntimeError(f"device {device}'s request (leg {leg}) was served twice")
        if pending[device] == 0:
            could_send -= 1

    def finish_alone(now: float, device: int, leg: int) -> None:
        served_once(device, leg)
        advance(device, now)

    def try_start(now: float) -> None:
        nonlocal extrapolated
        if state["busy"] or not queue:
            return
        head = queue[0]
        if head[2] == SOLO:
            batch = [queue.pop(0)]
            duration = head[3]
            state["solo"] += 1
            state["solo_s"] += duration
        else:
            waiting = sum(1 for r in queue if r[2] == VERIFY)
            enough = min(max_batch, could_send)
            deadline = head[4] + policy.window_s
            if waiting < enough and now < deadline:
                if state["window"] != deadline:  # one wake-up per oldest request
                    state["window"] = deadline
                    schedule(deadline, window_over)
                return
            batch, rest = [], []
            for request in queue:
                if request[2] == VERIFY and len(batch) < max_batch:
                    batch.append(request)
                else:
                    rest.append(request)
            queue[:] = rest
            rows = [int(r[3]) for r in batch]
            duration = edge.batch_s(rows)
            if sum(rows) > top_tokens * len(rows):
                extrapolated += 1
            batch_sizes.append(len(batch))
        state["busy"] = True
        state["busy_s"] += duration
        state["wait_s"] += sum(now - r[4] for r in batch)
        schedule(now + duration, batch_done, batch)

    def window_over(now: float) -> None:
        try_start(now)

    def batch_done(now: float, batch) -> None:
        state["busy"] = False
        for device, leg, *_ in batch:
            served_once(device, leg)
        for device, *_ in batch:
            advance(device, now)
        try_start(now)

    for device in range(devices):
        advance(device, 0.0)
    while heap:
        time, _, action, args = heapq.heappop(heap)
        action(time, *args)
    if queue or any(p < len(legs) for p, legs in zip(pointer, legs_of, strict=True)):
        raise RuntimeError("the simulation ended with work left (a request was never served)")
    return SimulationResult(
        step_ends=[np.asarray(e) for e in ends],
        finish_s=finish,
        edge_busy_s=state["busy_s"],
        batch_sizes=batch_sizes,
        solo_jobs=state["solo"],
        served=served,
        edge_wait_s=state["wait_s"],
        uplink_busy_s=link.busy_s,
        transmissions=link.transmissions,
        extrapolated_batches=extrapolated,
        prefill_busy_s=state["solo_s"],
    )
