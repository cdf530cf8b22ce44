"""What the command line says when a run fails.

A *user error* -- a setting with a bad value or an unknown key, a missing or unreadable file, a checkpoint
that is not one, data that breaks its format, something a setting needs that this machine lacks -- is
reported as one short message (:func:`describe`): what is wrong, the value, what would be valid and the fix,
with config keys named by their full path (``data.batch_size=-1``, where the datamodule's own check names
its argument ``batch_size``) and, for an unknown key, the nearest valid one. Any other exception is a bug
and keeps its traceback. :func:`is_user_error` tells them apart: Hydra's and OmegaConf's config errors,
and ``ValueError`` (with :class:`~snntrain.checkpoint.CheckpointError`,
:class:`~snntrain.data.common.BadDataError`, ...), the file errors of ``OSError`` and
:class:`UnavailableError` raised by snntrain's own code (in this process or in a data-loader process).
"""

from __future__ import annotations

import difflib
import re
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_PACKAGE = str(Path(__file__).resolve().parent)

#: At most this many lines of message (the command line adds one naming the log).
MAX_LINES = 2


class UnavailableError(RuntimeError):
    """Something a setting needs is not on this machine (a GPU, a package, a dataset that cannot be
    downloaded); the message says what to do."""


_FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
_WORKER = re.compile(r"^Caught (?P<type>\w+) in DataLoader worker process \d+\.\nOriginal Traceback")
_KEY = re.compile(r"^(?P<key>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)=")


def _in_package(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_PACKAGE)


def _worker_error(err: BaseException) -> tuple[str, str] | None:
    """``(message, file that raised it)`` of an exception a data-loader process raised and PyTorch raised again
    here (its message holds the original traceback)."""
    text = str(err)
    if not _WORKER.match(text):
        return None
    lines = text.splitlines()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if not frames:
        return None
    last = frames[-1]
    filename = lines[last].split('"')[1]
    rest = lines[last + 1:]
    start = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), None)
    if start is None:
        return None
    message = "\n".join(rest[start:])
    message = re.sub(r"^[\w.]+: ", "", message, count=1)
    return message, filename


def is_user_error(err: BaseException) -> bool:
    """Whether ``err`` is a user error (see the module's docstring) rather than a bug."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return True
    if not isinstance(err, (ValueError, UnavailableError, *_FILE_ERRORS)):
        return False
    worker = _worker_error(err)
    if worker is not None:
        return _in_package(worker[1])
    frames = traceback.extract_tb(err.__traceback__)
    if isinstance(err, _FILE_ERRORS):  # a missing or unreadable file is the user's wherever it was opened
        return any(_in_package(f.filename) for f in frames)
    return bool(frames) and _in_package(frames[-1].filename)


# ----------------------------------------------------------------------------- messages


def _leaves(node: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def _plain(cfg: Any) -> Mapping[str, Any]:
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not isinstance(cfg, DictConfig):
        return cfg
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # an interpolation that does not resolve outside the run: compare the others as written
        return OmegaConf.to_container(cfg, resolve=False)


def qualify(message: str, cfg: Any) -> str:
    """``message`` with the setting it starts with (``batch_size=-1 must be ...``, as a class names its argument)
    named by its full config key (``data.batch_size=-1 must be ...``): the one key of ``cfg`` that ends with that
    name and holds that value. Unchanged when the name is already a key, or no key (or more than one) fits."""
    m = _KEY.match(message)
    if m is None or cfg is None:
        return message
    name = m["key"]
    leaves = dict(_leaves(_plain(cfg)))
    if name in leaves:
        return message
    after = message[m.end():]
    fits = [key for key, value in leaves.items()
            if key.endswith(f".{name}") and (after.startswith(repr(value)) or after.startswith(str(value)))]
    return f"{fits[0]}={after}" if len(fits) == 1 else message


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to ``name`` (a typo's intended key or option), if one is near enough."""
    found = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def _listed(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def _unknown_key(err: BaseException) -> str | None:
    """Hydra's "Could not override 'model.dept'" (a key that is not in the config) as one message with the
    nearest valid key, instead of Hydra's advice to add the key with ``+``."""
    m = re.search(r"Could not override '([^']+)'", str(err))
    cause = err.__cause__
    parent = getattr(cause, "parent_node", None)
    if m is None or parent is None or not hasattr(parent, "keys"):
        return None
    key, bad = m[1], str(getattr(cause, "key", ""))
    full = str(getattr(cause, "full_key", "") or bad)
    value = re.search(r"use \+(?:\S+?)=(.*)$", str(err), re.M)
    value = value[1] if value else "..."
    section = full.rpartition(".")[0]
    keys = [str(k) for k in parent.keys()]
    where = f"{section} has no key {bad!r}" if section else f"the config has no top-level key {bad!r}"
    near = closest(bad, keys)
    if near is not None:
        suggestion = (f"{section}." if section else "") + near + key[len(full):]
        return f"{key}={value}: {where}; did you mean {suggestion}={value}?"
    listing = f"{section}'s keys" if section else "top-level keys"
    return (f"{key}={value}: {where}\n{listing}: {_listed(keys)} (a new key is added with +{key}={value}; "
            "python -m snntrain --cfg job lists the config)")


def _missing_option(err: BaseException) -> str | None:
    """Hydra's "Could not find 'backend/trition'" (a group option that does not exist) in one line with the
    group's options, and the nearest one."""
    options = getattr(err, "options", None)
    m = re.search(r"Could not find '([^']+)'", str(err))
    if not options or m is None:
        return None
    group, _, option = m[1].rpartition("/")
    near = closest(option, options)
    hint = f" (did you mean {group}={near}?)" if near is not None and group else ""
    return f"Could not find '{m[1]}'; available options in '{group}': {', '.join(map(str, options))}{hint}"


def _override_syntax(err: BaseException) -> str | None:
    """Hydra's parse error of an override, naming the override."""
    from hydra.errors import OverrideParseException

    if not isinstance(err, OverrideParseException):
        return None
    first, *rest = str(err.message).splitlines() or [""]
    return f"{err.override}: {first}" + (f" ({rest[0].strip()})" if rest else "")


def _omegaconf(err: BaseException) -> str | None:
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    if not isinstance(err, OmegaConfBaseException):
        return None
    key = getattr(err, "full_key", None)
    if isinstance(err, MissingMandatoryValue) and key:
        return f"{key} has no value (??? in the config): give it on the command line, {key}=<value>"
    first = (getattr(err, "msg", None) or str(err)).splitlines()[0]
    return f"{key}: {first}" if key and key not in first else first


def describe(err: BaseException, cfg: Any = None) -> str:
    """The message for a user error: at most :data:`MAX_LINES` lines, keys named by their full path in ``cfg``
    (the run's config, when there is one)."""
    worker = _worker_error(err)
    text = (_unknown_key(err) or _missing_option(err) or _override_syntax(err) or _omegaconf(err)
            or (worker[0] if worker else None) or str(err) or type(err).__name__)
    if isinstance(err, _FILE_ERRORS) and getattr(err, "filename", None) and not _KEY.match(text):
        text = f"{err.strerror or type(err).__name__}: {err.filename}" if err.strerror else text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = lines[:MAX_LINES - 1] + (["; ".join(lines[MAX_LINES - 1:])] if len(lines) >= MAX_LINES else [])
    lines[0] = qualify(lines[0], cfg)
    return "\n".join(lines)
