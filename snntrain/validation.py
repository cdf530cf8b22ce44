"""Checks for settings that arrive from configs and keyword arguments.

Each returns the value in its canonical type or raises ``ValueError`` naming the
setting, the value and what would be valid. YAML gives ints where floats are meant:
numbers accept both; booleans are never taken for numbers.
"""

from __future__ import annotations

import math
from collections.abc import Collection


def positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} must be a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be finite")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be true or false")
    return value


def one_of(name: str, value: object, choices: Collection[str]) -> str:
    """``value`` if it is one of the names ``choices`` (a tuple, or the keys of a dict)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")
    return value
