"""A robust profile of the edge's batched target forwards: repeated, interleaved timings, their
medians, an isotonic fit, outliers re-timed (methods §10); torch-free.

One cell is one (context length c, tokens per row t, batch size b): a KV-cached target forward
over t new tokens in each of b rows after c tokens of context. :func:`collect` times every
cell ``repeats`` times (at least 5) through a timer passed in (``edgespec.profiling`` builds the
real one), in *rounds*: each round times every cell once, in an order drawn from a seeded
generator, so a transient slow-down of the machine (another job, a frequency change) lands on
one sample of several cells rather than on every sample of one cell, and the cell's median
discards it. A slower drift of the machine's load (other jobs starting or ending over the
profile) slows a whole round: each round's samples are divided by its load, the median over
its cells of their time over the cell's median (:func:`round_loads`).

**Fit.** Per (c, t), the medians over the batch sizes are made non-decreasing by an isotonic
regression (``edge.isotonic``, pool-adjacent-violators, least squares): a forward over more
rows never takes less time, and a pooled pair is replaced by its mean rather than by the larger
one (a running maximum would let one slow cell charge every larger batch). The charged table
(:meth:`BatchProfile.times`) is the mean of the fits over the timed contexts.

**Outliers.** Per (c, t) row, the cell furthest from its isotonic fit -- the fit of the row's
other cells at its batch size (:func:`leave_one_out_fit`), so the cell cannot pull its own fit
along -- is timed again if its median is more than :data:`OUTLIER_RATIO` (2) times that fit or
less than half of it: ``repeats`` fresh rounds beside a reference cell of its row, whose time
gives those rounds' load, replace the first samples (kept as ``discarded``). If it still is an
outlier, the cell keeps its samples and the profile carries a warning (``warnings``), which the
report prints.

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


def leave_one_out_fit(
    sizes: Sequence[int], medians: Sequence[float], index: int
) -> tuple[float, float]:
    """The isotonic fit of a row's other cells, read at ``sizes[index]`` as (low, high): both
    interpolated linearly between the others; below them both held at the first; above them
    the fit held at the last (low: a larger batch never takes less time) and extrapolated along
    the last two (high, slope >= 0: it may take more). NaNs when the row has no other cell."""
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(medians, dtype=float)
    keep = np.arange(len(x)) != index
    if keep.sum() == 0:
        return float("nan"), float("nan")
    xs, fit = x[keep], isotonic(y[keep])
    at = x[index]
    held = float(np.interp(at, xs, fit))
    if at > xs[-1] and len(xs) >= 2:
        slope = max((fit[-1] - fit[-2]) / (xs[-1] - xs[-2]), 0.0)
        return held, float(fit[-1] + slope * (at - xs[-1]))
    return held, held


@dataclass
class BatchProfile:
    """Every timed sample of every cell (module docstring) and what the outlier check did.

    ``samples``: context -> tokens -> batch -> seconds [s], each cell's kept samples (divided
    by their round's load); ``discarded``: per cell name, samples replaced by a re-timing;
    ``warnings``: one line per cell still an outlier after re-timing; ``loads`` and
    ``retime_loads``: each round's load (:func:`round_loads`); ``source``: "measured" or
    "given"."""

    samples: dict[int, dict[int, dict[int, list[float]]]]
    source: str = "measured"
    discarded: dict[str, list[float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    retime_loads: list[float] = field(default_factory=list)

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
        """Per (context, tokens) row, the cell furthest from its leave-one-out isotonic fit
        (in log ratio), when its median is more than :data:`OUTLIER_RATIO` times that fit or
        less than its 1 / :data:`OUTLIER_RATIO`, with the ratio. One per row: a far outlier
        drags its neighbours' fits too, and they must not be flagged for it."""
        out = []
        for context, rows in self.medians().items():
            for tokens, row in rows.items():
                sizes = sorted(row)
                medians = [row[b] for b in sizes]
                ratios = []
                for i, batch in enumerate(sizes):
                    low, high = leave_one_out_fit(sizes, medians, i)
                    if not (np.isfinite(low) and low > 0):
                        continue
                    ratio = medians[i] / high if medians[i] > high else min(medians[i] / low, 1.0)
                    ratios.append((abs(np.log(ratio)), batch, ratio))
                if ratios:
                    worst, batch, ratio = max(ratios)
                    if worst > np.log(OUTLIER_RATIO):
                        out.append(((context, tokens, batch), ratio))
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
            "round_loads": list(self.loads),
            "retime_loads": list(self.retime_loads),
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
            [float(x) for x in d.get("round_loads", [])],
            [float(x) for x in d.get("retime_loads", [])],
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
) -> list[dict[Cell, float]]:
    """``repeats`` rounds, each timing every cell once in an order drawn from ``rng``."""
    rounds = []
    for _ in range(repeats):
        one: dict[Cell, float] = {}
        for i in rng.permutation(len(cells)):
            cell = cells[int(i)]
            one[cell] = float(timer(*cell))
        rounds.append(one)
    return rounds


def round_loads(
    rounds: Sequence[Mapping[Cell, float]], typical: Mapping[Cell, float]
) -> list[float]:
    """Each round's load: the median over its cells in ``typical`` of their time over the
    typical one, so a round the machine ran slow in has a load above 1."""
    return [
        float(np.median([t / typical[c] for c, t in r.items() if c in typical])) for r in rounds
    ]


def _references(flagged: Sequence[Cell], batch_sizes: Sequence[int]) -> list[Cell]:
    """The cells the flagged ones are re-timed beside: each flagged row's batch-1 cell (its
    next batch size where batch 1 is the one flagged), unless flagged itself."""
    out: list[Cell] = []
    for c, t, b in flagged:
        other = batch_sizes[1] if b == batch_sizes[0] and len(batch_sizes) > 1 else batch_sizes[0]
        ref = (c, t, other)
        if ref not in flagged and ref not in out:
            out.append(ref)
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

    Each round's samples are divided by its load (:func:`round_loads` against each cell's
    median): a machine whose load drifts over the profile slows every cell of a round alike.
    A re-timing runs beside a reference cell of each flagged row (:func:`_references`), whose
    time then gives those rounds' loads. ``timer(context, tokens, batch)`` returns the seconds
    of one forward (already warmed up); ``rng`` orders each round."""
    if int(repeats) < MIN_REPEATS:
        raise ValueError(f"a batch profile needs at least {MIN_REPEATS} repeats, got {repeats}")
    contexts = sorted({int(c) for c in contexts})
    tokens_per_row = sorted({int(t) for t in tokens_per_row})
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not contexts or not tokens_per_row or 1 not in batch_sizes:
        raise ValueError("time at least one context and tokens count, and batch size 1")
    cells = [(c, t, b) for c in contexts for t in tokens_per_row for b in batch_sizes]
    rounds = _time_rounds(timer, cells, int(repeats), rng)
    loads = round_loads(
        rounds, {cell: float(np.median([r[cell] for r in rounds])) for cell in cells}
    )
    samples: dict[int, dict[int, dict[int, list[float]]]] = {
        c: {t: {} for t in tokens_per_row} for c in contexts
    }
    for c, t, b in cells:
        samples[c][t][b] = [r[(c, t, b)] / load for r, load in zip(rounds, loads, strict=True)]
    profile = BatchProfile(samples, "measured", loads=loads)
    for _ in range(int(retries)):
        flagged = [cell for cell, _ in profile.outliers()]
        if not flagged:
            break
        refs = _references(flagged, batch_sizes)
        typical = {(c, t, b): float(np.median(samples[c][t][b])) for c, t, b in refs}
        again = _time_rounds(timer, flagged + refs, int(repeats), rng)
        now = round_loads(again, typical) if refs else [1.0] * len(again)
        profile.retime_loads.extend(now)
        for c, t, b in flagged:
            profile.discarded.setdefault(cell_name((c, t, b)), []).extend(samples[c][t][b])
            samples[c][t][b] = [r[(c, t, b)] / load for r, load in zip(again, now, strict=True)]
    for cell, ratio in profile.outliers():
        median = float(np.median(samples[cell[0]][cell[1]][cell[2]]))
        profile.warnings.append(
            f"{cell_name(cell)}: median {median * 1e3:.1f} ms is {ratio:.2f}x the isotonic fit "
            f"of its neighbours after re-timing"
        )
    return profile


def measure(
    make_timer: Callable[[Sequence[int]], Callable[[int, int, int], float]],
    prompt_tokens: int,
    extra_context: Sequence[int],
    tokens_per_row: Sequence[int],
    batch_sizes: Sequence[int],
    repeats: int,
    rng: np.random.Generator,
) -> BatchProfile:
    """The edge's batch profile at the contexts ``prompt_tokens + e`` for each ``e`` of
    ``extra_context``: ``make_timer(contexts)`` builds a warmed-up timer over those contexts (in
    the workflow ``edgespec.profiling.BatchedForwardTimer``, which runs the target; this module
    never loads a model), and :func:`collect` times every cell."""
    contexts = sorted({int(prompt_tokens) + int(e) for e in extra_context})
    return collect(make_timer(contexts), contexts, tokens_per_row, batch_sizes, repeats, rng)
