"""Launch sizes of the generated neurons' layer-norm tile kernels (:mod:`snntrain.kernels.step_neuron`, spec
``affine`` ``"ln"``).

A program holds all ``C`` channels (padded to a power of two) of ``BLOCK_S`` positions, with every state, the
chunk's inputs and (backward) the chunk's recomputed states of each element in registers; ``C`` beyond
:data:`LN_TILE_MAX_C` (padded) leaves too few registers per element, and such layers take the three-pass path
(the layer norm's statistics kernel, the generated per-neuron kernels, the layer norm's backward kernel).
Elements per thread follow the generated per-neuron kernels (:mod:`snntrain.kernels.lif`'s launch sizes: 4 per
thread forward, 2 backward); the tiles are not yet swept on a GPU.
"""

from __future__ import annotations

import functools

from .norm_neuron_tuning import FINISH_C, finish_rows
from .op_utils import next_pow2

__all__ = ["LN_TILE_MAX_C", "LN_FWD_TILE", "LN_BWD_TILE", "LN_BWD_TILE_LONG", "LN_FWD_PER_WARP", "LN_BWD_PER_WARP", "LN_MAX_WARPS",
           "FINISH_MAX_VALUES", "ln_tile_fits", "ln_tiles", "finish_tile"]

#: The largest (power-of-two padded) channel count whose positions one program holds.
LN_TILE_MAX_C = 1024
#: Elements per program (at least one position's C channels).
LN_FWD_TILE, LN_BWD_TILE = 1024, 512
#: Elements per program of the backward where its chunks are longer than ``SHORT_CHUNK`` steps (T > 4): a thread then
#: holds 8 steps of its elements' inputs and recomputed states (ptxas for sm_90, LIF at C = 64: 159 registers in fp32,
#: 160 in bf16 with tiles of 512, one program of 8 warps per SM; a tile of 256 is 4 warps at 128 registers, four
#: programs per SM). Swept on an H200 (``scripts/bench_neurons.py --suite api-lif --sweep``, layer norm + LIF on
#: ``[32, 64, 64, 32, 32]``, graph replays): 256 took 2.97 / 2.64 ms (fp32 / bf16) against 3.07 / 2.65 for 512 and
#: 3.33 / 2.99 for 1024.
LN_BWD_TILE_LONG = 256
#: Elements per warp (32 threads): 4 per thread forward, 2 backward; at most LN_MAX_WARPS warps.
LN_FWD_PER_WARP, LN_BWD_PER_WARP, LN_MAX_WARPS = 128, 64, 16

#: The most partial sums one program of an eager generated backward adds up where it finishes the per-channel sums
#: itself (the last of a channel's programs with one value per program, else the last of all programs, over every
#: channel): beyond it the separate reduction, spread over the GPU, is the faster (one program reads serially).
#: 32 Ki values (128 KiB in fp32), about what a reduction's launch costs; not yet measured on a GPU.
FINISH_MAX_VALUES = 1 << 15


def finish_tile(channels: int) -> tuple[int, int]:
    """``(BLOCK_J, BLOCK_C)``: the tile in which a generated backward's last program adds up per-channel sums over
    ``channels`` channels (1: one channel's), the batch norm's finishing tile (:mod:`snntrain.kernels.
    norm_neuron_tuning`) laid over them."""
    block_c = min(next_pow2(channels), FINISH_C)
    return finish_rows(block_c), block_c


def ln_tile_fits(C: int) -> bool:
    """Whether the layer norm over ``C`` channels runs inside the generated neuron's tile kernels."""
    return next_pow2(C) <= LN_TILE_MAX_C


@functools.lru_cache(maxsize=1024)  # a pure function of its arguments and this module's names, called on every plan
def ln_tiles(C: int, backward: bool, long_chunks: bool = False) -> tuple[int, int, int]:
    """``(BLOCK_S, BLOCK_C, num_warps)`` of a direction's tile kernel: all C channels, positions to fill the
    direction's tile (the backward's ``LN_BWD_TILE_LONG`` where its chunks are long)."""
    block_c = next_pow2(C)
    tile = (LN_BWD_TILE_LONG if long_chunks else LN_BWD_TILE) if backward else LN_FWD_TILE
    block_s = max(1, tile // block_c)
    per_warp = LN_BWD_PER_WARP if backward else LN_FWD_PER_WARP
    return block_s, block_c, max(1, min(LN_MAX_WARPS, block_s * block_c // per_warp))
