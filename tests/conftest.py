"""Shared test setup.

Without a CUDA GPU the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET
must be set before any kernel module is imported, so it is set here, first. On a GPU
machine the same tests run the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: CUDA when present, else the CPU (interpreter)."""
    return DEVICE


def pytest_report_header(config):
    return f"snntrain tests on {DEVICE} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')})"


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests need a CUDA device: skipped, with the reason, where there is none.
    ``@pytest.mark.slow`` marks end-to-end runs (Trainer fits, subprocesses); ``-m "not slow"`` skips them."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
