"""Compute-backend selection: ``torch`` (reference), ``triton`` (our kernels) or ``auto``.

Every module that has a Triton implementation (spiking neurons, layer-norm) takes a
``backend`` argument with one of :data:`BACKENDS`. ``auto`` is decided per call from
the input's device: Triton for CUDA tensors, the PyTorch reference otherwise. The
CLI resolves ``auto`` once at start and logs the choice.
"""

from __future__ import annotations

import logging
import os

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


def use_triton(backend: str, x: torch.Tensor) -> bool:
    """Per-call decision for a module configured with ``backend`` on input ``x``."""
    if backend == "torch":
        return False
    if backend == "auto":
        return x.is_cuda and triton_importable()
    # backend == "triton"
    if not x.is_cuda and not triton_interpret():
        raise RuntimeError(
            f"backend='triton' got a tensor on {x.device}; Triton kernels need CUDA tensors "
            "(or TRITON_INTERPRET=1 for the CPU interpreter). Use backend='torch' or 'auto' for CPU."
        )
    return True
