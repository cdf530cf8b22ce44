"""Activity counting in Triton: synaptic operations of a layer's input, spikes per channel of a spiking
layer's output; one pass per call, at memory speed.

For the input ``x`` of a convolution (``Conv2d``) or ``Linear`` layer, one launch adds to
a three-element int64 counter:

* ``out[0]`` the effective synaptic operations: every nonzero input element times the
  number of nonzero weights it meets (its fan-out), i.e. ``sum(conv(x != 0, W != 0))``
  without the bias, NeuroBench's count;
* ``out[1]`` the number of nonzero input elements;
* ``out[2]`` the number of input elements outside ``{-1, 0, 1}`` (any one makes the call's
  operations multiply-accumulates under NeuroBench's rule; none makes them accumulates).

An element's fan-out depends only on its place inside one frame (channel and position:
zero padding, stride and dilation make the borders differ), not on the frame. So ``x`` is read
as rows of frames (``[N, S]``: the leading dimensions are the rows, the trailing ``block_dims``
dimensions, ``C, H, W`` or the features, are one frame of ``S`` elements) and the fan-out of one
frame is given once, laid out in the frame's memory order (:func:`fan_block`, from
:func:`snntrain.efficiency.fanout_map`). Each program holds one slice of the frame's fan-out in
registers and walks that slice down many rows: per element one load, a compare and an add, no
index arithmetic, so the pass runs at memory speed. The fan-out block costs ``4 * S`` bytes,
nothing per row.

A spiking layer's output is counted the same way (:func:`launch_channel_sums`): its frames'
channel map in memory order, per program one slice of it, float32 sums per element down the rows,
one atomic add per element into the channel's total.

Layouts: any dense layout whose rows are outermost (``[N, C, H, W]`` contiguous or
channels-last, ``[..., features]`` for ``Linear``) is read in memory order; others are counted
from a contiguous copy.

Each program adds its partial counts to the counter with three integer atomics: exact and
deterministic (integer addition is associative). No host synchronisation: the counter stays
on the device. The kernel is launched directly
(:func:`snntrain.kernels.op_utils.direct`), not through a registered operator: the counting runs
in forward hooks during validation, never under autograd, ``torch.compile`` or export, and the
dispatcher would only add host time to every hooked call. The PyTorch reference (and the oracle of the tests) is
:func:`snntrain.efficiency.count_reference`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .op_utils import INT32_MAX, INTERPRET, PlanCache, Planned, cdiv, direct, sm_count

__all__ = ["BLOCK", "Plan", "channel_block", "count_synops", "fan_block", "launch", "launch_channel_sums", "plan"]

BLOCK = 1024
#: Programs per SM and warps per program of each kernel (rows are shared out among the programs of one frame
#: slice); from ``scripts/bench_synops.py --sweep`` on an H200 (docs/benchmarks.md).
PROGRAMS_PER_SM = 4
NUM_WARPS = 8
SUMS_PROGRAMS_PER_SM = 8
SUMS_NUM_WARPS = 4


@triton.jit
def _count_synops_kernel(
    x_ptr,          # [N, S] the layer input as rows of frames, in memory order (any float dtype)
    fan_ptr,        # [S] int32: fan-out of each element of one frame, in the frame's memory order
    out_ptr,        # [3] int64: += effective ops, nonzero elements, elements outside {-1, 0, 1}
    N, S,
    INT64: tl.constexpr, BLOCK: tl.constexpr,
):
    inner = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = inner < S
    fan = tl.load(fan_ptr + inner, mask=inb, other=0)
    acc_ops = tl.zeros([BLOCK], dtype=tl.int64)
    acc_nz = tl.zeros([BLOCK], dtype=tl.int32)
    acc_nb = tl.zeros([BLOCK], dtype=tl.int32)
    first = tl.program_id(1)
    step = tl.num_programs(1)
    if INT64:  # offsets past 2**31: the row loop in 64 bits
        first = first.to(tl.int64)
        step = step.to(tl.int64)
    for n in range(first, N, step):
        x = tl.load(x_ptr + n * S + inner, mask=inb, other=0.0)  # compared in its own dtype
        nz = x != 0
        acc_nz += nz.to(tl.int32)
        acc_nb += (nz & (tl.abs(x) != 1)).to(tl.int32)
        acc_ops += tl.where(nz, fan, 0).to(tl.int64)
    tl.atomic_add(out_ptr, tl.sum(acc_ops, axis=0))
    tl.atomic_add(out_ptr + 1, tl.sum(acc_nz.to(tl.int64), axis=0))
    tl.atomic_add(out_ptr + 2, tl.sum(acc_nb.to(tl.int64), axis=0))


@triton.jit
def _channel_sums_kernel(
    x_ptr,          # [N, S] spiking outputs as rows of frames, in memory order (any float dtype)
    chan_ptr,       # [S] int32: the channel of each element of one frame, in the frame's memory order
    out_ptr,        # [C] float32: += the sum of each channel
    N, S,
    PERIOD: tl.constexpr,  # C when the channels repeat with period C along the frame (channels innermost)
    INT64: tl.constexpr, BLOCK: tl.constexpr,
):
    inner = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = inner < S
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    first = tl.program_id(1)
    step = tl.num_programs(1)
    if INT64:
        first = first.to(tl.int64)
        step = step.to(tl.int64)
    for n in range(first, N, step):
        acc += tl.load(x_ptr + n * S + inner, mask=inb, other=0.0).to(tl.float32)
    if PERIOD > 0:  # lane i holds channel i % C (slices start at multiples of C): C atomics, not BLOCK
        tl.atomic_add(out_ptr + tl.arange(0, PERIOD), tl.sum(tl.reshape(acc, [BLOCK // PERIOD, PERIOD]), axis=0))
    else:
        chan = tl.load(chan_ptr + inner, mask=inb, other=0)
        tl.atomic_add(out_ptr + chan, acc, mask=inb)


@dataclass(frozen=True)
class Plan:
    """The launch of one input shape and layout (host values only, computed once and reused)."""

    copy: bool                      # the input's rows are not dense and outermost: count a contiguous copy
    block_shape: tuple[int, ...]    # one frame's dims (the trailing block_dims of the input)
    block_strides: tuple[int, ...]  # their strides in the (copied) input's memory
    grid: tuple[int, int]           # (frame slices, programs per slice)
    args: tuple                     # N, S
    int64: bool                     # 64-bit offsets


def plan(shape: tuple[int, ...], strides: tuple[int, ...], block_dims: int,
         device: torch.device | None = None, sums: bool = False) -> Plan:
    """The launch for an input of ``shape`` and ``strides`` on ``device`` (None: the CPU) whose trailing
    ``block_dims`` dimensions are one frame (3 for a ``Conv2d`` input ``[N, C, H, W]``, 1 for ``Linear``),
    for :func:`launch` (or, with ``sums``, :func:`launch_channel_sums`)."""
    if not 1 <= block_dims <= len(shape):
        raise ValueError(f"block_dims={block_dims} must be between 1 and the input's {len(shape)} dims")
    copy = not _dense_rows(shape, strides, block_dims)
    if copy:
        strides = _contiguous_strides(shape)
    block_shape = tuple(shape[len(shape) - block_dims:])
    S = math.prod(block_shape)
    N = math.prod(shape[: len(shape) - block_dims])
    slices = cdiv(S, BLOCK) if S else 1
    per_sm = SUMS_PROGRAMS_PER_SM if sums else PROGRAMS_PER_SM
    programs = 4 if INTERPRET or device is None or device.type != "cuda" else per_sm * sm_count(device)
    rows = max(1, min(N, cdiv(programs, slices), 65535))
    return Plan(copy, block_shape, tuple(strides[len(shape) - block_dims:]), (slices, rows), (N, S),
                N * S > INT32_MAX - BLOCK)


def fan_block(fan: torch.Tensor, p: Plan) -> torch.Tensor:
    """The fan-out of one frame (integers, logical shape ``p.block_shape``) as int32 ``[S]`` in the frame's
    memory order, what :func:`launch` takes."""
    return _in_memory_order(fan, p)


def channel_block(p: Plan, device: torch.device | str | None = None) -> torch.Tensor:
    """The channel (index in the frame's first dim) of every element of one frame, int32 ``[S]`` on
    ``device`` in the frame's memory order, what :func:`launch_channel_sums` takes."""
    C = p.block_shape[0]
    chan = torch.arange(C, dtype=torch.int32, device=device).view(C, *[1] * (len(p.block_shape) - 1))
    return _in_memory_order(chan.expand(p.block_shape), p)


def _in_memory_order(values: torch.Tensor, p: Plan) -> torch.Tensor:
    """``values`` of one frame (logical shape ``p.block_shape``) as int32 ``[S]`` in the frame's memory order."""
    if tuple(values.shape) != p.block_shape:
        raise ValueError(f"fan-out of shape {tuple(values.shape)} for frames of shape {p.block_shape}")
    block = torch.empty(p.args[1], dtype=torch.int32, device=values.device)
    block[_offsets(p.block_shape, p.block_strides, values.device)] = values.flatten().to(torch.int32)
    return block


@functools.lru_cache(maxsize=256)
def _offsets(shape: tuple[int, ...], strides: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The memory offset of every element of a frame, in logical order (flat int64)."""
    offsets = torch.zeros(shape, dtype=torch.int64, device=device)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[d] = size
        offsets += torch.arange(size, device=device).view(view) * (stride if size > 1 else 0)
    return offsets.flatten()


def launch(p: Plan, x: torch.Tensor, fan: torch.Tensor, out: torch.Tensor) -> None:
    """Add the counts of ``x`` (of the shape and layout ``p`` was made for) to ``out``, with ``fan`` from
    :func:`fan_block`; no checks. Launched through the plan's bound launch (one per plan: its grid and sizes
    fixed, only the three tensors passed per call)."""
    key = (p, BLOCK, NUM_WARPS)
    planned = _BOUND.get(key)
    if planned is None:
        N, S = p.args
        planned = _BOUND.put(key, _EMPTY if N == 0 or S == 0 else Planned(
            _count_synops_kernel, p.grid, ("x", "fan", "out", N, S),
            dict(INT64=p.int64, BLOCK=BLOCK, num_warps=NUM_WARPS)))
    if planned is not _EMPTY:
        planned(direct, {"x": x.contiguous() if p.copy else x, "fan": fan, "out": out})


#: The bound launch of the plans launched lately (and the options they ran with).
_BOUND = PlanCache(256)
_EMPTY = object()  # an empty input's plan: nothing to launch


def launch_channel_sums(p: Plan, x: torch.Tensor, chan: torch.Tensor, out: torch.Tensor) -> None:
    """Add the sum of every channel of ``x`` (the first dim of its frames: ``[T, B, C, ...]`` with
    ``block_dims = x.dim() - 2``) to the float32 ``out`` ``[C]``, with ``chan`` from :func:`channel_block`;
    no checks. Float atomics add in any order: sums of spikes (integers) are exact while every channel's
    total stays below 2**24."""
    N, S = p.args
    if N == 0 or S == 0:
        return
    if p.copy:
        x = x.contiguous()
    C, stride = p.block_shape[0], p.block_strides[0]
    period = C if stride == 1 and C & (C - 1) == 0 and C <= BLOCK and len(p.block_shape) > 1 else 0
    direct(_channel_sums_kernel)[p.grid](x, chan, out, N, S, PERIOD=period, INT64=p.int64, BLOCK=BLOCK,
                                         num_warps=SUMS_NUM_WARPS)


def count_synops(x: torch.Tensor, fan: torch.Tensor, out: torch.Tensor, *, block_dims: int) -> None:
    """Add the counts of input ``x`` to ``out`` (int64 ``[3]``, see the module docstring).

    Args:
        x: the layer input (any float dtype); any dense layout whose leading dimensions are outermost is
            read as it is, others are copied once.
        fan: the fan-out of every element of one frame, integers of shape ``x.shape[-block_dims:]``
            (:func:`snntrain.efficiency.fanout_map` of the layer and input).
        block_dims: how many trailing dimensions of ``x`` make one frame: 3 for a ``Conv2d`` input
            ``[N, C, H, W]``, 1 for a ``Linear`` input ``[..., features]``.

    Callers that count many inputs of the same shape keep the :func:`plan` and the :func:`fan_block`
    and call :func:`launch`.
    """
    if out.dtype != torch.int64 or out.numel() != 3 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int64 tensor of 3 elements, got {out.dtype} {tuple(out.shape)}")
    if fan.dtype.is_floating_point or fan.dtype == torch.bool:
        raise ValueError(f"fan must hold integers, got {fan.dtype}")
    p = plan(tuple(x.shape), x.stride(), block_dims, device=x.device)
    launch(p, x, fan_block(fan.to(x.device), p), out)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(1, size)
    return tuple(reversed(strides))


def _dense_rows(shape: tuple[int, ...], strides: tuple[int, ...], block_dims: int) -> bool:
    """Element offset = row * S + offset inside the frame: the trailing ``block_dims`` dims dense (any
    order), the leading ones row-major around them (size-1 dims take any stride)."""
    lead = len(shape) - block_dims
    expected = 1
    for st, size in sorted((strides[d], shape[d]) for d in range(lead, len(shape)) if shape[d] != 1):
        if st != expected:
            return False
        expected *= size
    for d in reversed(range(lead)):
        if shape[d] == 1:
            continue
        if strides[d] != expected:
            return False
        expected *= shape[d]
    return True
