"""Launch sizes of the max-pool kernels (:mod:`snntrain.kernels.spike_pool`).

A program holds a tile of ``BLOCK_P`` pixels by ``BLOCK_C`` channels. Where channels are the unit stride
(channels-last maps) the tile holds up to :data:`CL_CHANNELS` channels, so that each pixel's channels are one
contiguous run of loads, and enough pixels for about :data:`TILE` elements; elsewhere (NCHW maps) it holds
:data:`STRIDED_CHANNELS` channels and the pixels fill the rest.
"""

from __future__ import annotations

import functools

from .op_utils import next_pow2

__all__ = ["TILE", "WARPS", "CL_CHANNELS", "STRIDED_CHANNELS", "pool_tiles"]

#: Elements per program tile, warps per program.
TILE, WARPS = 2048, 4
#: Channels per tile where the channel stride is 1, and where it is not.
CL_CHANNELS, STRIDED_CHANNELS = 64, 4


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, called on every launch
def pool_tiles(C: int, channels_unit_stride: bool) -> tuple[int, int]:
    """``(BLOCK_P, BLOCK_C)`` for a map of ``C`` channels."""
    cap = CL_CHANNELS if channels_unit_stride else STRIDED_CHANNELS
    block_c = min(next_pow2(C), cap)
    return max(TILE // block_c, 16), block_c
