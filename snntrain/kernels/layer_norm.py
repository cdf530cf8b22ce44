"""Layer normalisation over one dimension, forward and backward, in Triton.

Every input is seen through a strided 3-D view ``[B0, S, C]`` where ``C`` is the
normalised dimension, ``S`` the positions that are normalised independently and
``B0`` an outer batch:

* rows ``[*, C]`` (normalise the last dim): ``B0 * S`` rows, usually ``B0 = 1``;
* channels-first maps ``[N, C, H, W]`` / ``[T, B, C, H, W]`` (normalise dim -3):
  ``B0 = N`` (or ``T * B``), ``S = H * W`` with stride 1, ``C`` with stride ``H * W``.

The view is read through its three strides, so any input whose dims before and
after the normalised dim each collapse into one strided dim runs in place: contiguous
and channels-last tensors, slices along the outer dims, a stride-0 (expanded) batch,
a transposed ``[C, M]`` buffer seen as ``[M, C]``. For rows, the dims before ``C`` may
also split into two strided groups (for example a slice ``x[:, :k]`` of a 3-D tensor).
Other layouts are copied once with ``.contiguous()``.

A program handles a tile of ``BLOCK_S`` positions x ``BLOCK_C`` channels; Triton lays
the tile out along whichever axis has unit stride, so rows coalesce along ``C`` and
channels-first maps along ``S``. Statistics are fp32 whatever the input dtype
(fp32, fp16, bf16). When a full ``C`` does not fit one tile, a looped path walks the
row in chunks: Chan's pairwise update for mean and variance, then a second pass
that normalises (the second pass mostly hits L2).

Backward: ``dx = rstd * (w*dy - mean_c(xhat*w*dy) * xhat - mean_c(w*dy))``. On the
fused path ``G`` programs each loop over a fixed, strided set of tiles and keep fp32
partial sums of ``dy * xhat`` and ``dy`` in registers; every program writes its own
row of a ``[G, 2, C]`` fp32 buffer, and ``torch.sum`` over ``G`` gives dW and dB. No
atomics, no locks: the result depends only on ``G`` (fixed per device and shape),
so it is the same bits run to run. The looped path (and rows longer than
``Tuning.fused_dw_max_c``) computes dx per tile and the weight gradients in a
separate column-split kernel with the same partial-buffer scheme, at the cost of
reading x and dy a second time. dx comes back in the input dtype, dW and dB in the
parameters' dtype (fp32 sums, cast once).

The ops ``snntrain::layer_norm_fwd`` and ``snntrain::layer_norm_bwd`` are
``torch.library.triton_op``s (visible to ``torch.compile`` and the profiler; plain
custom ops under ``TRITON_INTERPRET=1``) with autograd registered; they allocate with
``torch.empty`` and never synchronise with the host, so they can be captured in CUDA
graphs. Launch sizes come from :data:`TUNING`.
"""

import dataclasses
import functools
import math
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake
from torch.library import triton_op, wrap_triton

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

__all__ = ["Tuning", "TUNING", "layer_norm", "layer_norm_fwd", "layer_norm_bwd"]


# --------------------------------------------------------------------------- kernels


@triton.jit
def _ln_fwd_kernel(
    X,  # input, logical [B0, S, C], element strides (sx_b, sx_s, sx_c)
    Y,  # output, logical [B0, S, C], element strides (sy_b, sy_s, sy_c)
    W,  # weight [C] (any float dtype); unused when HAS_W is False
    Bias,  # bias [C]; unused when HAS_B is False
    Mean,  # fp32 [B0 * S] out: mean of each position, index b * S + s
    Rstd,  # fp32 [B0 * S] out: 1 / sqrt(var + eps)
    S,  # positions per outer index
    C,  # normalised length
    tiles_per_b,  # cdiv(S, BLOCK_S)
    sx_b, sx_s, sx_c,
    sy_b, sy_s, sy_c,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SINGLE: tl.constexpr,  # True: a whole row fits BLOCK_C; False: loop over C in chunks
):
    pid = tl.program_id(0)
    b = (pid // tiles_per_b).to(tl.int64)
    offs_s = (pid % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask_s = offs_s < S
    s64 = offs_s.to(tl.int64)
    x_base = X + b * sx_b + s64 * sx_s  # [BLOCK_S] pointers to the first channel
    y_base = Y + b * sy_b + s64 * sy_s
    cols = tl.arange(0, BLOCK_C)

    if SINGLE:
        mask_c = cols < C
        mask = mask_s[:, None] & mask_c[None, :]
        x = tl.load(x_base[:, None] + cols[None, :].to(tl.int64) * sx_c, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / C
        xc = tl.where(mask, x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / C
        rstd = tl.rsqrt(var + eps)
        y = xc * rstd[:, None]
        if HAS_W:
            w = tl.load(W + cols, mask=mask_c, other=0.0).to(tl.float32)
            y = y * w[None, :]
        if HAS_B:
            bb = tl.load(Bias + cols, mask=mask_c, other=0.0).to(tl.float32)
            y = y + bb[None, :]
        tl.store(y_base[:, None] + cols[None, :].to(tl.int64) * sy_c, y.to(Y.dtype.element_ty), mask=mask)
    else:
        # Pass 1: running (count, mean, M2) per position, merged chunk by chunk (Chan et al.).
        mean = tl.zeros([BLOCK_S], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_S], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + cols
            mask = mask_s[:, None] & (cc < C)[None, :]
            x = tl.load(x_base[:, None] + cc[None, :].to(tl.int64) * sx_c, mask=mask, other=0.0).to(tl.float32)
            n_a = c0 * 1.0  # channels merged so far (every earlier chunk is full)
            n_b = tl.minimum(C - c0, BLOCK_C).to(tl.float32)
            mean_b = tl.sum(x, axis=1) / n_b
            d = tl.where(mask, x - mean_b[:, None], 0.0)
            m2_b = tl.sum(d * d, axis=1)
            n = n_a + n_b
            delta = mean_b - mean
            mean = mean + delta * (n_b / n)
            m2 = m2 + m2_b + delta * delta * (n_a * n_b / n)
        rstd = tl.rsqrt(m2 / C + eps)
        # Pass 2: normalise and write.
        for c0 in range(0, C, BLOCK_C):
            cc = c0 + cols
            mask_c = cc < C
            mask = mask_s[:, None] & mask_c[None, :]
            x = tl.load(x_base[:, None] + cc[None, :].to(tl.int64) * sx_c, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean[:, None]) * rstd[:, None]
            if HAS_W:
                w = tl.load(W + cc, mask=mask_c, other=0.0).to(tl.float32)
                y = y * w[None, :]
            if HAS_B:
                bb = tl.load(Bias + cc, mask=mask_c, other=0.0).to(tl.float32)
                y = y + bb[None, :]
            tl.store(y_base[:, None] + cc[None, :].to(tl.int64) * sy_c, y.to(Y.dtype.element_ty), mask=mask)

    stat = b * S + s64
    tl.store(Mean + stat, mean, mask=mask_s)
    tl.store(Rstd + stat, rstd, mask=mask_s)


@triton.jit
def _ln_bwd_fused_kernel(
    DY,  # grad of the output, logical [B0, S, C], strides (sd_b, sd_s, sd_c)
    X,  # input, logical [B0, S, C], strides (sx_b, sx_s, sx_c)
    W,  # weight [C]; unused when HAS_W is False
    Mean,  # fp32 [B0 * S] from the forward
    Rstd,  # fp32 [B0 * S] from the forward
    DX,  # grad of the input out, logical [B0, S, C], strides (sg_b, sg_s, sg_c)
    P,  # fp32 [G, 2, C] out: this program's partial sums of dy*xhat (row 0) and dy (row 1)
    S, C, tiles_per_b, num_tiles,
    sd_b, sd_s, sd_c,
    sx_b, sx_s, sx_c,
    sg_b, sg_s, sg_c,
    HAS_W: tl.constexpr,
    NEED_P: tl.constexpr,  # write partial sums (dW or dB requested)
    REDUCE_EACH: tl.constexpr,  # fold the tile into [BLOCK_C] accumulators every step (else [BLOCK_S, BLOCK_C])
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    mask_c = cols < C
    cols64 = cols.to(tl.int64)
    if HAS_W:
        w = tl.load(W + cols, mask=mask_c, other=0.0).to(tl.float32)
    if REDUCE_EACH:
        acc_w = tl.zeros([BLOCK_C], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_C], dtype=tl.float32)
    else:
        acc_w = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    # Fixed, strided tile assignment: the accumulation order never depends on timing.
    for t in range(pid, num_tiles, G):
        b = (t // tiles_per_b).to(tl.int64)
        offs_s = (t % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
        mask_s = offs_s < S
        s64 = offs_s.to(tl.int64)
        mask = mask_s[:, None] & mask_c[None, :]
        x = tl.load((X + b * sx_b + s64 * sx_s)[:, None] + cols64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load((DY + b * sd_b + s64 * sd_s)[:, None] + cols64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + b * S + s64, mask=mask_s, other=0.0)
        rstd = tl.load(Rstd + b * S + s64, mask=mask_s, other=0.0)
        xhat = (x - mean[:, None]) * rstd[:, None]
        if NEED_P:
            if REDUCE_EACH:
                acc_w += tl.sum(dy * xhat, axis=0)
                acc_b += tl.sum(dy, axis=0)
            else:
                acc_w += dy * xhat
                acc_b += dy
        if HAS_W:
            wdy = dy * w[None, :]
        else:
            wdy = dy
        # Masked lanes hold dy = 0, so they add nothing to the row sums.
        c1 = tl.sum(xhat * wdy, axis=1) / C
        c2 = tl.sum(wdy, axis=1) / C
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store((DX + b * sg_b + s64 * sg_s)[:, None] + cols64[None, :] * sg_c, dx.to(DX.dtype.element_ty), mask=mask)
    if NEED_P:
        if REDUCE_EACH:
            pw = acc_w
            pb = acc_b
        else:
            pw = tl.sum(acc_w, axis=0)
            pb = tl.sum(acc_b, axis=0)
        row = P + pid.to(tl.int64) * (2 * C)
        tl.store(row + cols, pw, mask=mask_c)
        tl.store(row + C + cols, pb, mask=mask_c)


@triton.jit
def _ln_bwd_dx_looped_kernel(
    DY,  # grad of the output, logical [B0, S, C], strides (sd_b, sd_s, sd_c)
    X,  # input, logical [B0, S, C], strides (sx_b, sx_s, sx_c)
    W,  # weight [C]; unused when HAS_W is False
    Mean,  # fp32 [B0 * S]
    Rstd,  # fp32 [B0 * S]
    DX,  # grad of the input out, logical [B0, S, C], strides (sg_b, sg_s, sg_c)
    S, C, tiles_per_b,
    sd_b, sd_s, sd_c,
    sx_b, sx_s, sx_c,
    sg_b, sg_s, sg_c,
    HAS_W: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    b = (pid // tiles_per_b).to(tl.int64)
    offs_s = (pid % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
    mask_s = offs_s < S
    s64 = offs_s.to(tl.int64)
    x_base = X + b * sx_b + s64 * sx_s
    dy_base = DY + b * sd_b + s64 * sd_s
    dx_base = DX + b * sg_b + s64 * sg_s
    mean = tl.load(Mean + b * S + s64, mask=mask_s, other=0.0)
    rstd = tl.load(Rstd + b * S + s64, mask=mask_s, other=0.0)
    cols = tl.arange(0, BLOCK_C)
    # Pass 1: the two row sums.
    c1 = tl.zeros([BLOCK_S], dtype=tl.float32)
    c2 = tl.zeros([BLOCK_S], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cc = c0 + cols
        mask_c = cc < C
        mask = mask_s[:, None] & mask_c[None, :]
        cc64 = cc.to(tl.int64)
        x = tl.load(x_base[:, None] + cc64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_base[:, None] + cc64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
        if HAS_W:
            dy = dy * tl.load(W + cc, mask=mask_c, other=0.0).to(tl.float32)[None, :]
        xhat = (x - mean[:, None]) * rstd[:, None]
        c1 += tl.sum(xhat * dy, axis=1)
        c2 += tl.sum(dy, axis=1)
    c1 = c1 / C
    c2 = c2 / C
    # Pass 2: dx.
    for c0 in range(0, C, BLOCK_C):
        cc = c0 + cols
        mask_c = cc < C
        mask = mask_s[:, None] & mask_c[None, :]
        cc64 = cc.to(tl.int64)
        x = tl.load(x_base[:, None] + cc64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_base[:, None] + cc64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
        if HAS_W:
            dy = dy * tl.load(W + cc, mask=mask_c, other=0.0).to(tl.float32)[None, :]
        xhat = (x - mean[:, None]) * rstd[:, None]
        dx = (dy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        tl.store(dx_base[:, None] + cc64[None, :] * sg_c, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _ln_bwd_dwdb_kernel(
    DY,  # grad of the output, logical [B0, S, C], strides (sd_b, sd_s, sd_c)
    X,  # input, logical [B0, S, C], strides (sx_b, sx_s, sx_c)
    Mean,  # fp32 [B0 * S]
    Rstd,  # fp32 [B0 * S]
    P,  # fp32 [G, 2, C] out: partial sums of dy*xhat (row 0) and dy (row 1) of row-group g
    S, C, tiles_per_b, num_tiles,
    sd_b, sd_s, sd_c,
    sx_b, sx_s, sx_c,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # grid = (cdiv(C, BLOCK_C), G): program (j, g) sums channels j*BLOCK_C.. over tiles g, g+G, ...
    pid_c = tl.program_id(0)
    pid_g = tl.program_id(1)
    G = tl.num_programs(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = cols < C
    cols64 = cols.to(tl.int64)
    acc_w = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for t in range(pid_g, num_tiles, G):
        b = (t // tiles_per_b).to(tl.int64)
        offs_s = (t % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
        mask_s = offs_s < S
        s64 = offs_s.to(tl.int64)
        mask = mask_s[:, None] & mask_c[None, :]
        x = tl.load((X + b * sx_b + s64 * sx_s)[:, None] + cols64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load((DY + b * sd_b + s64 * sd_s)[:, None] + cols64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + b * S + s64, mask=mask_s, other=0.0)
        rstd = tl.load(Rstd + b * S + s64, mask=mask_s, other=0.0)
        acc_w += dy * ((x - mean[:, None]) * rstd[:, None])
        acc_b += dy
    row = P + pid_g.to(tl.int64) * (2 * C)
    tl.store(row + cols, tl.sum(acc_w, axis=0), mask=mask_c)
    tl.store(row + C + cols, tl.sum(acc_b, axis=0), mask=mask_c)


# --------------------------------------------------------------------------- host side


@dataclass
class Tuning:
    """Launch heuristics (element counts are per program). Tests shrink them to reach the looped path."""

    fwd_tile: int = 4096  # target tile of the fused forward
    bwd_tile: int = 2048  # target tile of the fused backward (more live values per element)
    fwd_warp_elems: int = 512  # num_warps = tile / warp_elems, clamped to [1, max_warps]
    bwd_warp_elems: int = 512
    # Backward of one-row tiles (whose dW/dB sums take registers) and of channels-first maps whose
    # channel stride is not a multiple of 16 (scalar loads, one address per element): more warps.
    narrow_warp_elems: int = 256
    max_warps: int = 32
    max_tile: int = 16384  # largest tile a fused program holds; longer rows take the looped path
    loop_tile: int = 4096  # tile of one step of the looped path
    min_block_s: int = 32  # contiguous positions per tile when S is the unit-stride axis
    partial_frac: float = 1 / 64  # bound on dW/dB partial-sum traffic relative to the backward's traffic
    rows_reduce_each: bool = False  # rows: fold dW/dB sums to [C] every tile instead of once per program
    fused_dw_max_c: int = 16384  # longest (power-of-2) row whose dW/dB sums stay in the fused backward
    dw_tile: int = 4096  # tile of the separate dW/dB pass (long rows, looped path)
    dw_block_c: int = 256  # channels per program of that pass


TUNING = Tuning()


@dataclass(frozen=True)
class _Plan:
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


def _collapse(t: torch.Tensor, start: int, end: int) -> Optional[tuple[int, int]]:
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


def _strides3(t: torch.Tensor, dim: int, split: int) -> Optional[tuple[int, int, int]]:
    """Element strides (b, s, c) of ``t`` seen as [B0, S, C] with the grouping of :func:`_split`."""
    nd = t.dim()
    if dim == nd - 1:
        gb, gs = _collapse(t, 0, split), _collapse(t, split, dim)
    else:
        gb, gs = _collapse(t, 0, dim), _collapse(t, dim + 1, nd)
    if gb is None or gs is None:
        return None
    return gb[1], gs[1], t.stride(dim)


def _split(x: torch.Tensor, dim: int) -> Optional[int]:
    """How the dims of ``x`` group into [B0, S, C]; None when no grouping reads ``x`` in place."""
    if dim != x.dim() - 1:
        return 0 if _strides3(x, dim, 0) is not None else None
    for split in range(0, dim + 1):  # rows: prefer everything in S, else two groups
        if _strides3(x, dim, split) is not None:
            return split
    return None


def _sizes3(shape: torch.Size, dim: int, split: int) -> tuple[int, int, int]:
    if dim == len(shape) - 1:
        return math.prod(shape[:split]), math.prod(shape[split:dim]), shape[dim]
    return math.prod(shape[:dim]), math.prod(shape[dim + 1:]), shape[dim]


def _plan(x: torch.Tensor, dim: int, split: int, tile: int, warp_elems: int) -> _Plan:
    tn = TUNING
    B0, S, C = _sizes3(x.shape, dim, split)
    sb, ss, sc = _strides3(x, dim, split)
    s_unit = ss == 1 and sc != 1 and S > 1
    bc = triton.next_power_of_2(C)
    s_cap = triton.next_power_of_2(S)
    min_s = tn.min_block_s if s_unit else 1
    bs = min(s_cap, max(min_s, tile // bc))
    single = bs * bc <= tn.max_tile
    if not single:
        bs = min(s_cap, min_s)
        bc = min(bc, max(16, tn.loop_tile // bs))
        if bs * bc > tn.loop_tile:
            bc = max(1, tn.loop_tile // bs)
    tiles_per_b = triton.cdiv(S, bs)
    return _Plan(B0, S, C, split, single, bs, bc, tiles_per_b, B0 * tiles_per_b, _warps(bs * bc, warp_elems), s_unit)


def _warps(tile: int, warp_elems: int) -> int:
    return max(1, min(TUNING.max_warps, tile // warp_elems))


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the CPU interpreter: a few programs, so tests still exercise the strided tile loop


def _check(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], dim: int, eps: float) -> int:
    if x.dim() < 1:
        raise ValueError("layer_norm needs an input with at least one dim, got a scalar")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim={dim} is out of range for an input of shape {tuple(x.shape)}")
    dim = dim % x.dim()
    if not x.is_floating_point() or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"layer_norm supports float32, float16 and bfloat16 inputs, got {x.dtype}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps={eps!r} is not valid; it must be a finite number >= 0")
    C = x.shape[dim]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            if tuple(p.shape) != (C,):
                raise ValueError(
                    f"{name} has shape {tuple(p.shape)}; the normalised dim {dim} of the input "
                    f"{tuple(x.shape)} has {C} entries, so {name} must have shape ({C},)"
                )
            if p.device != x.device:
                raise ValueError(f"{name} is on {p.device} but the input is on {x.device}")
    return dim


def _launchable(x: torch.Tensor) -> bool:
    """False only while tracing with fake tensors in Triton's CPU interpreter.

    There the ops are plain custom ops (see :func:`_register`) whose fake implementation is
    the same function: it allocates the outputs and skips the launches.
    """
    return not (_INTERPRET and is_fake(x))


def _params(p: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x if p is None else (p if p.stride(0) == 1 else p.contiguous())


def _layer_norm_fwd(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], dim: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer norm of ``x`` over ``dim``: returns ``(y, mean, rstd)``; mean and rstd are fp32 ``[numel / C]``."""
    dim = _check(x, weight, bias, dim, eps)
    rows_mode = dim == x.dim() - 1
    if rows_mode:
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        y = torch.empty_like(x)
    n_stats = x.numel() // x.shape[dim] if x.shape[dim] > 0 else 0
    mean = torch.empty(n_stats, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_stats, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return y, mean, rstd
    split = _split(x, dim)
    if split is None:
        x = x.contiguous()
        split = _split(x, dim)
    ys = _strides3(y, dim, split)
    if ys is None:  # y is a fresh dense tensor, so this only guards odd groupings
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        ys = _strides3(y, dim, split)
    p = _plan(x, dim, split, TUNING.fwd_tile, TUNING.fwd_warp_elems)
    xs = _strides3(x, dim, split)
    if _launchable(x):
        wrap_triton(_ln_fwd_kernel)[(p.num_tiles,)](
            x, y, _params(weight, x), _params(bias, x), mean, rstd,
            p.S, p.C, p.tiles_per_b,
            xs[0], xs[1], xs[2], ys[0], ys[1], ys[2],
            eps,
            HAS_W=weight is not None, HAS_B=bias is not None,
            BLOCK_S=p.block_s, BLOCK_C=p.block_c, SINGLE=p.single, num_warps=p.num_warps,
        )
    return y, mean, rstd


def _num_programs(p: _Plan, elem_bytes: int, device: torch.device) -> int:
    """Programs of a persistent backward: enough to fill the device, few enough that partial sums stay cheap."""
    per_tile = 3 * p.block_s * elem_bytes  # bytes of x, dy, dx per channel of a tile
    min_tiles = max(1, math.ceil(8 / (TUNING.partial_frac * per_tile)))  # 8 bytes of partials per channel
    return max(1, min(p.num_tiles, max(_num_sms(device), triton.cdiv(p.num_tiles, min_tiles))))


def _layer_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dim: int,
    need_dw: bool,
    need_db: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dx, dw, db)`` of :func:`layer_norm_fwd`.

    ``dw`` (``db``) is empty when ``need_dw`` (``need_db``) is False or there is no weight (bias).
    ``bias`` is only read for its dtype.
    """
    dim = _check(x, weight, bias, dim, 0.0)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected the input's shape {tuple(x.shape)}")
    need_dw = bool(need_dw) and weight is not None
    need_db = bool(need_db) and bias is not None
    rows_mode = dim == x.dim() - 1
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if rows_mode else torch.empty_like(x)
    C = x.shape[dim]
    empty = torch.empty(0, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        dw = torch.zeros(C, dtype=weight.dtype, device=x.device) if need_dw else empty
        db = torch.zeros(C, dtype=bias.dtype, device=x.device) if need_db else empty.clone()
        return dx, dw, db
    split = _split(x, dim)
    if split is None:
        x = x.contiguous()
        split = _split(x, dim)
    ds = _strides3(dy, dim, split)
    if ds is None:
        dy = dy.contiguous()
        ds = _strides3(dy, dim, split)
    gs = _strides3(dx, dim, split)
    if gs is None:
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        gs = _strides3(dx, dim, split)
    xs = _strides3(x, dim, split)
    p = _plan(x, dim, split, TUNING.bwd_tile, TUNING.bwd_warp_elems)
    if p.block_s == 1 or (p.s_unit and xs[2] % 16):
        p = dataclasses.replace(p, num_warps=_warps(p.block_s * p.block_c, TUNING.narrow_warp_elems))
    need_p = need_dw or need_db
    fuse_p = need_p and p.single and p.block_c <= TUNING.fused_dw_max_c
    w_arg = _params(weight, x)
    if p.single:
        G = _num_programs(p, x.element_size(), x.device)
        part = torch.empty((G, 2, C) if fuse_p else (0,), dtype=torch.float32, device=x.device)
        reduce_each = p.s_unit or p.block_s == 1 or TUNING.rows_reduce_each
        if _launchable(x):
            wrap_triton(_ln_bwd_fused_kernel)[(G,)](
                dy, x, w_arg, mean, rstd, dx, part,
                p.S, C, p.tiles_per_b, p.num_tiles,
                ds[0], ds[1], ds[2], xs[0], xs[1], xs[2], gs[0], gs[1], gs[2],
                HAS_W=weight is not None, NEED_P=fuse_p, REDUCE_EACH=reduce_each,
                BLOCK_S=p.block_s, BLOCK_C=p.block_c, num_warps=p.num_warps,
            )
    else:
        if _launchable(x):
            wrap_triton(_ln_bwd_dx_looped_kernel)[(p.num_tiles,)](
                dy, x, w_arg, mean, rstd, dx,
                p.S, C, p.tiles_per_b,
                ds[0], ds[1], ds[2], xs[0], xs[1], xs[2], gs[0], gs[1], gs[2],
                HAS_W=weight is not None, BLOCK_S=p.block_s, BLOCK_C=p.block_c, num_warps=p.num_warps,
            )
    if need_p and not fuse_p:
        # dW, dB in a column-split pass of their own (rows too long to keep 2 * C sums per program).
        bc = min(triton.next_power_of_2(C), TUNING.dw_block_c)
        min_s = TUNING.min_block_s if p.s_unit else 1
        bs = min(triton.next_power_of_2(p.S), max(min_s, TUNING.dw_tile // bc))
        tiles_per_b = triton.cdiv(p.S, bs)
        n_col = triton.cdiv(C, bc)
        G = max(1, min(p.B0 * tiles_per_b, triton.cdiv(4 * _num_sms(x.device), n_col)))
        part = torch.empty((G, 2, C), dtype=torch.float32, device=x.device)
        if _launchable(x):
            wrap_triton(_ln_bwd_dwdb_kernel)[(n_col, G)](
                dy, x, mean, rstd, part,
                p.S, C, tiles_per_b, p.B0 * tiles_per_b,
                ds[0], ds[1], ds[2], xs[0], xs[1], xs[2],
                BLOCK_S=bs, BLOCK_C=bc, num_warps=_warps(bs * bc, TUNING.bwd_warp_elems),
            )
    # Fixed-order reductions over G (torch.sum uses no atomics); outputs must not alias each other.
    dw = part[:, 0].sum(dim=0).to(weight.dtype) if need_dw else empty
    db = part[:, 1].sum(dim=0).to(bias.dtype) if need_db else empty.clone()
    return dx, dw, db


def _register(name: str, fn):
    """``fn`` as the op ``name``: a ``triton_op`` (torch.compile sees and optimises the kernels).

    Under ``TRITON_INTERPRET=1`` ``wrap_triton`` cannot record interpreted kernels, so
    there the op is an opaque ``custom_op`` with ``fn`` as its fake implementation.
    """
    if _INTERPRET:
        op = torch.library.custom_op(name, fn, mutates_args=())
        op.register_fake(fn)
        return op
    return triton_op(name, fn, mutates_args=())


layer_norm_fwd = _register("snntrain::layer_norm_fwd", _layer_norm_fwd)
layer_norm_bwd = _register("snntrain::layer_norm_bwd", _layer_norm_bwd)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, dim, _eps = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.dim = dim


def _backward(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = torch.ops.snntrain.layer_norm_bwd(dy, x, weight, bias, mean, rstd, ctx.dim, need_dw, need_db)
    return (
        dx if need_dx else None,
        dw if need_dw and weight is not None else None,
        db if need_db and bias is not None else None,
        None,
        None,
    )


torch.library.register_autograd("snntrain::layer_norm_fwd", _backward, setup_context=_setup_context)


def layer_norm(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    dim: int = -1,
) -> torch.Tensor:
    """Layer norm of ``x`` over ``dim`` with optional affine ``weight`` and ``bias`` (shape ``[C]``), differentiable.

    ``dim=-1`` is ``torch.nn.functional.layer_norm`` over the last dim; ``dim=-3`` normalises the
    channels of ``[N, C, H, W]`` or ``[T, B, C, H, W]`` in place of permute + layer_norm + permute.
    """
    return torch.ops.snntrain.layer_norm_fwd(x, weight, bias, dim, eps)[0]
