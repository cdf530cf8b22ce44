"""Launch sizes of the fused norm-neuron kernels (:mod:`snntrain.kernels.bn_neuron`,
:mod:`snntrain.kernels.ln_neuron`).

Tiles hold about ``*_TILE`` elements per program: positions along the unit stride for NCHW
maps, channels for channels-last maps (at most ``*_CL_CHANNELS`` of them, :func:`bn_tiles`);
layer norm holds all C channels of ``BLOCK_S`` positions (:func:`ln_tiles`). The backward
keeps a chunk of states per element, so it uses smaller tiles. The statistics and backward kernels give each
program several position tiles, so that a set number of programs per SM remain (:func:`tile_groups`).
"""

from __future__ import annotations

import functools

import torch

from .op_utils import cdiv, next_pow2, sm_count

__all__ = ["FWD_TILE", "FWD_WARPS", "FWD_CL_CHANNELS", "BWD_TILE", "BWD_WARPS", "BWD_CL_CHANNELS",
           "BWD_CL_CHANNELS_LONG", "BWD_TILE_LONG", "BWD_PREFETCH", "STATS_TILE", "STATS_WARPS", "FINISH_R",
           "FINISH_C", "STATS_PROGRAMS_PER_SM", "BWD_PROGRAMS_PER_SM", "LN_FWD_TILE", "LN_BWD_TILE", "LN_WARPS",
           "block_s", "tile_groups", "bn_tiles", "finish_rows", "ln_tiles"]

# Measured on an H200 (scripts/bench_bn_neuron.py --sweep, every BN-neuron layer of SEW-ResNet-18 at 224 and of
# the T=16 event network, channels-last, bf16 and fp32, 2026-11-27): backward tiles of 256 elements beat 512
# and 128 (128 won only the fp32 T=16 layers), channels-last forward and statistics tiles of 32 channels beat 64
# and 16; statistics tiles of 4096 elements with 4 programs per SM beat 2048 with 8 (-13 % forward in bf16).
# The backward's channels-last tiles hold 64 channels where the scan's chunks have 4 steps (T <= 4: SEW-18's
# layers 4 % faster than with 32) and 32 where they are longer (BWD_CL_CHANNELS_LONG: the T=16 event layers 21 %
# faster than with 64). Since the backward's one loop over (tile, chunk) pairs with the next pair's loads issued
# first (2026-12-03, bf16 channels-last, --sweep --quick): backward tiles of 512 elements beat 256 where the chunks
# have 4 steps (SEW-18's layers forward + backward 2.484 against 2.709 ms; 128 and 1024 slower), in channels-last
# tiles of 32 channels there too (2.343 against 64's 2.484; 6 programs per SM with 64: 2.428); the prefetch takes
# 16 % off both networks' layers (SEW-18 2.969 -> 2.484 ms with tiles of 512, event 2.545 -> 2.150).
FWD_TILE, FWD_WARPS, FWD_CL_CHANNELS = 1024, 4, 32
BWD_TILE, BWD_WARPS, BWD_CL_CHANNELS, BWD_CL_CHANNELS_LONG = 512, 4, 32, 32
# Backward tiles where the scan's chunks are longer than 4 steps: a chunk of 8 steps in tiles of 512 elements spills
# (fp32 PLIF at T = 16: 255 registers and 96 bytes a thread, scripts/kernel_resources.py --family neuron --only bn).
BWD_TILE_LONG = 256
STATS_TILE, STATS_WARPS = 4096, 4
FINISH_R, FINISH_C = 64, 16
# The backward's scan issues the loads of its program's next (tile, chunk) before the scan of the current one, so
# that they are in flight while it computes (a few registers more per thread).
BWD_PREFETCH = True
# Programs per SM (see tile_groups) of the statistics pass and of the backward's scan (both write partial sums).
STATS_PROGRAMS_PER_SM, BWD_PROGRAMS_PER_SM = 4, 8
# Layer norm holds all C channels of BLOCK_S positions; tiles up to these many elements.
LN_FWD_TILE, LN_BWD_TILE, LN_WARPS = 2048, 1024, 8


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments, called on every launch
def block_s(S: int, tile: int) -> int:
    """Positions per tile for an NCHW map: the largest power of two (16 .. tile) that pads
    S by at most 7%, else the one that pads least (56x56: 64, 28x28: 64, 14x14: 16)."""
    if S <= 16:
        return next_pow2(S)
    cands = [b for b in (1 << k for k in range(4, tile.bit_length())) if b <= tile]
    waste = {b: -(-S // b) * b / S - 1.0 for b in cands}
    good = [b for b in cands if waste[b] <= 0.07]
    return max(good) if good else min(cands, key=lambda b: (waste[b], -b))


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments, called on every launch
def tile_groups(B: int, S: int, block_s: int, g1: int, dev: torch.device, per_sm: int) -> tuple[int, int]:
    """``(groups, TPP)``: each program of a kernel that loops over position tiles takes TPP
    consecutive ones, so that about ``per_sm`` programs per SM remain (and a kernel that writes
    per-program partial sums leaves its finishing kernel few rows to add)."""
    sms = sm_count(dev, cpu=1)
    s_tiles = cdiv(S, block_s)
    tpp = max(1, min(s_tiles, (B * s_tiles * g1) // (per_sm * sms)))
    return cdiv(s_tiles, tpp), tpp


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments, called on every launch
def bn_tiles(C: int, S: int, cl: bool, tile: int, cl_channels: int) -> tuple[int, int]:
    """(BLOCK_S, BLOCK_C): along the channels for channels-last maps (at most ``cl_channels`` of them), else
    along the positions."""
    if cl:
        block_c = min(next_pow2(C), cl_channels)
        return max(1, tile // block_c), block_c
    bs = block_s(S, tile)
    return bs, max(1, min(next_pow2(C), tile // bs))


def finish_rows(block_c: int) -> int:
    """Rows per step where a kernel's last program finishes its partial sums for ``block_c`` channels: the
    finishing kernels' tile (``FINISH_R x FINISH_C`` elements) laid over that many channels."""
    return max(1, FINISH_R * FINISH_C // block_c)


@functools.lru_cache(maxsize=4096)  # a pure function of its arguments, called on every launch
def ln_tiles(C: int, tile: int) -> tuple[int, int]:
    """(BLOCK_S, BLOCK_C) of the layer-norm kernels: all C channels, positions to fill ``tile``."""
    block_c = next_pow2(C)
    return max(1, tile // block_c), block_c
