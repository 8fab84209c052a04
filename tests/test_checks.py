"""The package's number checks (edgespec.checks): what each accepts, what it refuses, and that the
message names the field and the bad value."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from edgespec import checks


def re_repr(value) -> str:
    """``repr(value)`` as a regular expression that matches it literally."""
    return re.escape(repr(value))


@pytest.mark.parametrize(("value", "expected"), [(3, 3), (3.0, 3), ("4", 4), (np.int64(2), 2)])
def test_integer_accepts_integral_values(value, expected):
    out = checks.integer("gamma", value)
    assert out == expected and type(out) is int


@pytest.mark.parametrize("value", [True, False, 0, -2, 2.5, "2.5", "two", None, math.nan, math.inf])
def test_integer_refuses_and_names_the_field_and_value(value):
    with pytest.raises(ValueError, match=rf"^gamma must be an integer >= 1, got {re_repr(value)}$"):
        checks.integer("gamma", value)


def test_integer_minimum():
    assert checks.integer("num_mismatches", 0, minimum=0) == 0
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 2, got 1"):
        checks.integer("vocab_size", 1, minimum=2)


def test_seconds_nonnegative_and_positive():
    assert checks.seconds("rtt_s", 0) == 0.0
    assert checks.seconds("rtt_s", "0.25") == 0.25
    assert checks.seconds("slot", 1e-3, positive=True) == 1e-3
    with pytest.raises(ValueError, match=r"^slot must be a finite time > 0 s, got 0$"):
        checks.seconds("slot", 0, positive=True)
    with pytest.raises(ValueError, match=r"^rtt_s must be a finite time >= 0 s, got -0.5$"):
        checks.seconds("rtt_s", -0.5)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_seconds_refuses_non_finite(value):
    with pytest.raises(ValueError, match="rtt_s must be a finite time >= 0 s"):
        checks.seconds("rtt_s", value)


@pytest.mark.parametrize("value", [True, "soon", None, [1.0]])
def test_seconds_refuses_what_is_not_a_number(value):
    with pytest.raises(
        ValueError, match=rf"^rtt_s must be a number of seconds, got {re_repr(value)}$"
    ):
        checks.seconds("rtt_s", value)


def test_positive_and_nonnegative_numbers():
    assert checks.positive_number("bandwidth", 204.8) == 204.8
    assert checks.nonneg_number("bits", 0) == 0.0
    for bad in (0, -1.0, math.nan, math.inf, True, "fast"):
        with pytest.raises(ValueError, match=r"^bandwidth must be a finite number > 0, got "):
            checks.positive_number("bandwidth", bad)
    for bad in (-1, math.nan, math.inf, False, None):
        with pytest.raises(ValueError, match=r"^bits must be finite and >= 0, got "):
            checks.nonneg_number("bits", bad)


def test_int_keyed_table_sorts_and_checks_keys_and_entries():
    table = checks.int_keyed_table("topk_s", {"16": 0.2, 1: 0.1})
    assert list(table.items()) == [(1, 0.1), (16, 0.2)]
    with pytest.raises(ValueError, match="target_verify_s must map gamma -> seconds"):
        checks.int_keyed_table("target_verify_s", [0.1], key="gamma")
    with pytest.raises(ValueError, match="topk_s key 'four' is not an integer k"):
        checks.int_keyed_table("topk_s", {"four": 0.1})
    with pytest.raises(ValueError, match=r"topk_s key 2.5 must be an integer k >= 1"):
        checks.int_keyed_table("topk_s", {2.5: 0.1})
    with pytest.raises(ValueError, match="topk_s key 0 must be an integer k >= 1"):
        checks.int_keyed_table("topk_s", {0: 0.1})
    with pytest.raises(ValueError, match="topk_s gives k=3 twice"):
        checks.int_keyed_table("topk_s", {3: 0.1, "3": 0.2})
    with pytest.raises(ValueError, match=r"topk_s\[3\] must be a finite time >= 0 s, got -1"):
        checks.int_keyed_table("topk_s", {3: -1})


def test_arrays():
    np.testing.assert_array_equal(checks.nonneg_array("rtt_s", [0, 2]), [0.0, 2.0])
    assert checks.positive_array("rate_bps", math.inf) == math.inf
    for bad in ([0.1, -1], [math.nan], [math.inf]):
        with pytest.raises(ValueError, match=r"^rtt_s must be finite and >= 0$"):
            checks.nonneg_array("rtt_s", bad)
    for bad in ([1.0, 0.0], [math.nan], -3):
        with pytest.raises(ValueError, match=r"^rate_bps must be > 0$"):
            checks.positive_array("rate_bps", bad)
