"""The testbed's wire format: length-prefixed frames with a 16-byte header (methods §11).

Every message between device and edge is one frame::

    offset  size  field
    0       2     magic b"ES"
    2       1     version (1)
    3       1     kind (:class:`Kind`)
    4       4     block: the fading block the frame is sent in (token position or round), u32
    8       4     length of the payload in bytes, u32 (at most MAX_PAYLOAD)
    12      4     CRC-32 (zlib) of bytes 0..11 and the payload
    16      n     payload (a bit-packed message, ``edgespec.testbed.messages``)

All integers are big-endian. The checksum covers the header too, so a corrupted length, kind or
block is detected like a corrupted payload; a length corrupted upwards leaves the reader waiting
for bytes that never come, which the frame timeout turns into a named error. The link emulator
reads ``block`` to charge the frame at its block's rate. Torch-free.
"""

from __future__ import annotations

import enum
import socket
import struct
import time
import zlib
from dataclasses import dataclass

MAGIC = b"ES"
VERSION = 1
HEADER = struct.Struct(">2sBBIII")
HEADER_BYTES = HEADER.size
"""Bytes of framing per message: the overhead the testbed adds to the model's payload."""
MAX_PAYLOAD = 64 * 1024 * 1024
"""Largest payload a frame may announce [bytes]; a larger length field is a corrupted frame."""


class Kind(enum.IntEnum):
    """Message kinds; U = device to edge (uplink), D = edge to device (downlink)."""

    PROMPT = 1  # U: the prompt's token ids (before the timed decode)
    READY = 2  # D: the edge holds the prompt's prefill
    TOKEN_UP = 3  # U: CU-HLM upload (top-k values and indices, d, resync ids)
    TOKEN_VERDICT = 4  # D: the committed token id
    DRAFT_IDS = 5  # U: gamma draft ids (vanilla SD, SH's first message)
    DRAFT_FH = 6  # U: gamma ids and gamma draft hidden states (FH)
    REQUEST = 7  # D: SH's gamma-bit mismatch mask
    HIDDEN = 8  # U: SH's hidden states of the masked positions
    ROUND_VERDICT = 9  # D: accepted count and the repair or bonus id
    END = 10  # U: the answer is complete
    ERROR = 11  # D: the edge failed (UTF-8 text), then closes


UPLINK_KINDS = frozenset(
    {Kind.PROMPT, Kind.TOKEN_UP, Kind.DRAFT_IDS, Kind.DRAFT_FH, Kind.HIDDEN, Kind.END}
)
TIMED_KINDS = frozenset(Kind) - {Kind.PROMPT, Kind.READY, Kind.END, Kind.ERROR}
"""Kinds of the decode phase, which the latency comparison covers."""


class FrameError(RuntimeError):
    """A frame that cannot be read; ``problem`` names what: magic, version, kind, length,
    checksum, truncated (the stream ended or stalled mid-frame), timeout (no frame began in
    time) or closed (the peer closed the connection between frames)."""

    def __init__(self, problem: str, message: str) -> None:
        super().__init__(f"{problem}: {message}")
        self.problem = problem


@dataclass(frozen=True)
class Frame:
    kind: Kind
    block: int
    payload: bytes

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: header and payload."""
        return HEADER_BYTES + len(self.payload)


def encode_frame(kind: Kind, block: int, payload: bytes) -> bytes:
    """The bytes of one frame (header with checksum, then ``payload``)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    if not 0 <= block < 2**32:
        raise ValueError(f"block {block} does not fit in 32 bits")
    head = HEADER.pack(MAGIC, VERSION, int(kind), block, len(payload), 0)[:12]
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + struct.pack(">I", crc) + payload


def _recv_exact(sock: socket.socket, count: int, deadline: float | None, what: str) -> bytes:
    """``count`` bytes from ``sock``; FrameError when the peer closes or the deadline passes
    first (``what`` names the part being read)."""
    chunks, got = [], 0
    while got < count:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameError(
                    "truncated" if got or what != "header" else "timeout",
                    f"{got} of {count} bytes of the {what} arrived in time",
                )
            sock.settimeout(left)
        else:
            sock.settimeout(None)
        try:
            chunk = sock.recv(min(count - got, 1 << 20))
        except TimeoutError:
            continue  # the deadline check above names it
        except OSError as exc:
            raise FrameError("closed", f"connection failed reading the {what}: {exc}") from exc
        if not chunk:
            problem = "truncated" if got or what != "header" else "closed"
            raise FrameError(problem, f"peer closed after {got} of {count} bytes of the {what}")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_header(data: bytes) -> tuple[Kind | int, int, int, int]:
    """(kind, block, length, crc) of a 16-byte header; FrameError for a bad magic or version
    or a length above MAX_PAYLOAD."""
    magic, version, kind, block, length, crc = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError("magic", f"header starts with {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise FrameError("version", f"frame version {version}, this testbed speaks {VERSION}")
    if length > MAX_PAYLOAD:
        raise FrameError("length", f"length field says {length} bytes, above {MAX_PAYLOAD}")
    return kind, block, length, crc


def _read_parts(sock: socket.socket, wait_s: float | None, frame_s: float):
    start = None if wait_s is None else time.monotonic() + wait_s
    first = _recv_exact(sock, 1, start, "header")
    head = first + _recv_exact(sock, HEADER_BYTES - 1, time.monotonic() + frame_s, "header")
    kind, block, length, crc = read_header(head)
    payload = _recv_exact(sock, length, time.monotonic() + frame_s, f"{length}-byte payload")
    return head, kind, block, crc, payload


def read_frame(sock: socket.socket, wait_s: float | None, frame_s: float) -> Frame:
    """The next frame from ``sock``, checked (magic, version, length, checksum, kind).

    ``wait_s``: how long to wait for a frame to begin (None: forever); ``frame_s``: how long
    the rest of a begun frame may take. FrameError names any problem.
    """
    head, kind, block, crc, payload = _read_parts(sock, wait_s, frame_s)
    computed = zlib.crc32(payload, zlib.crc32(head[:12]))
    if computed != crc:
        raise FrameError(
            "checksum",
            f"frame of kind {kind}, block {block}, {len(payload)} payload bytes: CRC-32 "
            f"{computed:#010x} computed, {crc:#010x} in the header (corrupted on the link)",
        )
    if kind not in Kind._value2member_map_:
        raise FrameError("kind", f"unknown frame kind {kind}")
    return Frame(Kind(kind), block, payload)


def read_raw_frame(sock: socket.socket, wait_s: float | None, frame_s: float):
    """(kind, block, the frame's bytes) of the next frame, unchecked beyond its header: what
    the link emulator forwards."""
    head, kind, block, _, payload = _read_parts(sock, wait_s, frame_s)
    return kind, block, head + payload


def send_frame(sock: socket.socket, kind: Kind, block: int, payload: bytes) -> int:
    """Send one frame; returns its bytes on the wire."""
    data = encode_frame(kind, block, payload)
    sock.settimeout(None)
    sock.sendall(data)
    return len(data)


def expect(frame: Frame, *kinds: Kind) -> Frame:
    """``frame`` if it is of one of ``kinds``; the edge's ERROR text or a named mismatch
    otherwise."""
    if frame.kind in kinds:
        return frame
    if frame.kind == Kind.ERROR:
        raise FrameError("remote", f"the edge failed: {frame.payload.decode(errors='replace')}")
    names = " or ".join(k.name for k in kinds)
    raise FrameError("kind", f"expected {names}, got {frame.kind.name} (block {frame.block})")
