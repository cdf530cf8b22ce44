"""The ``--dry-run`` switch of the benchmark scripts, imported before anything else of theirs.

A script run with ``--dry-run`` checks its code paths without a GPU: this module puts ``scripts/`` and the
repository root on ``sys.path``, and sets ``TRITON_INTERPRET=1`` before any kernel module is imported, so the
kernels run in Triton's CPU interpreter on ``DEVICE`` (the CPU; ``cuda`` otherwise).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _path in (str(HERE.parent), str(HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"
DEVICE = "cpu" if DRY else "cuda"
