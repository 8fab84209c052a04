"""Number checks the package repeats: each returns the value converted (``int``, ``float`` or a
float array) or raises ``ValueError`` naming the field and the bad value.

- :func:`integer`: an integer >= ``minimum`` (an ``int``, an integral float or a numeric string,
  as JSON keys are; never a ``bool``);
- :func:`seconds`: a finite number of seconds, >= 0 or, with ``positive``, > 0 [s];
- :func:`positive_number`, :func:`nonneg_number`: a finite number > 0, or >= 0 (any unit);
- :func:`int_keyed_table`: a mapping integer key >= 1 -> seconds, as ``{"4": 0.01}`` from JSON;
- :func:`nonneg_array`, :func:`positive_array`: every entry of an array >= 0 and finite, or > 0.

The messages are the package's: "``name`` must be an integer >= 1, got 'x'", "``name`` must be a
number of seconds, got ...", "``name`` must be a finite time > 0 s, got ...", "``name`` must be
finite and >= 0", .... Torch-free (numpy only), so every layer may use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


def integer(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` as an ``int`` >= ``minimum``; a bool, a fraction, NaN or inf is refused."""
    message = f"{name} must be an integer >= {minimum}, got {value!r}"
    if isinstance(value, bool):
        raise ValueError(message)
    try:
        out = int(value)
        integral = out == float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(message) from None
    if not integral or out < minimum:
        raise ValueError(message)
    return out


def _number(name: str, value: Any, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {what}, got {value!r}") from None


def seconds(name: str, value: Any, positive: bool = False) -> float:
    """``value`` as a finite time [s], >= 0 (``positive``: > 0)."""
    out = _number(name, value, "a number of seconds")
    if not math.isfinite(out) or out < 0 or (positive and out == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite time {bound} s, got {value!r}")
    return out


def positive_number(name: str, value: Any) -> float:
    """``value`` as a finite float > 0 (a bandwidth, a parameter count, ...)."""
    out = _number(name, value, "a finite number > 0")
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def nonneg_number(name: str, value: Any) -> float:
    """``value`` as a finite float >= 0 (a count of bits, a weight, ...)."""
    out = _number(name, value, "finite and >= 0")
    if not (math.isfinite(out) and out >= 0):
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return out


def int_keyed_table(
    name: str,
    table: Any,
    key: str = "k",
    value: Callable[[str, Any], float] = seconds,
) -> dict[int, float]:
    """A ``{key: seconds}`` mapping with integer keys >= 1 (keys may be strings, as in JSON),
    sorted by key; each entry checked by ``value(f"{name}[{k}]", entry)``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{name} must map {key} -> seconds")
    out: dict[int, float] = {}
    for raw, entry in table.items():
        try:
            k = int(raw)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{name} key {raw!r} is not an integer {key}") from None
        if k != float(raw) or k < 1:
            raise ValueError(f"{name} key {raw!r} must be an integer {key} >= 1")
        if k in out:
            raise ValueError(f"{name} gives {key}={k} twice")
        out[k] = value(f"{name}[{k}]", entry)
    return dict(sorted(out.items()))


def nonneg_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array whose every entry is finite and >= 0."""
    arr = np.asarray(value, dtype=float)
    if np.any(~(arr >= 0)) or np.any(~np.isfinite(arr)):
        raise ValueError(f"{name} must be finite and >= 0")
    return arr


def positive_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a float array whose every entry is > 0 (NaN refused; +inf passes: a rate
    [bit/s] may be unbounded, which makes a transfer free)."""
    arr = np.asarray(value, dtype=float)
    if np.any(~(arr > 0)):
        raise ValueError(f"{name} must be > 0")
    return arr
