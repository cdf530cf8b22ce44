"""scripts/kernel_resources.py: the FP8 convolution's and the generated neurons' kernels compile for sm_90 without a
GPU (Triton's compiler and its bundled ptxas, outside the interpreter), and the report gives each build's
registers, spills, shared memory and programs per SM."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report(*args: str) -> list[tuple[str, dict]]:
    """``(kernel name, its resource dict)`` for every launch the script prints."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    out = []
    for name_line, usage_line in zip(lines, lines[1:]):
        if name_line.startswith("  ") and usage_line.strip().startswith("{'warps'"):
            out.append((name_line.split()[0], ast.literal_eval(usage_line.strip())))
    return out


def test_the_fp8_convolution_kernels_build_for_sm90():
    report = _report("--family", "spike_conv", "--layer", "layer4 shortcut")
    assert [name for name, _ in report] == ["quantize_kernel", "conv_kernel"]
    conv = report[1][1]
    assert conv["warps"] == 4 and 0 < conv["regs"] <= 255 and conv["programs/SM"] >= 1
    assert conv["spill B/thread"] == 0  # the carried accumulator: no spills (a second one spilled)


def test_the_generated_neuron_kernels_build_for_sm90():
    report = _report("--family", "step_neuron", "--neuron", "QIF", "--T", "4")
    assert [name for name, _ in report] == ["fwd_kernel", "bwd_kernel"] * 2  # fp32, then bf16
    assert all(0 < usage["regs"] <= 255 and usage["spill B/thread"] == 0 for _, usage in report)


def test_an_unknown_layer_is_refused_with_the_layers_named():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), "--family", "spike_conv",
                           "--layer", "layer9"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode != 0
    assert "--layer 'layer9' matches no layer; the layers are: layer1, layer2 first" in done.stderr

