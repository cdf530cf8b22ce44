"""Config sections that moved, and the overrides that still name them.

The callbacks' settings live in the ``callbacks`` group (``conf/callbacks/``) and DistributedDataParallel's
with the trainer (``conf/trainer/``). On the command line the old keys keep working:
:func:`upgrade_overrides` rewrites ``precise_bn.num_batches=4`` to ``callbacks.precise_bn.num_batches=4``
and says so. A composed config that still carries an old section (a config file of one's own, or
``+ema.enabled=true`` through Hydra's compose API) is refused by :func:`check_moved`, naming the new key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

#: old top-level section -> its place now
MOVED = {
    "checkpoint": "callbacks.checkpoint",
    "precise_bn": "callbacks.precise_bn",
    "ema": "callbacks.ema",
    "ddp": "trainer.ddp",
}

# an override: optional +, ++ or ~, a dotted key, then "=value" (or nothing, for a deletion)
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w.]*)(?P<rest>=.*)?$", re.DOTALL)


def _moved_key(key: str) -> str | None:
    head, _, tail = key.partition(".")
    if head not in MOVED:
        return None
    return MOVED[head] + ("." + tail if tail else "")


def upgrade_overrides(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """``args`` (command-line arguments) with every override of a moved key rewritten to the new key,
    and one note per rewrite. Options (``-m``, ``--cfg job``, ...) and other overrides pass unchanged."""
    out, notes = [], []
    for arg in args:
        m = _OVERRIDE.match(arg)
        if m and (m["rest"] is not None or m["prefix"] == "~"):
            new_key = _moved_key(m["key"])
            if new_key is not None:
                new = f"{m['prefix'] or ''}{new_key}{m['rest'] or ''}"
                notes.append(f"{m['key']} is now {new_key}: read {arg} as {new}")
                arg = new
        out.append(arg)
    return out, notes


def _leaves(node: Any, path: str) -> list[str]:
    if isinstance(node, Mapping) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{path}.{k}")]
    return [path]


def check_moved(cfg: Mapping[str, Any]) -> None:
    """Refuse a run config that still sets a moved section, naming each key's new place."""
    found = [(old, leaf) for old in MOVED if old in cfg for leaf in _leaves(cfg[old], old)]
    if found:
        moves = ", ".join(f"{leaf} -> {_moved_key(leaf)}" for _, leaf in found)
        raise ValueError(f"these config keys have moved: {moves}. Set the new keys instead "
                         f"({', '.join(sorted({MOVED[old] for old, _ in found}))}); on the command line "
                         "the old keys still work")
