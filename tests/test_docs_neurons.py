"""docs/neurons.md's worked example runs as written: its Python code blocks, in order, in one namespace (the
adaptive-threshold LIF defined with StepNeuron, trained in a small network until it separates two patterns)."""

from __future__ import annotations

import re
from pathlib import Path

from snntrain.nn import NEURONS

DOC = Path(__file__).resolve().parents[1] / "docs" / "neurons.md"


def test_worked_example_trains():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 2 and "class AdaptiveLIF(StepNeuron)" in blocks[0]
    namespace: dict = {"__name__": "neurons_doc"}
    try:
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), namespace)  # the example asserts its accuracy itself
        assert NEURONS["AdaptiveLIF"] is namespace["AdaptiveLIF"]
        assert namespace["accuracy"] > 0.9
    finally:
        NEURONS.pop("AdaptiveLIF", None)
