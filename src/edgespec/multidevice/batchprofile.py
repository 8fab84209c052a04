"""A robust profile of the edge's batched target forwards: repeated, interleaved timings, their
medians, an isotonic fit, outliers re-timed (methods §10); torch-free.

One cell is one (context length c, tokens per row t, batch size b): a KV-cached target forward
over t new tokens in each of b rows after c tokens of context. :func:`collect` times every
cell ``repeats`` times (at least 5) through a timer passed in (``edgespec.profiling`` builds the
real one), in *rounds*: each round times every cell once, in an order drawn from a seeded
generator, so a transient slow-down of the machine (another job, a frequency change) lands on
one sample of several cells rather than on every sample of one cell, and the cell's median
discards it.

**Fit.** Per (c, t), the medians over the batch sizes are made non-decreasing by an isotonic
regression (:func:`isotonic`, pool-adjacent-violators, least squares): a forward over more rows
never takes less time, and a pooled pair is replaced by its mean rather than by the larger one
(a running maximum would let one slow cell charge every larger batch). The charged table
(:meth:`BatchProfile.times`) is the mean of the fits over the timed contexts.

**Outliers.** A cell whose median is more than :data:`OUTLIER_RATIO` (2) times its isotonic fit
-- the fit of the row's other cells at its batch size (:func:`leave_one_out_fit`), so the cell
cannot pull its own fit up -- is timed again (``repeats`` fresh samples replace the first ones,
which the record keeps as ``discarded``). If it still is, the cell keeps its samples and the
profile carries a warning (``warnings``), which the report prints.

**Spread.** Each cell keeps every sample; its spread is the interquartile range. A bootstrap
draw of the profile (:meth:`BatchProfile.draw`) resamples each cell's samples with replacement
before taking medians and fitting: the simulation prices replicate r >= 1 with draw r, so the
timing spread widens the reported intervals (replicate 0 uses the fit of the medians).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgespec.multidevice.edge import BatchTimes, isotonic

OUTLIER_RATIO = 2.0
"""A cell whose median exceeds this multiple of its isotonic fit is re-timed (module docstring)."""

MIN_REPEATS = 5

Cell = tuple[int, int, int]  # (context tokens, tokens per row, batch size)


def leave_one_out_fit(sizes: Sequence[int], medians: Sequence[float], index: int) -> float:
    """The isotonic fit of a row's other cells, read at ``sizes[index]``: interpolated linearly
    between them, held at the first one below, extrapolated along the last two above (slope
    >= 0). NaN when the row has no other cell."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(medians, dtype=float)
    keep = np.arange(len(x)) != index
    if keep.sum() == 0:
        return float("nan")
    xs, fit = x[keep], isotonic(y[keep])
    at = x[index]
    if at > xs[-1] and len(xs) >= 2:
        slope = max((fit[-1] - fit[-2]) / (xs[-1] - xs[-2]), 0.0)
        return float(fit[-1] + slope * (at - xs[-1]))
    return float(np.interp(at, xs, fit))


@dataclass
class BatchProfile:
    """Every timed sample of every cell (module docstring) and what the outlier check did.

    ``samples``: context -> tokens -> batch -> seconds [s], each cell's kept samples;
    ``discarded``: the same for samples replaced by a re-timing; ``warnings``: one line per
    cell still an outlier after re-timing; ``source``: "measured" or "given"."""

    samples: dict[int, dict[int, dict[int, list[float]]]]
    source: str = "measured"
    discarded: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a batch profile needs at least one timed context")
        for context, rows in self.samples.items():
            for tokens, row in rows.items():
                for batch, values in row.items():
                    if not values or min(values) <= 0:
                        raise ValueError(
                            f"batch profile cell (context {context}, tokens {tokens}, batch "
                            f"{batch}) needs timings > 0 s, got {values}"
                        )

    @classmethod
    def given(cls, table: Mapping[Any, Mapping[Any, Any]]) -> BatchProfile:
        """The configured table (``multidevice.target_batch_s``) as a profile of one sample per
        cell at one unnamed context (0): no spread, its fit is the table's."""
        times = BatchTimes(table, "given")
        rows = {t: {b: [s] for b, s in row.items()} for t, row in times.table.items()}
        return cls({0: rows}, "given")

    @property
    def contexts(self) -> list[int]:
        return sorted(self.samples)

    def medians(self) -> dict[int, dict[int, dict[int, float]]]:
        return {
            c: {t: {b: float(np.median(v)) for b, v in row.items()} for t, row in rows.items()}
            for c, rows in self.samples.items()
        }

    def spread(self) -> dict[int, dict[int, dict[int, tuple[float, float]]]]:
        """Each cell's interquartile range (q25, q75) [s]."""
        return {
            c: {
                t: {
                    b: tuple(float(q) for q in np.quantile(v, [0.25, 0.75])) for b, v in row.items()
                }
                for t, row in rows.items()
            }
            for c, rows in self.samples.items()
        }

    def _charged(self, medians: Mapping[int, Mapping[int, Mapping[int, float]]]) -> BatchTimes:
        per_context = []
        for context in self.contexts:
            fitted = {}
            for tokens, row in medians[context].items():
                sizes = sorted(row)
                fitted[tokens] = dict(zip(sizes, isotonic([row[b] for b in sizes]), strict=True))
            per_context.append(fitted)
        first = per_context[0]
        table = {
            t: {b: float(np.mean([fit[t][b] for fit in per_context])) for b in row}
            for t, row in first.items()
        }
        return BatchTimes(table, self.source)

    def times(self) -> BatchTimes:
        """The charged table: per context the isotonic fit of the medians, averaged over the
        contexts (module docstring)."""
        return self._charged(self.medians())

    def draw(self, rng: np.random.Generator) -> BatchTimes:
        """One bootstrap draw of :meth:`times`: every cell's samples resampled with
        replacement (from ``rng``) before the medians and the fit."""
        medians = {
            c: {
                t: {
                    b: float(np.median(rng.choice(np.asarray(v), size=len(v))))
                    for b, v in row.items()
                }
                for t, row in rows.items()
            }
            for c, rows in self.samples.items()
        }
        return self._charged(medians)

    def outliers(self) -> list[tuple[Cell, float]]:
        """Cells whose median exceeds :data:`OUTLIER_RATIO` times their leave-one-out isotonic
        fit, with that ratio."""
        out = []
        for context, rows in self.medians().items():
            for tokens, row in rows.items():
                sizes = sorted(row)
                medians = [row[b] for b in sizes]
                for i, batch in enumerate(sizes):
                    fit = leave_one_out_fit(sizes, medians, i)
                    if np.isfinite(fit) and fit > 0 and medians[i] > OUTLIER_RATIO * fit:
                        out.append(((context, tokens, batch), medians[i] / fit))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON: ``target_batch_s`` (the charged table) and the record behind it."""
        times = self.times()
        medians, spread = self.medians(), self.spread()
        return {
            **times.to_dict(),
            "contexts": self.contexts,
            "samples_s": _keyed(self.samples),
            "median_s": _keyed(medians),
            "iqr_s": _keyed(spread),
            "discarded_s": dict(self.discarded),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchProfile:
        """From :meth:`to_dict`'s JSON (string keys)."""
        if "samples_s" not in d:
            raise ValueError("a batch profile file needs 'samples_s' (rerun profile_batching)")
        samples = {
            int(c): {
                int(t): {int(b): [float(s) for s in v] for b, v in row.items()}
                for t, row in rows.items()
            }
            for c, rows in d["samples_s"].items()
        }
        return cls(
            samples,
            str(d.get("source", "measured")),
            {k: list(v) for k, v in d.get("discarded_s", {}).items()},
            list(d.get("warnings", [])),
        )


def _keyed(nested: Mapping) -> dict:
    """Nested mappings with string keys (JSON)."""
    return {
        str(k): _keyed(v) if isinstance(v, Mapping) else (list(v) if isinstance(v, tuple) else v)
        for k, v in nested.items()
    }


def cell_name(cell: Cell) -> str:
    context, tokens, batch = cell
    return f"context {context}, {tokens} tokens per row, batch {batch}"


def _time_rounds(
    timer: Callable[[int, int, int], float],
    cells: Sequence[Cell],
    repeats: int,
    rng: np.random.Generator,
) -> dict[Cell, list[float]]:
    out: dict[Cell, list[float]] = {cell: [] for cell in cells}
    for _ in range(repeats):
        for i in rng.permutation(len(cells)):
            cell = cells[int(i)]
            out[cell].append(float(timer(*cell)))
    return out


def collect(
    timer: Callable[[int, int, int], float],
    contexts: Sequence[int],
    tokens_per_row: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int,
    rng: np.random.Generator,
    retries: int = 1,
) -> BatchProfile:
    """Time every (context, tokens, batch) cell ``repeats`` times in interleaved rounds, re-time
    outliers up to ``retries`` times and record those that persist (module docstring).

    ``timer(context, tokens, batch)`` returns the seconds of one forward (already warmed up);
    ``rng`` orders each round."""
    if int(repeats) < MIN_REPEATS:
        raise ValueError(f"a batch profile needs at least {MIN_REPEATS} repeats, got {repeats}")
    contexts = sorted({int(c) for c in contexts})
    tokens_per_row = sorted({int(t) for t in tokens_per_row})
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not contexts or not tokens_per_row or 1 not in batch_sizes:
        raise ValueError("time at least one context and tokens count, and batch size 1")
    cells = [(c, t, b) for c in contexts for t in tokens_per_row for b in batch_sizes]
    timed = _time_rounds(timer, cells, int(repeats), rng)
    samples: dict[int, dict[int, dict[int, list[float]]]] = {
        c: {t: {} for t in tokens_per_row} for c in contexts
    }
    for (c, t, b), values in timed.items():
        samples[c][t][b] = values
    profile = BatchProfile(samples, "measured")
    for _ in range(int(retries)):
        flagged = [cell for cell, _ in profile.outliers()]
        if not flagged:
            break
        again = _time_rounds(timer, flagged, int(repeats), rng)
        for (c, t, b), values in again.items():
            profile.discarded.setdefault(cell_name((c, t, b)), []).extend(samples[c][t][b])
            samples[c][t][b] = values
    for cell, ratio in profile.outliers():
        median = float(np.median(samples[cell[0]][cell[1]][cell[2]]))
        profile.warnings.append(
            f"{cell_name(cell)}: median {median * 1e3:.1f} ms is {ratio:.2f}x the isotonic fit "
            f"of its neighbours after re-timing"
        )
    return profile
