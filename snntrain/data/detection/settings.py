"""Checks of the detection settings (ranges of the augmentation, box limits): each names the value and what
is valid."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..common import (
    positive_int,
)


def int_range(name: str, value: object, minimum: int = 0) -> tuple[int, int]:
    """Check that ``value`` is a pair ``[lo, hi]`` of integers with ``minimum <= lo <= hi``."""
    pair = _pair(name, value)
    if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair):
        raise ValueError(f"{name}={value!r} must be two integers [lo, hi]")
    lo, hi = int(pair[0]), int(pair[1])
    if not minimum <= lo <= hi:
        raise ValueError(f"{name}={value!r} must satisfy {minimum} <= lo <= hi")
    return lo, hi


def float_range(name: str, value: object, low: float, high: float) -> tuple[float, float]:
    """Check that ``value`` is a pair ``[lo, hi]`` of numbers with ``low <= lo <= hi <= high``."""
    pair = _pair(name, value)
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) for v in pair):
        raise ValueError(f"{name}={value!r} must be two numbers [lo, hi]")
    lo, hi = float(pair[0]), float(pair[1])
    if not low <= lo <= hi <= high:
        raise ValueError(f"{name}={value!r} must satisfy {low} <= lo <= hi <= {high}")
    return lo, hi


def _pair(name: str, value: object) -> tuple[Any, Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name}={value!r} must be a pair [lo, hi]")
    items = tuple(value)  # type: ignore[arg-type]
    if len(items) != 2:
        raise ValueError(f"{name}={value!r} must be a pair [lo, hi], got {len(items)} values")
    return items[0], items[1]


def _number(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise ValueError(f"{name}={value!r} must be a number in [{low}, {high}]")
    return float(value)


def optional_max_boxes(value: object) -> int | None:
    """Check a ``max_boxes`` setting: ``None`` (pad to the batch's largest count) or a positive integer."""
    return None if value is None else positive_int("max_boxes", value)
