"""Launch sizes of the parallel spiking neuron kernels (:mod:`snntrain.kernels.psn`).

Short sequences (``T < DOT_MIN_T``) keep ``T`` fp32 values per neuron in registers (the input column; the
backward also dL/dH, ``2 T``), so the neurons per program shrink as T grows: about ``REGS_PER_THREAD`` such
values per thread. Longer sequences run on ``[TP, BLOCK]`` tiles and products (``tl.dot``): about ``DOT_TILE``
elements per tile, one tile per forward program, ``DOT_PROGRAMS_PER_SM`` backward programs per SM walking the
blocks. Derived from the register budget, not from a sweep.
"""

from __future__ import annotations

import functools

from .op_utils import cdiv, next_pow2

__all__ = ["MAX_T", "DOT_MIN_T", "WARPS", "REGS_PER_THREAD", "DOT_TILE", "DOT_PROGRAMS_PER_SM", "blocks",
           "dot_tiles", "dot_programs"]

#: The longest sequence the kernels take: a tile's program holds the ``[TP, TP]`` weight (and in the backward its
#: transpose and the dL/dW accumulator) in registers.
MAX_T = 64
#: From this T on both directions run on tiles with ``tl.dot`` (the vector backward's ``T * T`` per-block sums for
#: dL/dW would cost more than the rest of it, the vector forward's ``T * T`` scalar loads of W grow toward as
#: many as its multiply-adds); below it, on ``T`` vectors with the loops unrolled.
DOT_MIN_T = 9
WARPS = 4
#: fp32 values per thread the vector kernels keep (the backward: 2 T per neuron).
REGS_PER_THREAD = 64
#: Elements of a ``[TP, BLOCK]`` tile of the tiled kernels, and the tiled backward's programs per SM.
DOT_TILE = 2048
DOT_PROGRAMS_PER_SM = 8


@functools.lru_cache(maxsize=256)
def blocks(T: int) -> tuple[int, int]:
    """``(forward BLOCK, backward BLOCK)``: neurons per program of the vector kernels for ``T`` steps."""
    threads = 32 * WARPS
    per_thread_fwd = max(1, REGS_PER_THREAD // next_pow2(T))
    per_thread_bwd = max(1, REGS_PER_THREAD // (2 * next_pow2(T)))
    return min(threads * per_thread_fwd, 1024), min(threads * per_thread_bwd, 1024)


def dot_tiles(T: int) -> tuple[int, int]:
    """``(BLOCK, TP)`` of the tiled kernels: ``TP`` is T rounded up to a power of two (at least 16, ``tl.dot``'s
    smallest side), ``BLOCK`` neurons per tile (at least 16)."""
    tp = max(16, next_pow2(T))
    return max(16, DOT_TILE // tp), tp


def dot_programs(N: int, block: int, sms: int) -> int:
    """Programs of the tiled backward, each walking ``cdiv(N, block) / programs`` blocks."""
    return max(1, min(cdiv(N, block), sms * DOT_PROGRAMS_PER_SM))
