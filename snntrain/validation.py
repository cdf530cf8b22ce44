"""Checks for settings that arrive from configs and keyword arguments.

Each returns the value in its canonical type or raises ``ValueError`` naming the
setting, the value and what would be valid. YAML gives ints where floats are meant:
numbers accept both; booleans are never taken for numbers.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any


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


#: Data settings that fix how many time steps a sample has (an event dataset's frames, a synthetic dataset's
#: image sequences): they must equal the model's ``T``.
DATA_STEP_KEYS = ("T", "frames")


def check_time_steps(data: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    """Refuse a run whose data gives samples another number of time steps than the model's ``T``.

    A network fed sequences ``[T, B, ...]`` runs on as many steps as the data has, while its export and
    NIR graph record ``model.T``; both read the top-level ``T`` (``${T}``), so overriding ``T`` sets them
    together, and overriding one of them alone is refused here, before anything is built."""
    model_T = model.get("T")
    if model_T is None:
        return
    for key in DATA_STEP_KEYS:
        value = data.get(key)
        if value is not None and value != model_T:
            raise ValueError(
                f"data.{key}={value} and model.T={model_T} differ: the model would train on {value} steps per "
                f"sample while its export records model.T={model_T}. Set the number of steps once with T={value} "
                f"(data.{key} and model.T both read it), or override both")


def unknown_setting(section: str, owner: str, err: TypeError, target: Callable) -> ValueError:
    """A ``TypeError`` from calling ``target`` with a config section's keys as keyword arguments, as a setting's
    error: ``<section>.<key> is not a setting of <owner>``, with the nearest argument ``target`` takes (or, for
    another ``TypeError``, its message under the section's name)."""
    from .errors import closest

    m = re.search(r"unexpected keyword argument '(\w+)'", str(err))
    if m is None:
        return ValueError(f"bad {section} setting for {owner}: {err}")
    near = closest(m[1], [p for p in inspect.signature(target).parameters if p not in ("self", "backend", "seed")])
    return ValueError(f"{section}.{m[1]} is not a setting of {owner}" + (f"; did you mean {section}.{near}?" if near else ""))
