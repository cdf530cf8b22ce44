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

Not yet measured on a GPU: the values follow the plain forward's and the max-pool's measured sizes
(``scripts/bench_pool.py --sweep``, ``scripts/bench_bn_neuron.py --sweep``), scaled for the state the window keeps,
and keep every stem case of ``scripts/kernel_resources.py --family neuron --only bn_pool`` free of register spills
for sm_90 (channels-last bf16 at the SEW-ResNet-18 stem: 137 registers, 3 programs per SM; NCHW tiles of 512
elements spilled with checkpoints, of 256 do not). ``scripts/bench_pool.py --stem --sweep`` times the choices.
"""

from __future__ import annotations

import functools

from .op_utils import next_pow2

__all__ = ["FWD_TILE", "FWD_STRIDED_TILE", "FWD_WARPS", "FWD_CL_CHANNELS", "FWD_STRIDED_CHANNELS", "fwd_tiles"]

#: Elements (pooled pixels x channels) per program tile of the forward (channels-last, NCHW), warps per program.
FWD_TILE, FWD_STRIDED_TILE, FWD_WARPS = 512, 256, 4
#: Channels per forward tile where the channel stride is 1, and where it is not.
FWD_CL_CHANNELS, FWD_STRIDED_CHANNELS = 32, 4


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments, called on every launch plan
def fwd_tiles(C: int, channels_unit_stride: bool) -> tuple[int, int]:
    """``(BLOCK_P, BLOCK_C)`` of the forward for a map of ``C`` channels."""
    block_c = min(next_pow2(C), FWD_CL_CHANNELS if channels_unit_stride else FWD_STRIDED_CHANNELS)
    return max((FWD_TILE if channels_unit_stride else FWD_STRIDED_TILE) // block_c, 16), block_c
