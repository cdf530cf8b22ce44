"""Launch sizes of the FP8 convolution kernels (:mod:`snntrain.kernels.spike_conv`).

A program computes a ``BLOCK_M x BLOCK_N`` tile of the output (positions by output channels), reducing over
``BLOCK_K`` input channels of one kernel position per step, with ``STAGES`` steps' loads in flight; programs go in
groups of ``GROUP_M`` row tiles (neighbours share input rows in L2).
"""

from __future__ import annotations

import functools

__all__ = ["QUANT_WARPS", "PRECAST", "conv_config"]

#: Warps of the weight-rounding kernel (one program per output channel).
QUANT_WARPS = 4
#: Cast the input to e4m3 in one pass before the convolution (True), or read it in its own dtype and convert each
#: tile in registers (False). On SEW-ResNet-18's layers at 224 (H200, 2026-12-03) the pass costs more than it saves
#: everywhere but the first stage's 3x3 convolutions (0.108 against 0.125 ms), e.g. 0.044 against 0.022 ms for the
#: second stage's 1x1 shortcut and 0.074 against 0.040 ms for the third stage's first convolution.
PRECAST = False


@functools.lru_cache(maxsize=256)  # a pure function of its arguments, called on every launch
def conv_config(cin: int, cout: int, positions: int) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)`` for ``cin`` input channels, ``cout`` output
    channels and a kernel of ``positions`` taps: the fastest of ``scripts/bench_spike_conv.py --sweep`` on SEW-ResNet-18's
    layers at 224 (H200, 2026-12-03, the input converted in registers) for the kind of layer; ``BLOCK_K`` at most
    the largest power of two that divides ``cin``."""
    if positions == 1:  # the 1x1 shortcuts
        cfg = (128, 128 if cout >= 128 else 64, 64, 8, 4, 4)
    elif cout >= 256:
        cfg = (128, 256, 128, 8, 8, 3)
    elif cout >= 128:
        cfg = (256, 128, 64, 8, 8, 4)
    else:
        cfg = (128, 64, 64, 8, 4, 4)
    bm, bn, bk, group, warps, stages = cfg
    return bm, bn, min(bk, cin & -cin), group, warps, stages
