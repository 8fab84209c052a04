"""The edge server of the multi-device simulation: batched service times and the batching
policy (methods §10); torch-free.

**Service times.** One batched, KV-cached forward of the target over ``tokens`` new tokens in
each of ``batch`` rows takes ``BatchTimes.seconds(tokens, batch)``, from the table rule
``profile_batching`` measures (``edgespec.profiling.measure_target_batch_times``) or the
configured one (``multidevice.target_batch_s``, to emulate other hardware). A request of
``tokens`` 1 is a CU-HLM verification (one forward over the last committed token, as
``target_token_s``), one of ``gamma + 1`` a WISV round's verification (as
``target_verify_s[gamma]``). Between measured batch sizes the time is interpolated linearly in
the batch size (a forward is flat in the rows while it is memory-bound and linear once it is
compute-bound, so a straight line between neighbouring sizes is close); between measured token
counts, linearly in the tokens at that batch size; nothing is extrapolated. A forward over more
rows never takes less time, so each row of the table is first made non-decreasing in the batch
size (running maximum: a measured table carries timing noise).

The simulation charges a batch of b requests ``base * factor(tokens, b)``, with ``base`` the
single-request time the single-device evaluation charges (``target_token_s`` or
``target_verify(gamma)`` of the run's latency profile) and ``factor(tokens, b) =
seconds(tokens, b) / seconds(tokens, 1)`` (:meth:`BatchTimes.factor`): the batch table gives
the shape, the latency profile the level, so a batch of one costs exactly what one device pays
alone, and one device reproduces the single-device evaluation.

**Policy** (:class:`BatchingPolicy`): batch-when-ready. When the edge is idle and requests
wait, it serves the oldest request's kind with up to ``max_batch`` waiting requests of that
kind, in arrival order, as soon as either as many requests wait as could ever come (``max_batch``
or the number of devices still decoding) or the oldest has waited ``window_s``. With
``window_s`` 0 it never waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec import checks


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
        # A forward over more rows never takes less time; a measured table carries timing
        # noise, so lookups use the running maximum over batch sizes.
        self._monotone = {
            tokens: dict(zip(row, np.maximum.accumulate(list(row.values())), strict=True))
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

    def max_batch(self, tokens: int) -> int:
        """The largest batch size :meth:`seconds` answers for ``tokens`` (no extrapolation)."""
        known = list(self.table)
        if tokens in self.table:
            return max(self.table[tokens])
        below = [t for t in known if t < tokens]
        above = [t for t in known if t > tokens]
        if not below or not above:
            raise ValueError(
                f"tokens={tokens} per row lies outside the timed token counts {known}; time or "
                "configure it (multidevice.target_batch_s)"
            )
        return min(max(self.table[below[-1]]), max(self.table[above[0]]))

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

    def seconds(self, tokens: int, batch: int) -> float:
        """One forward over ``tokens`` new tokens in each of ``batch`` rows [s] (module
        docstring: linear interpolation in the batch, then in the tokens; ValueError
        outside the timed range)."""
        tokens = checks.integer("tokens", tokens)
        batch = checks.integer("batch", batch)
        if tokens in self.table:
            return self._row_seconds(tokens, batch)
        if batch > self.max_batch(tokens):
            raise ValueError(
                f"batch size {batch} exceeds the largest timed batch ({self.max_batch(tokens)}) "
                f"around tokens={tokens}"
            )
        known = list(self.table)
        lo = max(t for t in known if t < tokens)
        hi = min(t for t in known if t > tokens)
        return float(
            np.interp(
                tokens, [lo, hi], [self._row_seconds(lo, batch), self._row_seconds(hi, batch)]
            )
        )

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
