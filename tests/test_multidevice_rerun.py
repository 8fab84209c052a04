"""Two runs of the many-device study: same knee and ranking, or differences the intervals
explain (edgespec.multidevice.rerun)."""

from __future__ import annotations

import pandas as pd
import pytest

from edgespec.multidevice.rerun import compare_knees, compare_rankings, main, verdict


def _capacity(knees):
    return pd.DataFrame(
        [
            {
                "method": m,
                "channel": "good",
                "uplink": "shared",
                "policy": "batch",
                "knee_n": k,
                "knee_n_lo": lo,
                "knee_n_hi": hi,
            }
            for m, (k, lo, hi) in knees.items()
        ]
    )


def _ranking(order, undecided=()):
    return pd.DataFrame(
        [
            {
                "channel": "good",
                "uplink": "shared",
                "policy": "batch",
                "rank": i + 1,
                "method": m,
                "ahead_of_next": ""
                if i == len(order) - 1
                else ("undecided" if m in undecided else "yes"),
            }
            for i, m in enumerate(order)
        ]
    )


def test_equal_knees_and_knees_within_overlapping_intervals_are_reproduced():
    first = _capacity({"hlm": (8, 8, 8), "vanilla_sd": (16, 8, 16), "wisv_sh": (4, 4, 4)})
    second = _capacity({"hlm": (8, 8, 8), "vanilla_sd": (8, 8, 8), "wisv_sh": (8, 8, 16)})
    knees = compare_knees(first, second).set_index("method")
    assert list(knees["same_knee"]) == [True, False, False]
    assert list(knees["overlap"]) == [True, True, False]  # wisv_sh: [4, 4] against [8, 16]
    orders = compare_rankings(_ranking(["a", "b"]), _ranking(["a", "b"]))
    line = verdict(knees.reset_index(), orders)
    assert line.startswith(
        "same knee in 1 of 3 cases (1 others within overlapping intervals, 1 not)"
    )
    assert line.endswith("NOT reproduced")


def test_a_swap_is_explained_only_between_methods_marked_undecided():
    first = _ranking(["a", "b", "c"], undecided={"b"})  # b ~ c undecided, a ahead of b
    swap_bc = compare_rankings(first, _ranking(["a", "c", "b"])).iloc[0]
    assert not swap_bc["same_order"] and swap_bc["explained"]
    swap_ab = compare_rankings(first, _ranking(["b", "a", "c"])).iloc[0]
    assert not swap_ab["explained"]
    chain = _ranking(["a", "b", "c"], undecided={"a", "b"})
    assert compare_rankings(chain, _ranking(["c", "b", "a"])).iloc[0]["explained"]
    knees = compare_knees(_capacity({"a": (4, 4, 4)}), _capacity({"a": (4, 4, 4)}))
    same = compare_rankings(first, first)
    assert verdict(knees, same).endswith(": reproduced")


def test_runs_of_different_cases_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="different cases"):
        compare_knees(_capacity({"a": (4, 4, 4)}), _capacity({"b": (4, 4, 4)}))
    for run in ("one", "two"):
        (tmp_path / run).mkdir()
        _capacity({"a": (4, 4, 4)}).to_csv(tmp_path / run / "multidevice_capacity.csv")
        _ranking(["a"]).to_csv(tmp_path / run / "multidevice_ranking.csv")
    main([str(tmp_path / "one"), str(tmp_path / "two")])
    assert capsys.readouterr().out.strip().endswith(": reproduced")
