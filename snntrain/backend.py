"""Compute-backend selection: ``torch`` (reference), ``triton`` (our kernels) or ``auto``.

Every module that has a Triton implementation (spiking neurons, norms, attention) takes a
``backend`` argument with one of :data:`BACKENDS`, checked when the module is built
(:func:`check_backend`); the forward only asks :func:`use_triton`. A module left at ``auto``
decides per call from the input's device: Triton for CUDA tensors, the PyTorch reference
otherwise.

A run decides once: every task of the CLI, :func:`snntrain.export.export_checkpoint`,
:func:`snntrain.export.load_checkpoint` and :func:`snntrain.predict.predict` turn the
configured name into ``torch`` or ``triton`` with :func:`resolve_backend` (one rule: Triton
where a CUDA device is used and Triton imports; ``triton`` asked for without CUDA is refused
unless Triton's CPU interpreter is on), build the model with the result and run it on
:func:`backend_device` outside a Trainer. A checkpoint stores the training run's choice once,
in its config (``backend.resolved``; :func:`trained_backend`).
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

from .errors import UnavailableError
from .validation import one_of

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "triton")


def triton_interpret() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_TRITON_IMPORTABLE: bool | None = None


def triton_importable() -> bool:
    """Whether the ``triton`` package imports (checked once)."""
    global _TRITON_IMPORTABLE
    if _TRITON_IMPORTABLE is None:
        try:
            import triton  # noqa: F401
        except ImportError:  # pragma: no cover - triton ships with Linux torch wheels
            _TRITON_IMPORTABLE = False
        else:
            _TRITON_IMPORTABLE = True
    return _TRITON_IMPORTABLE


def check_backend(name: object) -> str:
    """Validate a backend name and return it."""
    return one_of("backend", name, BACKENDS)


def resolve_backend(name: str, cuda: bool | None = None) -> str:
    """Turn ``auto`` into ``torch`` or ``triton`` and check that ``triton`` can run here.

    ``cuda`` says whether the run will use a CUDA device (default: whether one is
    present). ``triton`` without CUDA is refused unless the Triton interpreter is on.
    """
    check_backend(name)
    if cuda is None:
        cuda = torch.cuda.is_available()
    if name == "auto":
        chosen = "triton" if cuda and triton_importable() else "torch"
        log.info("backend=auto resolved to %s (%s)", chosen, "CUDA present" if cuda else "no CUDA device")
        return chosen
    if name == "triton":
        if not triton_importable():
            raise UnavailableError("backend=triton needs the 'triton' package, which is not installed; use backend=torch")
        if not cuda and not triton_interpret():
            raise UnavailableError(
                "backend=triton needs a CUDA GPU and none is in use here; "
                "use backend=torch (or backend=auto), or set TRITON_INTERPRET=1 to run the "
                "Triton kernels in the (slow) CPU interpreter"
            )
    return name


def backend_device(backend: str) -> torch.device:
    """Where a model on the resolved ``backend`` runs outside a Trainer (export, predict): the GPU for
    ``triton`` where there is one, else the CPU."""
    return torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")


def trained_backend(ckpt: dict) -> str | None:
    """The backend a checkpoint's run trained with: its config's ``backend.resolved``, or, in checkpoints that
    stored it a second time before, ``snntrain.backend`` where the config lacks it; None if neither says."""
    config = ckpt.get("hyper_parameters", {}).get("config", {})
    resolved = (config.get("backend") or {}).get("resolved")
    return resolved if resolved is not None else ckpt.get("snntrain", {}).get("backend")


def use_triton(backend: str, x: torch.Tensor) -> bool:
    """Per-call decision for a module built with ``backend`` (checked then) on input ``x``."""
    if backend == "torch":
        return False
    if backend == "auto":
        return x.is_cuda and triton_importable()
    if backend != "triton":  # set on a built module by hand: named here, at no cost to valid names
        check_backend(backend)
    if not x.is_cuda and not triton_interpret():
        raise RuntimeError(
            f"backend='triton' got a tensor on {x.device}; Triton kernels need CUDA tensors "
            "(or TRITON_INTERPRET=1 for the CPU interpreter). Use backend='torch' or 'auto' for CPU."
        )
    return True


class FallbackWarning:
    """What a layer says when a call it would run on our kernels runs another way (PyTorch's operation, the
    unfused ops, its own dtype): one warning per reason and process, so a training loop warns once, not per step.
    ``FallbackWarning(template)`` makes the warner; ``warner(reason)`` warns ``template.format(reason=reason)`` the
    first time ``reason`` comes (``stacklevel`` as :func:`warnings.warn`'s, counted from the caller); ``seen``
    holds the reasons warned about."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.seen: set[str] = set()

    def __call__(self, reason: str, stacklevel: int = 2) -> None:
        if reason not in self.seen:
            self.seen.add(reason)
            warnings.warn(self.template.format(reason=reason), stacklevel=stacklevel + 1)
