"""Two runs of the many-device study held against each other: the same knee and ranking?

The many-device answer rests on timings (the batch profile, the latency profile), so a rerun on
the same machine times everything again. Its capacity is trustworthy where a rerun gives the
same knee for every method, channel, uplink and edge policy, and the same ranking by peak
throughput, or where it does not, the intervals say why (the knees' intervals overlap; the
methods that swap places were marked "undecided" in the first run). Compares the report tables
``multidevice_capacity.csv`` and ``multidevice_ranking.csv`` of two runs
(``edgespec.multidevice.capacity``)::

    python -m edgespec.multidevice.rerun RUN_A/results/report RUN_B/results/report
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

KEY = ("method", "channel", "uplink", "policy")
GROUP = ("channel", "uplink", "policy")


def _overlap(a_lo: float, a_hi: float, b_lo: float, b_hi: float) -> bool:
    return max(a_lo, b_lo) <= min(a_hi, b_hi)


def compare_knees(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """Per capacity row of both runs: ``knee_a``, ``knee_b`` (number of devices), ``same_knee``
    and ``overlap`` (the two knees' intervals share a device count). A row in only one run is
    a ValueError: the two runs must have studied the same cases."""
    a = first.set_index(list(KEY))
    b = second.set_index(list(KEY))
    if set(a.index) != set(b.index):
        only = sorted(set(a.index) ^ set(b.index))
        raise ValueError(f"the two runs studied different cases, e.g. {only[:3]}")
    rows = []
    for key in a.index:
        x, y = a.loc[key], b.loc[key]
        rows.append(
            {
                **dict(zip(KEY, key, strict=True)),
                "knee_a": int(x["knee_n"]),
                "knee_b": int(y["knee_n"]),
                "same_knee": int(x["knee_n"]) == int(y["knee_n"]),
                "overlap": _overlap(x["knee_n_lo"], x["knee_n_hi"], y["knee_n_lo"], y["knee_n_hi"]),
            }
        )
    return pd.DataFrame(rows)


def compare_rankings(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """Per (channel, uplink, policy): the two orders by peak throughput (best first, "a > b"),
    ``same_order``, and ``explained``: where the orders differ, whether every pair of methods
    that swapped places was adjacent somewhere in the first run's order with "undecided"
    between them (its paired interval contained 0), so that the swap is within the noise."""
    rows = []
    for key, a in first.groupby(list(GROUP), sort=False):
        b = second
        for name, value in zip(GROUP, key, strict=True):
            b = b[b[name] == value]
        order_a = list(a.sort_values("rank")["method"])
        order_b = list(b.sort_values("rank")["method"])
        same = order_a == order_b
        explained = same
        if not same and sorted(order_a) == sorted(order_b):
            undecided = set()
            ranked = a.sort_values("rank").reset_index(drop=True)
            for i in range(len(ranked) - 1):
                if ranked.loc[i, "ahead_of_next"] == "undecided":
                    undecided.add(frozenset((ranked.loc[i, "method"], ranked.loc[i + 1, "method"])))
            pos_b = {m: i for i, m in enumerate(order_b)}
            swapped = {
                frozenset((m, n))
                for i, m in enumerate(order_a)
                for n in order_a[i + 1 :]
                if pos_b[m] > pos_b[n]
            }
            # a swap is within the noise if the two are linked by a chain of undecided steps
            explained = all(_linked(pair, undecided, order_a) for pair in swapped)
        rows.append(
            {
                **dict(zip(GROUP, key, strict=True)),
                "order_a": " > ".join(order_a),
                "order_b": " > ".join(order_b),
                "same_order": same,
                "explained": explained,
            }
        )
    return pd.DataFrame(rows)


def _linked(pair: frozenset, undecided: set, order: list[str]) -> bool:
    """Whether the two methods of ``pair`` sit in one run of consecutive methods of ``order``
    each "undecided" against the next."""
    i, j = sorted(order.index(m) for m in pair)
    return all(frozenset((order[k], order[k + 1])) in undecided for k in range(i, j))


def verdict(knees: pd.DataFrame, orders: pd.DataFrame) -> str:
    """One line: how many knees and rankings two runs share, and whether the differences lie
    within the intervals."""
    same_k, n_k = int(knees["same_knee"].sum()), len(knees)
    unexplained_k = int((~knees["same_knee"] & ~knees["overlap"]).sum())
    same_r, n_r = int(orders["same_order"].sum()), len(orders)
    unexplained_r = int((~orders["explained"]).sum())
    ok = unexplained_k == 0 and unexplained_r == 0
    return (
        f"same knee in {same_k} of {n_k} cases ({n_k - same_k - unexplained_k} others within "
        f"overlapping intervals, {unexplained_k} not); same ranking in {same_r} of {n_r} "
        f"groups ({n_r - same_r - unexplained_r} others only swapping methods marked "
        f"undecided, {unexplained_r} not): {'reproduced' if ok else 'NOT reproduced'}"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="the first run's results/report folder")
    parser.add_argument("second", type=Path, help="the second run's results/report folder")
    args = parser.parse_args(argv)
    read = lambda folder, name: pd.read_csv(folder / f"multidevice_{name}.csv")  # noqa: E731
    knees = compare_knees(read(args.first, "capacity"), read(args.second, "capacity"))
    orders = compare_rankings(read(args.first, "ranking"), read(args.second, "ranking"))
    print(knees.to_markdown(index=False))
    print()
    print(orders.to_markdown(index=False))
    print()
    print(verdict(knees, orders))


if __name__ == "__main__":
    main()
