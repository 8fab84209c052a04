"""The edge server of the multi-device simulation: batched service times and the batching
policy (methods §10); torch-free.

**Service times.** One batched, KV-cached forward of the target over ``tokens`` new tokens in
each of ``batch`` rows takes ``BatchTimes.seconds(tokens, batch)``, from the profile rule
``profile_batching`` records (``edgespec.multidevice.batchprofile``: medians of interleaved
repeats at several context lengths, isotonic in the batch size) or the configured table
(``multidevice.target_batch_s``, to emulate other hardware). Each row of the table is made
non-decreasing in the batch size by an isotonic regression (:func:`isotonic`: a forward over
more rows never takes less time, and a pooled pair costs its mean, so one slow cell does not
charge every larger batch). Between timed batch sizes the time is interpolated linearly in the
batch size (flat while memory-bound, linear once compute-bound); between timed token counts
linearly in the tokens; above the largest timed count it is extrapolated along the last two
counts (slope >= 0: a forward is linear in its tokens once compute-bound). Batch sizes are
never extrapolated.

**What a batch costs** (:class:`EdgeCost`). A request carries its tokens per row: 1 for a
CU-HLM upload that follows no skipped token, s + 1 after s skipped ones (the target catches up
on them), gamma + 1 for a WISV round. A batch of b requests with T tokens in all is one
flattened forward, as a continuous-batching server (vLLM, SGLang) runs it: it costs
``anchor_s * seconds(T / b, b) / seconds(anchor_tokens, 1)``, with ``anchor_s`` the single
request time the single-device evaluation charges (``target_token_s`` at ``anchor_tokens`` 1,
``target_verify(gamma)`` at gamma + 1): the batch table gives the shape, the latency profile
the level, so one device alone pays exactly the evaluation's time for an anchor request.

**Policy** (:class:`BatchingPolicy`): batch-when-ready. When the edge is idle and requests
wait, it serves the oldest request's kind with up to ``max_batch`` waiting requests of that
kind, in arrival order, as soon as either as many requests wait as could ever come (``max_batch``
or the number of devices that still have an edge request ahead: a finished device is no
companion) or the oldest has waited ``window_s``. With ``window_s`` 0 it never waits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec import checks


def isotonic(values: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted least squares
    (pool-adjacent-violators): runs that decrease are replaced by their weighted mean."""
    y = np.asarray(values, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if y.ndim != 1 or w.shape != y.shape:
        raise ValueError("isotonic needs one value and one weight per point")
    means: list[float] = []
    sizes: list[float] = []
    counts: list[int] = []
    for value, weight in zip(y, w, strict=True):
        means.append(float(value))
        sizes.append(float(weight))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            total = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / total
            sizes[-2] = total
            counts[-2] += counts[-1]
            del means[-1], sizes[-1], counts[-1]
    return np.repeat(means, counts)


class BatchTimes:
    """Seconds of one batched target forward: tokens per row -> batch size -> seconds.

    Built from a mapping whose keys may be strings (JSON); every row needs batch size 1 (the
    anchor of :meth:`factor`). ``source`` says where the numbers come from.
    """

    def __init__(self, table: Mapping[Any, Mapping[Any, Any]], source: str = "measured"):
        if not isinstance(table, Mapping) or not table:
            raise ValueError("target batch times must map tokens per row -> {batch: seconds}")
        rows: dict[int, dict[int, float]] = {}
        for tokens_key, sizes in table.items():
            tokens = checks.integer("tokens per row", tokens_key)
            if tokens in rows:
                raise ValueError(f"target batch times give tokens={tokens} twice")
            if not isinstance(sizes, Mapping) or not sizes:
                raise ValueError(f"target batch times[{tokens}] must map batch size -> seconds")
            row: dict[int, float] = {}
            for batch_key, seconds in sizes.items():
                batch = checks.integer(f"batch size of tokens={tokens}", batch_key)
                if batch in row:
                    raise ValueError(f"target batch times[{tokens}] give batch={batch} twice")
                row[batch] = checks.seconds(
                    f"target batch times[{tokens}][{batch}]", seconds, positive=True
                )
            if 1 not in row:
                raise ValueError(
                    f"target batch times[{tokens}] lack batch size 1, the single-request time "
                    "every batch is scaled from"
                )
            rows[tokens] = dict(sorted(row.items()))
        self.table = dict(sorted(rows.items()))
        # A forward over more rows never takes less time: lookups use each row's isotonic fit.
        self._monotone = {
            tokens: dict(zip(row, isotonic(list(row.values())), strict=True))
            for tokens, row in self.table.items()
        }
        self.source = str(source)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchTimes:
        """From the JSON rule ``profile_batching`` writes (``target_batch_s``, ``source``)."""
        if "target_batch_s" not in d:
            raise ValueError("a batch-time file needs a 'target_batch_s' table")
        return cls(d["target_batch_s"], d.get("source", "measured"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_batch_s": {
                str(t): {str(b): s for b, s in row.items()} for t, row in self.table.items()
            },
            "source": self.source,
        }

    def _neighbours(self, tokens: float) -> tuple[int, int]:
        """The two timed token counts ``tokens`` is read between (or extrapolated from)."""
        known = list(self.table)
        if tokens < known[0]:
            raise ValueError(
                f"tokens={tokens:g} per row lies below the timed token counts {known}; time or "
                "configure it (multidevice.target_batch_s)"
            )
        above = [t for t in known if t >= tokens]
        if above:
            hi = above[0]
            return max(t for t in known if t <= tokens), hi
        if len(known) < 2:
            raise ValueError(
                f"tokens={tokens:g} per row lies above the one timed token count {known[0]}: "
                "time a second one to extrapolate along (multidevice.target_batch_s)"
            )
        return known[-2], known[-1]

    def max_batch(self, tokens: float) -> int:
        """The largest batch size :meth:`seconds` answers for ``tokens`` (no extrapolation in
        the batch size)."""
        lo, hi = self._neighbours(tokens)
        return min(max(self.table[lo]), max(self.table[hi]))

    def _row_seconds(self, tokens: int, batch: int) -> float:
        row = self._monotone[tokens]
        sizes = list(row)
        if batch > sizes[-1]:
            raise ValueError(
                f"batch size {batch} exceeds the largest timed batch ({sizes[-1]}) for "
                f"tokens={tokens}; time it or cap multidevice.batching.max_batch"
            )
        if batch in row:
            return row[batch]
        return float(np.interp(batch, sizes, [row[b] for b in sizes]))

    def seconds(self, tokens: float, batch: int) -> float:
        """One forward over ``tokens`` new tokens (a mean over rows may be fractional) in each
        of ``batch`` rows [s] (module docstring: linear in the batch, then in the tokens,
        extrapolated above the largest timed count; ValueError outside)."""
        batch = checks.integer("batch", batch)
        tokens = float(tokens)
        if not (math.isfinite(tokens) and tokens >= 1):
            raise ValueError(f"tokens per row must be >= 1, got {tokens!r}")
        lo, hi = self._neighbours(tokens)
        if lo == hi:
            return self._row_seconds(lo, batch)
        if batch > self.max_batch(tokens):
            raise ValueError(
                f"batch size {batch} exceeds the largest timed batch ({self.max_batch(tokens)}) "
                f"around tokens={tokens:g}"
            )
        at_lo, at_hi = self._row_seconds(lo, batch), self._row_seconds(hi, batch)
        slope = (
            max((at_hi - at_lo) / (hi - lo), 0.0) if tokens > hi else (at_hi - at_lo) / (hi - lo)
        )
        return float(at_lo + slope * (tokens - lo))

    def extrapolates(self, tokens: float) -> bool:
        """Whether ``tokens`` per row lies above the largest timed count."""
        return tokens > max(self.table)

    def factor(self, tokens: int, batch: int) -> float:
        """seconds(tokens, batch) / seconds(tokens, 1): what a batch of ``batch`` requests costs
        in single requests' times (1.0 exactly at batch 1)."""
        if batch == 1:
            return 1.0
        return self.seconds(tokens, batch) / self.seconds(tokens, 1)


@dataclass(frozen=True)
class BatchingPolicy:
    """Batch-when-ready (module docstring): ``max_batch`` requests at most per batch (None: no
    limit), ``window_s`` the longest the oldest request waits for companions [s] (0: never)."""

    max_batch: int | None = None
    window_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_batch is not None:
            object.__setattr__(self, "max_batch", checks.integer("max_batch", self.max_batch))
        object.__setattr__(self, "window_s", checks.seconds("window_s", self.window_s))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchingPolicy:
        """From config ``multidevice.batching`` (``max_batch``, ``window_s``)."""
        unknown = sorted(set(d) - {"max_batch", "window_s"})
        if unknown:
            raise ValueError(f"multidevice.batching: unknown key(s) {unknown}")
        return cls(d.get("max_batch"), d.get("window_s", 0.0))

    def largest_batch(self, devices: int) -> int:
        """The largest batch ``devices`` devices can form (each has one request in flight)."""
        return devices if self.max_batch is None else min(self.max_batch, devices)


class EdgeCost:
    """Seconds of one batched verification forward over requests' rows (module docstring):
    ``anchor_s`` [s] is what the single-device evaluation charges one request of
    ``anchor_tokens`` tokens per row, ``times`` the batch table that scales it."""

    def __init__(self, times: BatchTimes, anchor_tokens: int, anchor_s: float):
        self.times = times
        self.anchor_tokens = checks.integer("anchor tokens", anchor_tokens)
        self.anchor_s = checks.seconds("anchor time", anchor_s, positive=True)
        self._anchor = times.seconds(self.anchor_tokens, 1)
        self._cache: dict[tuple[int, int], float] = {}

    def batch_s(self, rows: Sequence[int]) -> float:
        """One forward over ``rows`` (each request's tokens per row), flattened [s]."""
        key = (int(sum(rows)), len(rows))
        if key not in self._cache:
            total, batch = key
            self._cache[key] = self.anchor_s * (
                self.times.seconds(total / batch, batch) / self._anchor
            )
        return self._cache[key]

    def alone_s(self, tokens: int) -> float:
        """One request served alone [s]."""
        return self.batch_s([tokens])
