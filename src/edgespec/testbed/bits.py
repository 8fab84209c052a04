"""Bit-exact packing of fixed-width fields, the serialisation of every testbed payload.

A payload is one bit stream: fields of ``width`` bits each (unsigned integers, or IEEE floats
of 16 or 32 bits) written most significant bit first, one after the other without alignment,
the last byte padded with zero bits. So a payload of B bits takes exactly ceil(B / 8) bytes,
the size the delay model charges (methods §11). Vectorised with numpy: packing the 151,936
entries of a full Qwen2.5 distribution (32-bit values and 18-bit indices) takes tens of
milliseconds, a cost the testbed measures as serialisation.

Torch-free.
"""

from __future__ import annotations

import numpy as np

FLOAT_WIDTHS = {16: (np.float16, np.uint16), 32: (np.float32, np.uint32)}
"""Bits per value -> (float dtype, unsigned view) of the float fields a payload may carry."""


class BitError(ValueError):
    """A field that does not fit its width, or a payload shorter than its fields."""


def _check_width(width: int) -> int:
    if isinstance(width, bool) or int(width) != width or not 1 <= width <= 64:
        raise BitError(f"field width must be an integer in [1, 64] bits, got {width!r}")
    return int(width)


def uint_width(largest: int) -> int:
    """Bits of an unsigned field that holds 0..``largest``: ceil(log2(largest + 1)), at least 1."""
    if largest < 0:
        raise BitError(f"largest must be >= 0, got {largest}")
    return max(1, int(largest).bit_length())


class BitWriter:
    """Collects fields, then :meth:`to_bytes` gives the padded stream."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.bits = 0

    def uints(self, values, width: int) -> BitWriter:
        """Append each of ``values`` (non-negative integers below 2**width) in ``width`` bits."""
        width = _check_width(width)
        v = np.asarray(values).reshape(-1)
        if v.size == 0:
            return self
        if v.dtype.kind not in "iu" or (v.dtype.kind == "i" and v.min() < 0):
            raise BitError(f"fields must be non-negative integers, got dtype {v.dtype}")
        v = v.astype(np.uint64)
        if width < 64 and int(v.max()) >> width:
            raise BitError(f"value {int(v.max())} does not fit in {width} bits")
        octets = v.astype(">u8").view(np.uint8).reshape(-1, 8)
        bits = np.unpackbits(octets, axis=1)[:, 64 - width :]
        self._parts.append(bits.reshape(-1))
        self.bits += bits.size
        return self

    def uint(self, value: int, width: int) -> BitWriter:
        """Append one unsigned integer in ``width`` bits."""
        return self.uints(np.array([int(value)], dtype=np.uint64), width)

    def floats(self, values, bits: int) -> BitWriter:
        """Append each of ``values`` as an IEEE float of ``bits`` (16 or 32) bits."""
        if bits not in FLOAT_WIDTHS:
            raise BitError(f"floats travel in {sorted(FLOAT_WIDTHS)} bits, not {bits}")
        dtype, view = FLOAT_WIDTHS[bits]
        arr = np.ascontiguousarray(np.asarray(values, dtype=dtype).reshape(-1))
        return self.uints(arr.view(view), bits)

    def to_bytes(self) -> bytes:
        if not self._parts:
            return b""
        return np.packbits(np.concatenate(self._parts)).tobytes()


class BitReader:
    """Reads the fields of a stream in the order they were written."""

    def __init__(self, data: bytes) -> None:
        self._bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
        self.position = 0

    @property
    def remaining(self) -> int:
        return int(self._bits.size - self.position)

    def uints(self, count: int, width: int) -> np.ndarray:
        """``count`` unsigned fields of ``width`` bits, as uint64."""
        width = _check_width(width)
        count = int(count)
        need = count * width
        if count < 0 or need > self.remaining:
            raise BitError(
                f"payload too short: {count} fields of {width} bits need {need} bits, "
                f"{self.remaining} remain"
            )
        if count == 0:
            return np.zeros(0, dtype=np.uint64)
        chunk = self._bits[self.position : self.position + need].reshape(count, width)
        self.position += need
        padded = np.zeros((count, 64), dtype=np.uint8)
        padded[:, 64 - width :] = chunk
        return np.packbits(padded, axis=1).view(">u8").reshape(-1).astype(np.uint64)

    def uint(self, width: int) -> int:
        return int(self.uints(1, width)[0])

    def floats(self, count: int, bits: int) -> np.ndarray:
        """``count`` IEEE floats of ``bits`` bits, in that float dtype."""
        if bits not in FLOAT_WIDTHS:
            raise BitError(f"floats travel in {sorted(FLOAT_WIDTHS)} bits, not {bits}")
        dtype, view = FLOAT_WIDTHS[bits]
        return self.uints(count, bits).astype(view).view(dtype)

    def finish(self) -> None:
        """Check that only the zero padding of the last byte is left."""
        rest = self._bits[self.position :]
        if rest.size >= 8 or rest.any():
            raise BitError(
                f"{rest.size} bits left after the last field (expected fewer than 8 zero "
                "padding bits): the payload does not match its message"
            )
