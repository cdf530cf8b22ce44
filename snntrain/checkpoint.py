"""Reading snntrain checkpoints with clear errors for missing, truncated or foreign files."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not an snntrain checkpoint."""


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a Lightning checkpoint written by snntrain (``weights_only``, on the CPU) and check it.

    Raises :class:`CheckpointError` naming the file and what is wrong with it.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): an interrupted save?")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip reader, unpickler and EOF errors all mean the same to the user
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {_first_sentence(err)}); "
            "the file is truncated, corrupt or not a PyTorch checkpoint"
        ) from err
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {path} has no 'state_dict': it is not a Lightning checkpoint")
    config = ckpt.get("hyper_parameters", {}).get("config")
    if not isinstance(config, dict) or "model" not in config or "task" not in config:
        raise CheckpointError(
            f"checkpoint {path} carries no snntrain run config (hyper_parameters.config): "
            "it was not written by snntrain"
        )
    return ckpt


def _first_sentence(err: BaseException, limit: int = 100) -> str:
    """The start of an error's message (PyTorch's unpickler adds a paragraph about ``weights_only``)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    text = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def checkpoint_config(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The resolved run config stored in a checkpoint read by :func:`read_checkpoint`."""
    return ckpt["hyper_parameters"]["config"]
