"""Launch plans of the layer-norm kernels (:mod:`snntrain.kernels.layer_norm`).

Every input is seen through a strided ``[B0, S, C]`` view (:func:`find_split`,
:func:`strides3`); a plan (:class:`Plan`, from :func:`plan_fwd`, :func:`plan_bwd` and
:func:`plan_dwdb`) gives the tiles, warps and persistent programs of each kernel for that
view, following the heuristics in :data:`TUNING`, which tests and benchmarks change to
reach other paths. The plans read the SM count through :func:`sm_count` of this module.
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .op_utils import INTERPRET, cdiv, next_pow2, sm_count

__all__ = ["Tuning", "TUNING", "Plan", "find_split", "strides3", "sizes3", "collapse", "geometry", "warps_for",
           "floor_pow2", "tile_plan", "plan_fwd", "plan_bwd", "plan_dwdb", "bwd_stages", "reg_cap", "direct_launch",
           "separate_dwdb", "const_s", "sm_count"]


@dataclass
class Tuning:
    """Launch heuristics (element counts are per program). Tests shrink them to reach the looped path.

    The defaults follow the H200 sweeps recorded in docs/experiments.md (layer-norm);
    where a setting helped one shape class and not another it has a channels-first (``cf_``)
    twin.
    """

    # Forward: one tile per program.
    fwd_tile: int = 4096  # rows: target elements per program
    cf_fwd_tile: int = 1024  # channels-first maps: target elements per program (56x56: x1.09 over 2048)
    fwd_warp_elems: int = 512  # num_warps = tile / warp_elems, clamped to [1, fwd_max_warps]
    fwd_max_warps: int = 16
    # Backward: G persistent programs loop over the tiles and keep dW/dB partial sums in registers.
    # Up to bwd_programs_per_sm programs of bwd_tile elements run per SM; when the partial-sum
    # budget (partial_frac) allows only k < bwd_programs_per_sm per SM, each gets a tile
    # bwd_programs_per_sm / k times larger, so the warps per SM stay the same.
    bwd_tile: int = 2048
    bwd_programs_per_sm: int = 4
    bwd_warp_elems: int = 512  # 16 elements per thread
    bwd_max_warps: int = 32
    # Software-pipelining depth of the tile loop (1: none; n: loads of n - 1 later tiles in
    # flight, staged in shared memory). Rows: 3 (4096 x 4096: x1.48 over 2, conv rows x1.11-1.14);
    # channels-first maps: 1 (56x56: x1.20 over 2). 2 was the slowest of the three everywhere.
    bwd_stages: int = 3
    cf_bwd_stages: int = 1
    stage_smem: int = 160 * 1024  # shared memory per SM the staged tiles may take (fewer stages beyond)
    bwd_reg_cap: bool = True  # cap registers so that the planned programs per SM fit (see reg_cap)
    partial_frac: float = 1 / 10  # bound on dW/dB partial-sum traffic (written + read) relative to the backward's
    cf_reduce_each: bool = False  # channels-first: fold dW/dB sums to [C] every tile instead of once per program
    # Both directions.
    cf_min_block_s: int = 16  # channels-first: positions per tile at least (14x14: fwd x1.34, bwd x1.18 over 8)
    max_tile: int = 16384  # largest tile a fused program holds; longer rows take the looped path
    loop_tile: int = 4096  # tile of one step of the looped path
    const_s_max: int = 4096  # channels-first maps with H*W <= this and not a multiple of 16: H*W compiled in
    fused_dw_max_c: int = 8192  # longest (power-of-2) row whose dW/dB sums stay in the fused backward
    cf_unaligned_separate_dw: bool = False  # channels-first, H*W % 4 != 0: dW/dB in a pass of their own
    dw_tile: int = 4096  # tile of the separate dW/dB pass (long rows, looped path)
    dw_block_c: int = 256  # channels per program of that pass
    dw_programs_per_sm: int = 4  # programs of that pass per SM (8 warps each), all in one wave
    finish_tile: int = 8192  # elements per program of the final dW/dB sum over the partials


TUNING = Tuning()


@dataclass(frozen=True)
class Plan:
    """The tiles, warps and programs of one direction (forward or backward) for a [B0, S, C] view."""

    B0: int
    S: int
    C: int
    split: int  # dims [0, split) form B0, dims [split, dim) (rows) or (dim, ndim) form S
    single: bool
    block_s: int
    block_c: int
    tiles_per_b: int
    num_tiles: int
    num_warps: int
    s_unit: bool  # S is the unit-stride axis (channels-first)
    programs: int  # backward: persistent programs G (forward: num_tiles)
    per_sm: int = 0  # backward: programs planned to run at once on one SM (G = SMs x per_sm)


def collapse(t: torch.Tensor, start: int, end: int) -> Optional[tuple[int, int]]:
    """(size, stride) of dims [start, end) of ``t`` merged into one strided dim, or None if they do not merge.

    A group of size 1 gets stride 0: Triton then knows that ``index * stride`` keeps the
    pointer aligned (a stride of 1 would hide the alignment and stop vectorised loads).
    """
    size, stride, expected = 1, 0, None
    for i in range(end - 1, start - 1, -1):
        n, s = t.shape[i], t.stride(i)
        if n == 1:
            continue
        if expected is None:
            stride = s
        elif s != expected:
            return None
        expected = s * n
        size *= n
    return size, stride


def strides3(t: torch.Tensor, dim: int, split: int) -> Optional[tuple[int, int, int]]:
    """Element strides (b, s, c) of ``t`` seen as [B0, S, C] with the grouping of :func:`find_split`."""
    nd = t.dim()
    if dim == nd - 1:
        gb, gs = collapse(t, 0, split), collapse(t, split, dim)
    else:
        gb, gs = collapse(t, 0, dim), collapse(t, dim + 1, nd)
    if gb is None or gs is None:
        return None
    return gb[1], gs[1], t.stride(dim)


def find_split(x: torch.Tensor, dim: int) -> Optional[int]:
    """How the dims of ``x`` group into [B0, S, C]; None when no grouping reads ``x`` in place."""
    if dim != x.dim() - 1:
        return 0 if strides3(x, dim, 0) is not None else None
    for split in range(0, dim + 1):  # rows: prefer everything in S, else two groups
        if strides3(x, dim, split) is not None:
            return split
    return None


def sizes3(shape: torch.Size, dim: int, split: int) -> tuple[int, int, int]:
    if dim == len(shape) - 1:
        return math.prod(shape[:split]), math.prod(shape[split:dim]), shape[dim]
    return math.prod(shape[:dim]), math.prod(shape[dim + 1:]), shape[dim]


def warps_for(tile: int, warp_elems: int, max_warps: int) -> int:
    return max(1, min(max_warps, tile // warp_elems))


def floor_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def tile_plan(B0: int, S: int, C: int, s_unit: bool, tile: int) -> tuple[bool, int, int, int]:
    """(single, block_s, block_c, tiles_per_b) for a target of ``tile`` elements per program."""
    tn = TUNING
    bc = next_pow2(C)
    s_cap = next_pow2(S)
    min_s = floor_pow2(tn.cf_min_block_s) if s_unit else 1
    bs = min(s_cap, max(min_s, floor_pow2(tile // bc)))
    single = bs * bc <= tn.max_tile
    if not single:
        bs = min(s_cap, min_s)
        bc = min(bc, max(16, tn.loop_tile // bs))
        if bs * bc > tn.loop_tile:
            bc = max(1, tn.loop_tile // bs)
    return single, bs, bc, cdiv(S, bs)


def geometry(x: torch.Tensor, dim: int, split: int) -> tuple[int, int, int, bool]:
    B0, S, C = sizes3(x.shape, dim, split)
    _sb, ss, sc = strides3(x, dim, split)
    return B0, S, C, ss == 1 and sc != 1 and S > 1


def plan_fwd(x: torch.Tensor, dim: int, split: int) -> Plan:
    tn = TUNING
    B0, S, C, s_unit = geometry(x, dim, split)
    single, bs, bc, tpb = tile_plan(B0, S, C, s_unit, tn.cf_fwd_tile if s_unit else tn.fwd_tile)
    n = B0 * tpb
    return Plan(B0, S, C, split, single, bs, bc, tpb, n, warps_for(bs * bc, tn.fwd_warp_elems, tn.fwd_max_warps),
                 s_unit, n)


def plan_bwd(x: torch.Tensor, dim: int, split: int, partials: bool) -> Plan:
    """Tiles and persistent programs of the backward.

    G = (SMs) x k programs, k <= bwd_programs_per_sm. With ``partials`` (dW/dB summed in the
    same kernel) k is also small enough that the G x 2 x C fp32 partial sums (written once,
    read once by the finishing sum) stay within ``partial_frac`` of the backward's traffic;
    with fewer programs per SM each gets a proportionally larger tile.
    """
    tn = TUNING
    B0, S, C, s_unit = geometry(x, dim, split)
    n_sm = sm_count(x.device)
    k = tn.bwd_programs_per_sm
    if partials:
        traffic = 3 * B0 * S * C * x.element_size()
        budget = int(tn.partial_frac * traffic / (16 * C))  # programs whose partials fit the budget
        k = max(1, min(k, budget // n_sm))
    single, bs, bc, tpb = tile_plan(B0, S, C, s_unit, tn.bwd_tile * tn.bwd_programs_per_sm // k)
    warps = warps_for(bs * bc, tn.bwd_warp_elems, tn.bwd_max_warps)
    n = B0 * tpb
    if single:
        # A tile larger than planned (a long row, the minimum positions per tile) takes more warps.
        k = max(1, min(k, tn.bwd_programs_per_sm * warps_for(tn.bwd_tile, tn.bwd_warp_elems, 64) // warps))
        programs = max(1, min(n, n_sm * k))
    else:
        programs = n
    return Plan(B0, S, C, split, single, bs, bc, tpb, n, warps, s_unit, programs, k)


def plan_dwdb(p: Plan, n_sm: int) -> tuple[int, int, int, int, int]:
    """(block_s, block_c, tiles_per_b, column blocks, row groups G) of the separate dW/dB pass.

    The grid is (column blocks, G) with at most ``dw_programs_per_sm`` x SMs programs in all,
    so they run in one wave: with one program more than a wave holds, the extra programs
    (each summing as many tiles as the others) would start only when others finish and
    double the pass's time.
    """
    tn = TUNING
    bc = min(next_pow2(p.C), floor_pow2(tn.dw_block_c))
    min_s = floor_pow2(tn.cf_min_block_s) if p.s_unit else 1
    bs = min(next_pow2(p.S), max(min_s, floor_pow2(tn.dw_tile // bc)))
    tiles_per_b = cdiv(p.S, bs)
    n_col = cdiv(p.C, bc)
    G = max(1, min(p.B0 * tiles_per_b, tn.dw_programs_per_sm * n_sm // n_col))
    return bs, bc, tiles_per_b, n_col, G


def bwd_stages(p: Plan, *tensors: torch.Tensor) -> int:
    """Pipelining depth of the fused backward's tile loop for plan ``p`` reading ``tensors`` per tile.

    ``cf_bwd_stages`` for channels-first maps, ``bwd_stages`` otherwise, lowered so that the
    ``stages - 1`` tiles staged in shared memory by each of the ``p.per_sm`` programs of an SM
    stay within ``stage_smem`` (a 16384-channel fp32 row at 3 stages would need 256 KB).
    """
    tn = TUNING
    want = max(1, tn.cf_bwd_stages if p.s_unit else tn.bwd_stages)
    per_stage = p.block_s * p.block_c * sum(t.element_size() for t in tensors)
    fit = 1 + tn.stage_smem // max(1, p.per_sm) // max(1, per_stage)
    return max(1, min(want, fit))


def reg_cap(p: Plan) -> dict:
    """Launch option capping registers per thread so that ``p.per_sm`` programs fit one SM's 64 K registers.

    The persistent backward assumes its G = SMs x per_sm programs all run at once; a program
    left waiting for a free slot would run after the others and double the kernel's time.
    Only when the op launches the kernel itself (eager, CUDA graphs): omitted in the
    interpreter and when torch traces the launch (torch.compile, export), whose kernel
    wrapper does not take the option.
    """
    if not TUNING.bwd_reg_cap or INTERPRET or not direct_launch():
        return {}
    return {"maxnreg": max(32, min(255, 65536 // (32 * p.num_warps * max(1, p.per_sm)) // 8 * 8))}


def direct_launch() -> bool:
    """True when ``wrap_triton`` hands back the plain Triton kernel (the op runs eagerly on real tensors)."""
    try:
        from torch._library.triton import is_wrap_triton_enabled
    except ImportError:  # an older torch: no such switch, keep to the plain options
        return False
    return not is_wrap_triton_enabled()


def separate_dwdb(x: torch.Tensor, dim: int, split: int) -> bool:
    """Whether dW/dB take a pass of their own instead of being summed in the fused backward.

    Rows longer than ``fused_dw_max_c`` (2 x C fp32 sums per program do not fit in registers),
    and, if ``cf_unaligned_separate_dw`` is set, channels-first maps whose H*W is not a
    multiple of 4, whose loads cannot be vectorised (the fused kernel spills there; the
    separate pass re-reads x and dy, mostly from L2 at 7x7). Off by default: at 7x7 the
    fused kernel was x1.23 faster on the H200 despite the spills.
    """
    B0, S, C, s_unit = geometry(x, dim, split)
    if next_pow2(C) > TUNING.fused_dw_max_c:
        return True
    return s_unit and S % 4 != 0 and TUNING.cf_unaligned_separate_dw


def const_s(p: Plan, *strides: tuple[int, int, int]) -> int:
    """H*W to compile into the kernels (0: none).

    For dense channels-first maps whose H*W is not a multiple of 16 (14x14, 7x7): Triton then
    knows the channel stride, so loads vectorise as far as H*W allows (4 elements at 14x14)
    and per-element addresses become immediate offsets instead of registers. One compilation
    per such H*W.
    """
    if not p.s_unit or p.S % 16 == 0 or p.S > TUNING.const_s_max:
        return 0
    return p.S if all(st[1] == 1 and st[2] == p.S for st in strides) else 0
