"""Synaptic-operation counting in Triton: one pass over a layer's input per call.

For the input ``x`` of a convolution (``Conv2d``) or ``Linear`` layer, one launch adds to
a three-element int64 counter:

* ``out[0]`` the effective synaptic operations: every nonzero input element times the
  number of nonzero weights it meets (its fan-out), i.e. ``sum(conv(x != 0, W != 0))``
  without the bias, NeuroBench's count;
* ``out[1]`` the number of nonzero input elements;
* ``out[2]`` the number of input elements outside ``{-1, 0, 1}`` (any one makes the call's
  operations multiply-accumulates under NeuroBench's rule; none makes them accumulates).

The fan-out is not stored per input element: the kernel gets, per input channel and kernel
tap, how many nonzero weights of the channel's group read it (``m``, ``[C, KH, KW]``), and
decides per element and tap, from the convolution's geometry, whether some output position
reads the element through that tap (zero padding reads nothing). A ``Linear`` layer is the
case ``KH = KW = 1`` with a spatial size of 1. So nothing is built per input shape, and
inputs of any size cost no memory beyond the counter.

Layouts: ``x`` is read in memory order; any dense layout with the sample dimension outermost
works (``[N, C, H, W]`` contiguous or channels-last, ``[..., features]`` for ``Linear``): the
element's channel and position come from its offset and the strides of those dimensions.

Each program walks the input with a grid stride and adds its partial counts to the counter
with three integer atomics: exact and deterministic (integer addition is associative). No
host synchronisation: the counter stays on the device. The kernel is launched directly
(:func:`snntrain.kernels.op_utils.direct`), not through a registered operator: the counting runs
in forward hooks during validation, never under autograd, ``torch.compile`` or export, and the
dispatcher would only add host time to every hooked call. The PyTorch reference (and the oracle of the tests) is
:func:`snntrain.efficiency.count_reference`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .op_utils import INT32_MAX, INTERPRET, cdiv, direct, sm_count

__all__ = ["BLOCK", "Plan", "count_synops", "launch", "plan"]

BLOCK = 1024
NUM_WARPS = 4
#: Programs per SM of the grid-stride launch.
PROGRAMS_PER_SM = 4

@triton.jit
def _tap_valid(pos, P, S, D, OUT, k: tl.constexpr):
    """Whether an output position reads input position ``pos`` through tap ``k`` of one spatial dim:
    ``pos = o * S - P + k * D`` for some ``o`` in ``[0, OUT)``."""
    t = pos + P - k * D
    return (t >= 0) & (t % S == 0) & (t // S < OUT)


@triton.jit
def _count_synops_kernel(
    x_ptr,          # [numel] the layer input in memory order (any float dtype); dense, samples outermost
    m_ptr,          # [C, KH, KW] int32: nonzero weights of the channel's group at each tap
    out_ptr,        # [3] int64: += effective ops, nonzero elements, elements outside {-1, 0, 1}
    numel,
    C, H, W,        # channel and spatial sizes of one sample (Linear: features, 1, 1)
    sc, sh, sw,     # element strides of the channel and spatial dims in x's memory
    SH, SW, PH, PW, DH, DW, HO, WO,  # stride, (left/top) zero padding, dilation, output size per spatial dim
    KH: tl.constexpr, KW: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    lanes = tl.arange(0, BLOCK)
    acc_ops = tl.zeros([BLOCK], dtype=tl.int64)
    acc_nz = tl.zeros([BLOCK], dtype=tl.int32)
    acc_nb = tl.zeros([BLOCK], dtype=tl.int32)
    start = pid * BLOCK
    if INT64:  # offsets past 2**31: every loop bound in 64 bits
        start = start.to(tl.int64)
        step = step.to(tl.int64)
    for base in range(start, numel, step):
        offs = base + lanes
        inb = offs < numel
        x = tl.load(x_ptr + offs, mask=inb, other=0.0)  # compared in its own dtype
        nz = x != 0
        acc_nz += nz.to(tl.int32)
        acc_nb += (nz & (tl.abs(x) != 1)).to(tl.int32)
        c = (offs // sc) % C
        h = (offs // sh) % H
        w = (offs // sw) % W
        row = c * (KH * KW)
        fan = tl.zeros([BLOCK], dtype=tl.int32)
        for kh in tl.static_range(KH):
            vh = nz & _tap_valid(h, PH, SH, DH, HO, kh)
            for kw in tl.static_range(KW):
                v = vh & _tap_valid(w, PW, SW, DW, WO, kw)
                fan += tl.load(m_ptr + row + (kh * KW + kw), mask=v, other=0)
        acc_ops += fan.to(tl.int64)
    tl.atomic_add(out_ptr, tl.sum(acc_ops, axis=0))
    tl.atomic_add(out_ptr + 1, tl.sum(acc_nz.to(tl.int64), axis=0))
    tl.atomic_add(out_ptr + 2, tl.sum(acc_nb.to(tl.int64), axis=0))


@dataclass(frozen=True)
class Plan:
    """The launch of one input shape and layout (host values only, computed once and reused)."""

    copy: bool          # the input is not dense with dim 0 outermost: count a contiguous copy
    grid: int
    args: tuple         # numel, C, H, W, strides, geometry (the kernel's scalar arguments)
    meta: tuple         # KH, KW, INT64


def plan(shape: tuple[int, ...], strides: tuple[int, ...], kernel: tuple[int, int], *, channel_dim: int,
         spatial_dims: tuple[int, int] | None, stride: tuple[int, int] = (1, 1), padding: tuple[int, int] = (0, 0),
         dilation: tuple[int, int] = (1, 1), out_size: tuple[int, int] = (1, 1),
         device: torch.device | None = None) -> Plan:
    """The launch for an input of ``shape`` and ``strides`` on ``device`` (None: the CPU; see
    :func:`count_synops` for the other arguments)."""
    copy = not _dense_sample_major(shape, strides)
    if copy:
        strides = _contiguous_strides(shape)
    numel = math.prod(shape)
    C, sc = shape[channel_dim], strides[channel_dim]
    if spatial_dims is None:
        H = W = sh = sw = 1
    else:
        (H, W), (sh, sw) = (shape[d] for d in spatial_dims), (strides[d] for d in spatial_dims)
    programs = 4 if INTERPRET or device is None or device.type != "cuda" else PROGRAMS_PER_SM * sm_count(device)
    grid = max(1, min(cdiv(numel, BLOCK), programs))
    args = (numel, C, H, W, sc, sh, sw, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1],
            out_size[0], out_size[1])
    return Plan(copy, grid, args, (kernel[0], kernel[1], numel > INT32_MAX - grid * BLOCK))


def launch(p: Plan, x: torch.Tensor, m: torch.Tensor, out: torch.Tensor) -> None:
    """Add the counts of ``x`` (of the shape and layout ``p`` was made for) to ``out``; no checks."""
    if p.args[0] == 0:
        return
    if p.copy:
        x = x.contiguous()
    KH, KW, int64 = p.meta
    direct(_count_synops_kernel)[(p.grid,)](x, m, out, *p.args, KH=KH, KW=KW, INT64=int64, BLOCK=BLOCK,
                                             num_warps=NUM_WARPS)


def count_synops(x: torch.Tensor, m: torch.Tensor, out: torch.Tensor, *, channel_dim: int,
                 spatial_dims: tuple[int, int] | None, stride: tuple[int, int] = (1, 1),
                 padding: tuple[int, int] = (0, 0), dilation: tuple[int, int] = (1, 1),
                 out_size: tuple[int, int] = (1, 1)) -> None:
    """Add the counts of input ``x`` to ``out`` (int64 ``[3]``, see the module docstring).

    Args:
        x: the layer input, a dense tensor (any float dtype) whose first dimension is outermost in
            memory (contiguous or channels-last); copied once otherwise.
        m: int32 ``[C, KH, KW]`` contiguous, nonzero weights per input channel and tap.
        channel_dim: the dimension of ``x`` that holds the C channels (features for ``Linear``).
        spatial_dims: the two dimensions of ``x`` a ``Conv2d`` slides over, or None (``Linear``).
        stride, padding, dilation: the convolution's, per spatial dim (padding: left / top).
        out_size: the convolution's output height and width for this input.

    Callers that count many inputs of the same shape keep the :func:`plan` and call :func:`launch`.
    """
    if out.dtype != torch.int64 or out.numel() != 3 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int64 tensor of 3 elements, got {out.dtype} {tuple(out.shape)}")
    if m.dtype != torch.int32 or m.dim() != 3 or not m.is_contiguous():
        raise ValueError(f"m must be a contiguous int32 [C, KH, KW] tensor, got {m.dtype} {tuple(m.shape)}")
    if x.shape[channel_dim] != m.shape[0]:
        raise ValueError(f"input has {x.shape[channel_dim]} channels in dim {channel_dim}; the layer reads "
                         f"{m.shape[0]}")
    p = plan(tuple(x.shape), x.stride(), tuple(m.shape[1:]), channel_dim=channel_dim, spatial_dims=spatial_dims,
             stride=stride, padding=padding, dilation=dilation, out_size=out_size, device=x.device)
    launch(p, x, m, out)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(1, size)
    return tuple(reversed(strides))


def _dense_sample_major(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Dense (no gaps, no overlaps) with dimension 0 outermost: element offset = n * (numel / N) + in-sample offset."""
    expected = 1
    for d in sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: strides[d]):
        if strides[d] != expected:
            return False
        expected *= shape[d]
    n = shape[0]
    return n <= 1 or strides[0] == math.prod(shape) // n
