"""One side's end of the testbed link: sends and receives frames and keeps the clocks.

An :class:`Endpoint` times what its process spends on the link's account: ``serialise_s``
(encoding and decoding payloads, and writing frames to the socket) and ``wait_s`` (blocked until
the other side's frame arrives); it logs every frame it sends with the bits the model prices.
:class:`Stopwatch` sums the seconds of named activities (a model's forwards, the uncertainty
estimate). Clocks: ``time.perf_counter`` (CLOCK_MONOTONIC, one clock for every process on the
machine). Torch-free.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import defaultdict
from collections.abc import Callable

from edgespec.testbed.messages import Encoded
from edgespec.testbed.wire import Frame, FrameError, Kind, expect, read_frame, send_frame


class Stopwatch:
    """Seconds per activity; ``with watch("name"):`` adds the block's duration to ``name``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


class Endpoint:
    """A connected socket to the link (``frame_s``: how long the rest of a begun frame may
    take), with the serialisation and wait clocks and the log of frames sent."""

    def __init__(self, sock: socket.socket, frame_s: float) -> None:
        self.sock = sock
        self.frame_s = frame_s
        self.watch = Stopwatch()
        self.sent: list[dict] = []

    def reset(self) -> None:
        """Forget the clocks and the frames sent (a new answer)."""
        self.watch = Stopwatch()
        self.sent = []

    def restart_clocks(self) -> None:
        """Zero the clocks, keeping the frame log (the timed decode begins)."""
        self.watch = Stopwatch()

    @property
    def serialise_s(self) -> float:
        return self.watch.seconds["serialise"]

    @property
    def wait_s(self) -> float:
        return self.watch.seconds["wait"]

    def send(self, kind: Kind, block: int, encode: Callable[..., Encoded], *args) -> Encoded:
        """``encode(*args)`` (timed as serialisation) sent as one frame; logs its size and
        model bits."""
        with self.watch("serialise"):
            encoded = encode(*args)
            nbytes = send_frame(self.sock, kind, block, encoded.payload)
        self.sent.append(
            {
                "kind": kind.name,
                "block": int(block),
                "bytes": nbytes,
                "model_bits": encoded.model_bits,
                "control_bits": encoded.control_bits,
            }
        )
        return encoded

    def recv(self, wait_s: float | None, *kinds: Kind) -> Frame:
        """The next frame, which must be of one of ``kinds`` (the wait is timed); FrameError
        (``edgespec.testbed.wire``) names a bad, late or unexpected frame."""
        try:
            with self.watch("wait"):
                frame = read_frame(self.sock, wait_s, self.frame_s)
        except FrameError as err:
            names = " or ".join(k.name for k in kinds)
            raise FrameError(err.problem, f"waiting for {names}: {err}") from err
        return expect(frame, *kinds)

    def decode(self, fn: Callable, *args):
        """``fn(*args)``, timed as serialisation."""
        with self.watch("serialise"):
            return fn(*args)
