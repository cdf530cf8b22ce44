"""Launch sizes of the parallel spiking neuron kernels (:mod:`snntrain.kernels.psn`).

Three kernel shapes, by sequence length:

* ``T <= VEC_MAX_T``, the forward: one block of ``fwd_block(T)`` neurons per program, every thread holding
  the whole input column of its neurons (``T`` fp32 vectors) in registers, about ``REGS_PER_THREAD`` such
  values per thread; ``cdiv(N, block)`` programs (thousands on the tutorial's ``[T, 64, 65536]``: many waves).
* ``T <= VEC_BWD_MAX_T`` (and the sliding form up to ``VEC_MAX_T``), the backward: one wave of persistent
  programs (as many per SM as the estimate of their registers lets fit, ``bwd_programs_per_sm``), each walking
  blocks of ``bwd_block`` neurons and keeping its dL/dW and dL/db sums per thread (``T * T + T`` vectors; the
  sliding form one per diagonal), reduced across the program once at its end. Otherwise up to ``VEC_MAX_T``:
  the same with ``mma_block(T)`` neurons per block, dL/dW summed by a tensor-core product (``T * T`` sums per
  thread would not fit in registers), ``MMA_PROGRAMS_PER_SM`` programs per SM.
* ``T > VEC_MAX_T``: ``[TP, BLOCK]`` tiles and fp32 products (``tl.dot``): about ``DOT_TILE`` elements per
  tile, one tile per forward program, ``DOT_PROGRAMS_PER_SM`` backward programs per SM walking the blocks.

The weight gradient's per-program partial sums (one row per backward program) are finished by one small
kernel reading ``FINISH_TILE`` partials per step. Derived from the register budget and the SM count, not from
a sweep; ``scripts/bench_neurons.py --suite psn --sweep`` times alternatives by setting these names.
"""

from __future__ import annotations

from .op_utils import cdiv, next_pow2

__all__ = ["MAX_T", "VEC_MAX_T", "VEC_BWD_MAX_T", "DOT_MIN_T", "MASKED_VEC_MAX_T",
           "MASKED_DOT_PROGRAMS_PER_SM", "WARPS", "REGS_PER_THREAD", "FWD_MAX_PER_THREAD",
           "BWD_BLOCK_REGS", "BWD_BASE_REGS", "MMA_PROGRAMS_PER_SM", "MMA_PER_THREAD", "MMA_STAGES", "DOT_TILE", "DOT_PROGRAMS_PER_SM", "DOT_PRECISION",
           "FINISH_TILE",
           "fwd_block", "vec_max_t", "bwd_block", "bwd_programs_per_sm", "mma_block", "bwd_programs", "dot_tiles", "dot_programs", "finish_rows"]

#: The longest sequence the kernels take: a tile's program holds the ``[TP, TP]`` weight (and in the backward its
#: transpose and the dL/dW accumulator) in registers.
MAX_T = 64
#: Up to this T both directions keep one fp32 vector per step in registers with the loops over T unrolled
#: (``T * T`` multiply-adds per neuron and direction, the weight read as scalars).
VEC_MAX_T = 16
#: Up to this T the backward sums dL/dW per thread (``T * T`` vectors); beyond, in a tensor-core product.
VEC_BWD_MAX_T = 8
#: From this T on both directions run on tiles with ``tl.dot``.
DOT_MIN_T = VEC_MAX_T + 1
#: The masked form runs on tiles from ``MASKED_VEC_MAX_T + 1`` on, with ``MASKED_DOT_PROGRAMS_PER_SM`` backward
#: programs per SM up to ``VEC_MAX_T``: at T = 16 (``[16, 64, 65536]``, H200, graph replays) 1.06 against 1.57 ms
#: forward plus backward in bf16 and 1.23 against 1.60 ms in fp32 for the vector kernels; the dense and sliding forms
#: are faster on the vectors (PSN 0.98 against 1.06-1.17 ms, SlidingPSN 0.36 against 1.01 ms in bf16).
MASKED_VEC_MAX_T = 8
MASKED_DOT_PROGRAMS_PER_SM = 3
WARPS = 4
#: fp32 values of the input column per thread of the forward (T per neuron).
REGS_PER_THREAD = 64
#: Neurons per thread of the forward at most (two 16-byte vectors of fp32 per step).
FWD_MAX_PER_THREAD = 8
#: fp32 values per thread of the per-thread backward's block: its sums (``T * T + T``, the sliding form's one per
#: diagonal) and the block's input column, dL/dS and dL/dH (``3 T``), per neuron.
BWD_BLOCK_REGS = 128
#: Registers a thread has beside those (addresses, the weight's scalars, temporaries), in the estimate of how many
#: programs fit on an SM (checked against ptxas for sm_90: 157 registers at T = 4, 214 at T = 8, dense weight).
BWD_BASE_REGS = 24
#: Persistent backward programs per SM of the tensor-core backward (ptxas: about 255 registers a thread).
MMA_PROGRAMS_PER_SM = 2
#: Neurons per thread per block of the tensor-core backward (its input column, dL/dH and their tiles in registers).
MMA_PER_THREAD = 2
#: Software-pipelining stages of the tensor-core backward: 1, its loads stay in registers (Triton would otherwise
#: stage them through shared memory, three times the product's operands).
MMA_STAGES = 1
#: Elements of a ``[TP, BLOCK]`` tile of the tiled kernels, and the tiled backward's programs per SM.
DOT_TILE = 2048
DOT_PROGRAMS_PER_SM = 8
#: ``tl.dot``'s ``input_precision`` in the tiled kernels' fp32 products: ``"ieee"`` (fp32 multiply-adds, not on tensor
#: cores) or ``"tf32x3"`` (three TF32 tensor-core products, about fp32's accuracy).
DOT_PRECISION = "ieee"
#: Partial sums the finishing kernel reads per step (``[rows, columns]`` tile).
FINISH_TILE = 4096


def fwd_block(T: int) -> int:
    """Neurons per program of the forward for ``T <= VEC_MAX_T`` steps (``WARPS`` warps)."""
    per_thread = max(1, min(FWD_MAX_PER_THREAD, REGS_PER_THREAD // next_pow2(T)))
    return 32 * WARPS * per_thread


def bwd_block(T: int, sums: int) -> int:
    """Neurons per block of the per-thread backward: ``sums`` per neuron (dL/dW and dL/db) and the block's ``3 T``
    rows in about ``BWD_BLOCK_REGS`` registers a thread, 1 to 8 neurons per thread."""
    per_thread = max(1, min(8, BWD_BLOCK_REGS // next_pow2(sums + 3 * T)))
    return 32 * WARPS * per_thread


def bwd_programs_per_sm(T: int, sums: int, weights: int, block: int) -> int:
    """Per-thread backward programs that fit on an SM at once (65536 registers), from an estimate of a thread's
    registers: the block's sums and rows, the ``weights`` scalars of W held, ``BWD_BASE_REGS`` more."""
    regs = (sums + 3 * T) * (block // (32 * WARPS)) + weights + BWD_BASE_REGS
    return max(1, min(8, 65536 // (min(regs, 255) * 32 * WARPS)))


def mma_block(T: int) -> tuple[int, int]:
    """``(BLOCK, TP)`` of the tensor-core backward: ``TP`` = 16 (the product's smallest side, T <= 16)."""
    return 32 * WARPS * MMA_PER_THREAD, max(16, next_pow2(T))


def bwd_programs(per_sm: int, n_blocks: int, sms: int) -> int:
    """Programs of a persistent backward: one full wave, ``per_sm`` per SM, at most one per block."""
    return max(1, min(n_blocks, sms * per_sm))


def dot_tiles(T: int) -> tuple[int, int]:
    """``(BLOCK, TP)`` of the tiled kernels: ``TP`` is T rounded up to a power of two (at least 16, ``tl.dot``'s
    smallest side), ``BLOCK`` neurons per tile (at least 16)."""
    tp = max(16, next_pow2(T))
    return max(16, DOT_TILE // tp), tp


def vec_max_t(masked: bool) -> int:
    """The longest T the vector kernels take for the masked form (``masked``) or the others."""
    return MASKED_VEC_MAX_T if masked else VEC_MAX_T


def dot_programs(N: int, block: int, sms: int, T: int = MAX_T, masked: bool = False) -> int:
    """Programs of the tiled backward at ``T`` steps, each walking ``cdiv(N, block) / programs`` blocks."""
    per_sm = MASKED_DOT_PROGRAMS_PER_SM if masked and T <= VEC_MAX_T else DOT_PROGRAMS_PER_SM
    return max(1, min(cdiv(N, block), sms * per_sm))


def finish_rows(columns: int) -> int:
    """Partial rows per step of the finishing kernel for rows of ``columns`` (a power of two) values."""
    return max(1, FINISH_TILE // columns)
