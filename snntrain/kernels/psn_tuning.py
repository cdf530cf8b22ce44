"""Launch sizes of the parallel spiking neuron kernels (:mod:`snntrain.kernels.psn`).

The forward, and the backward of short sequences (``T < DOT_MIN_T``), keep ``T`` fp32 values per neuron in
registers (the input column; the backward also dL/dH, ``2 T``), so the neurons per program shrink as T grows:
about ``REGS_PER_THREAD`` such values per thread. Longer sequences take the backward of ``[TP, BLOCK]`` tiles
and products (``tl.dot``): about ``DOT_TILE`` elements per tile, ``DOT_PROGRAMS_PER_SM`` programs per SM
walking the blocks. Derived from the register budget, not from a sweep.
"""

from __future__ import annotations

import functools

from .op_utils import cdiv, next_pow2

__all__ = ["MAX_T", "DOT_MIN_T", "WARPS", "REGS_PER_THREAD", "DOT_TILE", "DOT_PROGRAMS_PER_SM", "blocks",
           "bwd_launch"]

#: The longest sequence the kernels take: the forward's loops over T are unrolled at compile time (``T * T``
#: multiply-adds per neuron), which grows its code and compile time as ``T ** 2``.
MAX_T = 64
#: From this T on the backward runs on tiles with ``tl.dot`` (its ``T * T`` per-block sums for dL/dW would cost
#: more than the rest of the backward); below it, on ``T`` vectors.
DOT_MIN_T = 9
WARPS = 4
#: fp32 values per thread the vector kernels keep (the backward: 2 T per neuron).
REGS_PER_THREAD = 64
#: Elements of a ``[TP, BLOCK]`` tile of the tiled backward, and its programs per SM.
DOT_TILE = 2048
DOT_PROGRAMS_PER_SM = 8


@functools.lru_cache(maxsize=256)
def blocks(T: int) -> tuple[int, int]:
    """``(forward BLOCK, backward BLOCK)``: neurons per program of the vector kernels for ``T`` steps."""
    threads = 32 * WARPS
    per_thread_fwd = max(1, REGS_PER_THREAD // next_pow2(T))
    per_thread_bwd = max(1, REGS_PER_THREAD // (2 * next_pow2(T)))
    return min(threads * per_thread_fwd, 1024), min(threads * per_thread_bwd, 1024)


def bwd_launch(T: int, N: int, sms: int) -> tuple[int, int, int]:
    """``(BLOCK, programs, TP)`` of the tiled backward: ``TP`` is T rounded up to a power of two (at least 16,
    ``tl.dot``'s smallest side), ``BLOCK`` neurons per tile (at least 16)."""
    tp = max(16, next_pow2(T))
    block = max(16, DOT_TILE // tp)
    return block, max(1, min(cdiv(N, block), sms * DOT_PROGRAMS_PER_SM)), tp
