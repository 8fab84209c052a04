"""Sizing a study from a pilot run's per-prompt scores (methods §6, power calculation);
torch-free.

For each dataset, variant and quality figure the pilot's ``results/cuhlm/scores.parquet``
gives per-prompt scores of the variant and of its floor (HLM, lossless) on the same prompts.
The figure is the ratio of their means (``relative_<m>``, as the report has it); its
per-prompt standard deviation (``edgespec.intervals.paired_effects``, delta method) decides
the minimum detectable difference at the pilot's n and the prompts a study needs to resolve a
given difference, in points of the floor's figure::

    python -m edgespec.cuhlm.pilot results/cuhlm/scores.parquet --difference 0.02 [--pooled]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import pandas as pd

from edgespec.cuhlm.summary import QUALITY_METRICS, SELF_REFERENCED
from edgespec.intervals import (
    BOOTSTRAP_LEVEL,
    POWER,
    detectable_difference,
    effect_sd,
    paired_effects,
    prompts_needed,
)
from edgespec.report import markdown_table


def pilot_table(
    scores: pd.DataFrame,
    difference: float = 0.02,
    level: float = BOOTSTRAP_LEVEL,
    power: float = POWER,
    reference: str = "hlm",
    metrics: Sequence[str] = QUALITY_METRICS,
) -> pd.DataFrame:
    """One row per (dataset, variant, metric) with a paired figure: ``n`` (prompts with both
    scores), ``floor`` (the reference's mean), ``relative`` (the ratio of means), ``sd`` (the
    per-prompt standard deviation of the ratio, a fraction of the floor), ``mdd`` at ``n`` and
    ``n_needed`` for ``difference`` (both fractions of the floor; two-sided at ``level`` with
    ``power``). Rows without a spread (fewer than two prompts, or an sd of 0) have no
    ``n_needed``. A figure scored against another variant's output (similarity to LLM-only)
    gets a :data:`LOSSLESS_PAIR` row from the floor's own spread."""
    if reference not in set(scores["variant"]):
        raise KeyError(f"the reference variant {reference!r} has no scores")
    if "dataset" not in scores:
        scores = scores.assign(dataset="all")
    rows = []
    for dataset, group in scores.groupby("dataset", sort=True):
        ref = group[group["variant"] == reference].set_index("prompt_id")
        for variant, own in group.groupby("variant", sort=False):
            if variant == reference:
                continue
            own = own.set_index("prompt_id")
            for metric in metrics:
                if metric not in own or SELF_REFERENCED.get(metric) == variant:
                    continue
                both = pd.concat(
                    [own[metric].rename("a"), ref[metric].rename("b")], axis=1, join="inner"
                ).dropna()
                if len(both) < 2 or both["b"].sum() == 0:
                    continue
                sd = effect_sd(paired_effects(both["a"], both["b"]))
                rows.append(_row(dataset, variant, metric, both, sd, difference, level, power))
        for metric, scored_against in SELF_REFERENCED.items():
            if metric not in metrics or metric not in ref or reference == scored_against:
                continue
            b = ref[metric].dropna()
            if len(b) < 2 or b.sum() == 0:
                continue
            both = pd.DataFrame({"a": b, "b": b})
            sd = math.sqrt(2.0) * effect_sd(b) / float(b.mean())
            rows.append(_row(dataset, LOSSLESS_PAIR, metric, both, sd, difference, level, power))
    return pd.DataFrame(rows)


LOSSLESS_PAIR = "lossless_pair"
"""The pilot table's row of a figure scored against the variant that no other pilot variant
is paired with (U-HLM's similarity to LLM-only): a second lossless sample independent of the
floor's, whose ratio's per-prompt sd is sqrt(2) sd(b) / mean(b) (b the floor's scores). That
is an upper bound where the two share a prompt's difficulty (correlation >= 0)."""


def _row(dataset, variant, metric, both, sd, difference, level, power) -> dict:
    n = len(both)
    spread = math.isfinite(sd) and sd > 0
    return {
        "dataset": dataset,
        "variant": variant,
        "metric": metric,
        "n": n,
        "floor": float(both["b"].mean()),
        "relative": float(both["a"].sum() / both["b"].sum()),
        "sd": sd,
        "mdd": detectable_difference(sd, n, level, power),
        "n_needed": prompts_needed(sd, difference, level, power) if spread else math.nan,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("scores", help="a run's results/cuhlm/scores.parquet")
    parser.add_argument("--difference", type=float, default=0.02, help="to resolve (0.02 = 2 pt)")
    parser.add_argument("--level", type=float, default=BOOTSTRAP_LEVEL)
    parser.add_argument("--power", type=float, default=POWER)
    parser.add_argument(
        "--pooled", action="store_true", help="all datasets as one (the report's figures)"
    )
    args = parser.parse_args(argv)
    scores = pd.read_parquet(args.scores)
    if args.pooled:
        scores = scores.assign(dataset="all")
    table = pilot_table(scores, args.difference, args.level, args.power)
    print(markdown_table(table, floatfmt=".3g"))


if __name__ == "__main__":
    main()
