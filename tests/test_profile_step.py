"""scripts/profile_step.py: a profile of chosen training steps of a real command-line run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "profile_step.py"
TINY = ["debug=tiny", "data.batch_size=16", "trainer.limit_train_batches=4", "callbacks.precise_bn.enabled=false"]


def profile(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "p"), *args, "--", *TINY],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_profiles_the_chosen_steps_of_a_run(tmp_path):
    res = profile(tmp_path, "--epoch", "0", "--start", "1", "--steps", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "p" / "profile.txt").read_text()
    assert text.startswith("steps 2, wall per step (profiled) ")
    # the whole step of the real loop: the loader, the optimizer (which runs forward and backward) ...
    assert "enumerate(DataLoader)" in text and "Optimizer.step" in text
    # ... and the Python functions behind them, the task's training step among them
    assert "## Python functions by cumulative time (cProfile)" in text and "training_step" in text
    assert (tmp_path / "p" / "trace.json").stat().st_size > 0
    assert (tmp_path / "p" / "run" / "checkpoints" / "last.ckpt").exists()  # the run itself completed


@pytest.mark.slow
def test_a_step_the_run_never_reaches_is_an_error(tmp_path):
    res = profile(tmp_path, "--epoch", "0", "--start", "9", "--no-python")
    assert res.returncode != 0 and "step 9 of epoch 0 was never reached" in res.stderr
    res = profile(tmp_path, "--steps", "0")
    assert res.returncode != 0 and "--steps=0 must be >= 1" in res.stderr


def _load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_host_waits_section_is_written(tmp_path):
    res = profile(tmp_path, "--epoch", "0", "--start", "1", "--steps", "1", "--stacks")
    assert res.returncode == 0, res.stderr[-3000:]
    text = (tmp_path / "p" / "profile.txt").read_text()
    # a CPU run never waits for a device; --stacks takes the place of cProfile
    assert "(cProfile)" not in text
    assert "## where the host waits for the device (synchronising calls by Python stack)\nnone\n" in text


def test_host_waits_group_calls_by_the_python_function_that_made_them(tmp_path):
    import torch

    script = _load_script()
    x = torch.randn(1000)

    def doubles():
        return x * 2

    def adds():
        return x + 3

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        doubles()
        doubles()
        adds()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    events = script.trace_events(tmp_path / "trace.json")
    text = script.host_waits(events, names=("aten::mul",))
    assert text.startswith("aten::mul: 2 calls") and "doubles" in text and "adds" not in text, text
    assert script.host_waits(events, names=("aten::nonexistent",)) == "none\n"


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_host_waits_name_the_python_line_that_waits(tmp_path):
    import torch

    script = _load_script()
    x = torch.randn(1 << 20, device="cuda")

    def reads_a_number_back():
        return (x * 2).sum().item()  # a device-to-host copy: the host waits

    def queues_only():
        return (x * 3).sum()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA], with_stack=True) as prof:
        queues_only()
        reads_a_number_back()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    text = script.host_waits(script.trace_events(tmp_path / "trace.json"))
    assert "reads_a_number_back" in text and "queues_only" not in text, text
