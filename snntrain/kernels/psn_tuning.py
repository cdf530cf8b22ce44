"""Launch sizes of the parallel spiking neuron kernels (:mod:`snntrain.kernels.psn`).

A program keeps ``T`` fp32 values per neuron in registers in the forward (the input column of its
neurons) and ``2 T`` in the backward (the input and dL/dH), so the neurons per program shrink as T
grows: about ``REGS_PER_THREAD`` such values per thread. The backward's partial sums of dL/dW
(``T * T`` block reductions per program) favour wide blocks, which this rule already gives at
small T. Derived from the register budget, not from a sweep.
"""

from __future__ import annotations

import functools

from .op_utils import next_pow2

__all__ = ["MAX_T", "WARPS", "REGS_PER_THREAD", "blocks"]

#: The longest sequence the kernels take: their loops over T are unrolled at compile time (``T * T``
#: multiply-adds per neuron and direction), which grows the code and its compile time as ``T ** 2``.
MAX_T = 64
WARPS = 4
#: fp32 values per thread the backward keeps (2 T per neuron).
REGS_PER_THREAD = 64


@functools.lru_cache(maxsize=256)
def blocks(T: int) -> tuple[int, int]:
    """``(forward BLOCK, backward BLOCK)``: neurons per program for a sequence of ``T`` steps."""
    threads = 32 * WARPS
    per_thread_fwd = max(1, REGS_PER_THREAD // next_pow2(T))
    per_thread_bwd = max(1, REGS_PER_THREAD // (2 * next_pow2(T)))
    return min(threads * per_thread_fwd, 1024), min(threads * per_thread_bwd, 1024)
