"""Launch sizes of the FP8 convolution kernels (:mod:`snntrain.kernels.spike_conv`).

A program computes a ``BLOCK_M x BLOCK_N`` tile of the output (positions by output channels), reducing over
``BLOCK_K`` input channels of one kernel position per step, with ``STAGES`` steps' loads in flight; programs go in
groups of ``GROUP_M`` row tiles (neighbours share input rows in L2).
"""

from __future__ import annotations

import functools

__all__ = ["QUANT_WARPS", "BLOCK_M", "BLOCK_K", "GROUP_M", "WARPS", "STAGES", "WIDE_N", "conv_config"]

#: Warps of the weight-rounding kernel (one program per output channel).
QUANT_WARPS = 4
#: Output positions and reduced input channels per tile.
BLOCK_M, BLOCK_K = 128, 128
#: Row tiles per group.
GROUP_M = 8
#: Warps and pipeline stages of a tile 128 channels wide; one 64 wide takes 4 warps.
WARPS, STAGES = 8, 3
#: Output channels per tile where there are at least this many.
WIDE_N = 128


@functools.lru_cache(maxsize=256)  # a pure function of its arguments, called on every launch
def conv_config(cin: int, cout: int, positions: int) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)`` for ``cin`` input channels, ``cout`` output
    channels and a kernel of ``positions`` taps."""
    block_n = WIDE_N if cout >= WIDE_N else 64
    warps = WARPS if block_n >= 128 else 4
    return BLOCK_M, block_n, min(BLOCK_K, cin & -cin), GROUP_M, warps, STAGES  # a power of two that divides cin
