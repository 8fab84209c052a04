"""How N devices share one uplink band of width W (methods §10); torch-free.

A transmission is given as its *work*: the seconds it would take its device alone on the
whole band, ``bits / R`` with R = W log2(1 + SNR |h|^2) at the device's own fading gain for
that token or round (the single-device evaluation's upload time). Every device transmits at
the same power spectral density, so its SNR does not depend on the share of the band it gets
and its rate is proportional to that share.

- ``equal_split`` (:class:`EqualSplitUplink`): the devices transmitting at the same moment
  split the band equally (processor sharing): with n of them active, each progresses at 1/n
  of its own full-band rate, and a lone transmitter has the whole band (work-conserving).
  Implemented with virtual time: V advances at rate 1/n, a transmission that starts at V_a
  ends when V reaches V_a + work, so completions come in order of that tag.
- ``tdma`` (:class:`TdmaUplink`): a frame of N slots of ``slot_s`` seconds; device i transmits
  on the whole band in slot i of every frame and waits otherwise, whether or not the others
  have anything to send (not work-conserving). ``slot_s`` 0 is the fluid limit: every device
  has a fixed 1/N of the band.

Either way the band carries data for exactly the sum of the works (``busy_s``), which gives
the uplink utilisation. One device (N = 1) has the band to itself under both schemes: its
transmissions take exactly their work.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

UPLINK_SCHEMES = ("equal_split", "tdma")


def tdma_finish(start: float, work: float, slot: int, slots: int, slot_s: float) -> float:
    """When a transmission of ``work`` full-band seconds that is ready at ``start`` ends, for
    the device owning slot ``slot`` of a frame of ``slots`` slots of ``slot_s`` seconds
    (frames start at 0; ``slot_s`` 0 is the fluid share ``start + work * slots``)."""
    if work <= 0:
        return start
    if slots == 1:
        return start + work  # one device owns every slot: the band is its own
    if slot_s == 0:
        return start + work * slots
    frame = slots * slot_s
    offset = slot * slot_s
    k = math.floor((start - offset) / frame)
    slot_start = offset + k * frame
    if start >= slot_start + slot_s:  # past this frame's slot: the next frame's
        slot_start += frame
    begin = max(start, slot_start)
    available = slot_start + slot_s - begin
    if work <= available:
        return begin + work
    rest = work - available
    full = math.floor(rest / slot_s)
    partial = rest - full * slot_s
    if partial <= 0:
        return slot_start + full * frame + slot_s
    return slot_start + (full + 1) * frame + partial


class EqualSplitUplink:
    """The band split equally among the devices transmitting at the same time (module
    docstring). ``schedule(time, action, *args)`` enqueues an event; ``done(device, time)`` is
    called when a device's transmission ends."""

    def __init__(self, schedule: Callable, done: Callable[[int, float], None]):
        self._schedule = schedule
        self._done = done
        self._active: list[tuple[float, int, int]] = []  # (finish tag, seq, device)
        self._seq = 0
        self._virtual = 0.0
        self._last = 0.0
        self._version = 0
        self.busy_s = 0.0
        self.transmissions = 0

    def _advance(self, now: float) -> None:
        if self._active:
            self._virtual += (now - self._last) / len(self._active)
        self._last = now

    def _next_completion(self, now: float) -> None:
        self._version += 1
        if self._active:
            tag = self._active[0][0]
            wait = max(tag - self._virtual, 0.0) * len(self._active)
            self._schedule(now + wait, self._complete, self._version)

    def start(self, device: int, work: float, now: float) -> None:
        """Device ``device`` starts sending ``work`` full-band seconds at ``now``."""
        self.busy_s += work
        self.transmissions += 1
        if work <= 0:
            self._done(device, now)
            return
        self._advance(now)
        heapq.heappush(self._active, (self._virtual + work, self._seq, device))
        self._seq += 1
        self._next_completion(now)

    def _complete(self, now: float, version: int) -> None:
        if version != self._version:  # someone started or finished since: rescheduled
            return
        self._advance(now)
        tag, _, device = heapq.heappop(self._active)
        self._virtual = max(self._virtual, tag)  # absorb rounding
        self._next_completion(now)
        self._done(device, now)


class TdmaUplink:
    """Fixed TDMA slots, one per device (module docstring); same interface as
    :class:`EqualSplitUplink`."""

    def __init__(
        self,
        schedule: Callable,
        done: Callable[[int, float], None],
        devices: int,
        slot_s: float,
    ):
        if devices < 1:
            raise ValueError(f"need at least one device, got {devices}")
        if not (math.isfinite(slot_s) and slot_s >= 0):
            raise ValueError(f"slot_s must be a finite time >= 0 s, got {slot_s!r}")
        self._schedule = schedule
        self._done = done
        self._devices = int(devices)
        self._slot_s = float(slot_s)
        self.busy_s = 0.0
        self.transmissions = 0

    def start(self, device: int, work: float, now: float) -> None:
        self.busy_s += work
        self.transmissions += 1
        if work <= 0:
            self._done(device, now)
            return
        end = tdma_finish(now, work, device, self._devices, self._slot_s)
        self._schedule(end, self._complete, device)

    def _complete(self, now: float, device: int) -> None:
        self._done(device, now)


def make_uplink(scheme: str, schedule: Callable, done: Callable, devices: int, slot_s: float):
    """The uplink of ``scheme`` (one of :data:`UPLINK_SCHEMES`)."""
    if scheme == "equal_split":
        return EqualSplitUplink(schedule, done)
    if scheme == "tdma":
        return TdmaUplink(schedule, done, devices, slot_s)
    raise ValueError(f"unknown uplink scheme {scheme!r}; known: {', '.join(UPLINK_SCHEMES)}")
