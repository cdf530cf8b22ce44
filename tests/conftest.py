"""Shared test setup.

Without a CUDA GPU the Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET
must be set before any kernel module is imported, so it is set here, first. On a GPU
machine the same tests run the compiled kernels on CUDA tensors.

Run configs come from the ``compose_run`` fixture: the config that ``python -m snntrain <overrides>``
would run, through Hydra's compose API. Tests start from ``debug=tiny`` (conf/debug/tiny.yaml: a run of
seconds on the CPU) and add only what they check.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from _testing import DEVICE  # noqa: E402


def _compose_run(out: str | os.PathLike | None, *overrides: str):
    from hydra import compose, initialize_config_module

    paths = [] if out is None else [f"paths.output_dir={Path(out)}"]
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[*overrides, *paths])


@pytest.fixture(scope="session")
def compose_run() -> Callable:
    """``compose_run(out, *overrides)``: the run config of ``python -m snntrain <overrides>`` writing into
    the run directory ``out`` (None: left to Hydra, for configs that are not run)."""
    return _compose_run


@pytest.fixture(scope="session")
def classifier_ckpt(tmp_path_factory) -> Path:
    """``last.ckpt`` of one ``debug=tiny`` classifier run, shared (read-only) by the tests that need a trained
    checkpoint."""
    from snntrain.cli import run

    out = tmp_path_factory.mktemp("cls")
    run(_compose_run(out, "debug=tiny"))
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: CUDA when present, else the CPU (interpreter)."""
    return DEVICE


def pytest_report_header(config):
    return f"snntrain tests on {DEVICE} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')})"


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked long: README.md's default runs in full (minutes on a CPU)")


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests need a CUDA device: skipped, with the reason, where there is none.
    ``@pytest.mark.slow`` marks end-to-end runs (Trainer fits, subprocesses); ``-m "not slow"`` skips them.
    ``@pytest.mark.long`` tests (also slow) run only with ``--long``."""
    if not config.getoption("--long"):
        skip_long = pytest.mark.skip(reason="a run of minutes: give --long")
        for item in items:
            if "long" in item.keywords:
                item.add_marker(skip_long)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
