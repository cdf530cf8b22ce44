"""Launch sizes of the fused batch norm -> neuron -> max-pool forward (:mod:`snntrain.kernels.bn_neuron_pool`).

A program holds a tile of ``BLOCK_P`` pooled pixels by ``BLOCK_C`` channels and, for each, the state of the nine
input pixels of its window (and, for a stride-0 time axis, their normalised inputs): eighteen fp32 values per
element of the tile, so the tile is smaller than the plain norm-neuron forward's (``norm_neuron_tuning.FWD_TILE``).
Where channels are the unit stride (channels-last maps) the tile holds up to :data:`FWD_CL_CHANNELS` channels, so
that each pixel's channels are one contiguous run of loads and stores; elsewhere (NCHW maps)
:data:`FWD_STRIDED_CHANNELS` channels and the pooled pixels fill the rest of a smaller tile
(:data:`FWD_STRIDED_TILE`: the loads are not vectors there, so each element's address takes registers of its own).
The backward is the norm-neuron backward's kernel and launch sizes (:mod:`snntrain.kernels.norm_neuron_tuning`)
with a gather of the pooled gradient in place of the load of dL/dS.

Measured (``scripts/bench_pool.py --stem --sweep``, NVIDIA H200, bf16 channels-last, forward plus backward as
CUDA-graph replays, ms, 2026-12-02): 64 channels a tile is the fastest in both stem cases; 4 warps at T = 4 and 8 at
T = 16 (the event stem's longer scan):

| tile, channels, warps | SEW-ResNet-18 at 224 (T = 4) | event stem (T = 16) |
|---|---:|---:|
| 512, 32, 4 (the first choice) | 0.935 | 1.011 |
| 512, 64, 4 | **0.925** | 0.961 |
| 512, 64, 8 | 0.964 | **0.929** |
| 256, 16, 8 | 0.995 | 1.459 |

Every stem case of ``scripts/kernel_resources.py --family neuron --only bn_pool`` is free of register spills for
sm_90 (NCHW tiles of 512 elements spilled with checkpoints, of 256 do not).
"""

from __future__ import annotations

import functools

from .op_utils import next_pow2

__all__ = ["FWD_TILE", "FWD_STRIDED_TILE", "FWD_WARPS", "FWD_WARPS_LONG", "FWD_CL_CHANNELS", "FWD_STRIDED_CHANNELS",
           "fwd_tiles", "fwd_warps"]

#: Elements (pooled pixels x channels) per program tile of the forward (channels-last, NCHW); warps per program for
#: T <= 4 and for longer scans.
FWD_TILE, FWD_STRIDED_TILE, FWD_WARPS, FWD_WARPS_LONG = 512, 256, 4, 8
#: Channels per forward tile where the channel stride is 1, and where it is not.
FWD_CL_CHANNELS, FWD_STRIDED_CHANNELS = 64, 4


def fwd_warps(T: int) -> int:
    """Warps per program of the forward over ``T`` steps."""
    return FWD_WARPS if T <= 4 else FWD_WARPS_LONG


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, called on every launch plan
def fwd_tiles(C: int, channels_unit_stride: bool) -> tuple[int, int]:
    """``(BLOCK_P, BLOCK_C)`` of the forward for a map of ``C`` channels."""
    block_c = min(next_pow2(C), FWD_CL_CHANNELS if channels_unit_stride else FWD_STRIDED_CHANNELS)
    return max((FWD_TILE if channels_unit_stride else FWD_STRIDED_TILE) // block_c, 16), block_c
