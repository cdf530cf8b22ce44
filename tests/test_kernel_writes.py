"""Every registered operator's kernels write only what the operator allocates, as ``torch.compile`` sees them.

Inductor functionalizes a Triton kernel's launch from PyTorch's analysis of which of its arguments it stores to
(``identify_accessed_tensors``). The analysis counts a store at an address computed from a helper's return value as a
store to every pointer that helper took: a kernel whose output pointer comes out of a helper that also took its input
pointer is taken to write its input. A compiled training step then copies that input before the launch (a parameter
or an activation: bytes for nothing), and where the input is a leaf that requires grad, AOT autograd refuses the step
("a leaf Variable that requires grad is being used in an in-place operation"). ``tests/_kernel_writes.py`` runs the
analysis over the kernels of every registered operator, called as a compiled step calls them, in a fresh interpreter
(the kernels must be ``@triton.jit`` functions, not the interpreter's).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch._library.custom_ops import CustomOpDef

import snntrain.kernels

ROOT = Path(__file__).resolve().parents[1]


def _registered_operators() -> set[str]:
    names = set()
    for info in pkgutil.iter_modules(snntrain.kernels.__path__):
        mod = importlib.import_module(f"snntrain.kernels.{info.name}")
        names |= {v._qualname for v in vars(mod).values() if isinstance(v, CustomOpDef)}
    return names


@pytest.mark.slow  # a fresh interpreter generating the kernels' Triton IR
def test_no_kernel_is_taken_to_write_its_operators_inputs():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "_kernel_writes.py")], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    seen = {key.split(" ")[0] for key in report}
    assert _registered_operators() <= seen, f"operators not exercised: {_registered_operators() - seen}"
    assert len(report) >= 30
    written = {key: entry["inputs_written"] for key, entry in report.items() if entry["inputs_written"]}
    assert not written, f"kernels taken to write their operator's inputs: {written}"
    assert all(entry["writes"] for entry in report.values())  # every kernel writes something: the analysis ran
