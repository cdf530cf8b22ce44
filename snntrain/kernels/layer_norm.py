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
that normalises (the second pass mostly hits L2). Dense channels-first maps whose
``H*W`` is not a multiple of 16 (14x14, 7x7) get ``H*W`` compiled in (``SC``): the loads
then vectorise as far as ``H*W`` allows and addresses need fewer registers.

Backward: ``dx = rstd * (w*dy - mean_c(xhat*w*dy) * xhat - mean_c(w*dy))``. The fused
kernel is persistent: ``G = SMs x k`` programs each loop over a fixed, strided set of
tiles (the loop software-pipelined, ``TUNING.bwd_stages`` for rows and ``cf_bwd_stages``
for channels-first maps, so the loads of later tiles are in flight while one is computed)
and keep fp32 partial sums of ``dy * xhat`` and ``dy`` in registers; every program writes
its own row of a ``[G, 2, C]`` fp32 buffer and a second, small kernel sums it over ``G`` in
a fixed order and writes dW and dB in the parameters' dtypes. No atomics, no locks: the result depends only on ``G`` (fixed per
device and shape), so it is the same bits run to run. ``k`` (programs per SM, at most
``bwd_programs_per_sm``) shrinks when the partial sums would exceed ``partial_frac`` of
the traffic (short problems, long rows), each program then taking a larger tile; a
register cap at launch makes the ``k`` programs fit an SM together. Rows longer than
``fused_dw_max_c`` (and, with ``cf_unaligned_separate_dw``, channels-first maps with
``H*W % 4 != 0``) compute dx in the fused kernel without partial sums and the weight
gradients in a separate column-split kernel (same partial-buffer scheme), at the cost of
reading x and dy a second time; the looped path does the same. dx comes back in the input
dtype.

The ops ``snntrain::layer_norm_fwd`` and ``snntrain::layer_norm_bwd`` are
``torch.library.triton_op``s (visible to ``torch.compile`` and the profiler; plain
custom ops under ``TRITON_INTERPRET=1``) with autograd registered (mean and rstd are
non-differentiable outputs, so a backward is two kernels, main and finishing sum); they
allocate with ``torch.empty`` and never synchronise with the host, so they can be
captured in CUDA graphs. :func:`layer_norm` calls them under ``torch.compile`` and
``torch.export``; eager calls run the same host functions and kernels through an
``autograd.Function`` without the operator machinery, as every op family does
(:mod:`snntrain.kernels.op_utils`). Launch sizes come from :data:`TUNING` and the plans
of :mod:`snntrain.kernels.layer_norm_tuning`.
"""

import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl

from . import layer_norm_tuning as tuning
from .layer_norm_tuning import TUNING, Tuning
from .op_utils import cdiv, direct, eager_function, next_pow2, no_launch, op_wrap, profiled, register_op, traced

__all__ = ["Tuning", "TUNING", "layer_norm", "layer_norm_fwd", "layer_norm_bwd", "layer_norm_stats", "ln_input_grad"]


# --------------------------------------------------------------------------- kernels


@triton.jit
def _positions(tiles_per_b, S, BLOCK_S: tl.constexpr):
    """The outer index and the ``BLOCK_S`` positions of this program (``tiles_per_b`` programs per outer index):
    ``(b, offs_s, mask_s, offs_s as int64)``."""
    pid = tl.program_id(0)
    offs_s = (pid % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
    return (pid // tiles_per_b).to(tl.int64), offs_s, offs_s < S, offs_s.to(tl.int64)


@triton.jit
def _affine_store(xhat, W, Bias, cc, mask_c, mask, y_base, sy_c, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """``xhat * w + b`` over the channels ``cc`` of a tile, stored at ``y_base + cc * sy_c`` in the output's dtype."""
    y = xhat
    if HAS_W:
        y = y * tl.load(W + cc, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(Bias + cc, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    tl.store(y_base[:, None] + cc[None, :].to(tl.int64) * sy_c, y.to(y_base.dtype.element_ty), mask=mask)


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
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,  # weight and bias given
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # positions and channels of a tile
    SINGLE: tl.constexpr,  # True: a whole row fits BLOCK_C; False: loop over C in chunks
    SC: tl.constexpr,  # > 0: dense channels-first map, S == SC and both channel strides are SC (see const_s)
    STORE_Y: tl.constexpr,  # False: the statistics only (Y unused)
):
    if SC > 0:  # a dense channels-first map: the positions and channel strides are compile-time SC
        S, sx_c, sy_c = SC, SC, SC
    b, offs_s, mask_s, s64 = _positions(tiles_per_b, S, BLOCK_S)
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
        if STORE_Y:
            _affine_store(xc * rstd[:, None], W, Bias, cols, mask_c, mask, y_base, sy_c, HAS_W, HAS_B)
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
        if STORE_Y:
            for c0 in range(0, C, BLOCK_C):
                cc = c0 + cols
                mask_c = cc < C
                mask = mask_s[:, None] & mask_c[None, :]
                x = tl.load(x_base[:, None] + cc[None, :].to(tl.int64) * sx_c, mask=mask, other=0.0).to(tl.float32)
                _affine_store((x - mean[:, None]) * rstd[:, None], W, Bias, cc, mask_c, mask, y_base, sy_c, HAS_W,
                              HAS_B)

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
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # positions and channels of a tile
    SC: tl.constexpr,  # > 0: dense channels-first map, S == SC and every channel stride is SC
    ONE_B: tl.constexpr,  # B0 == 1: tile t covers positions t * BLOCK_S ... (no outer index)
    STAGES: tl.constexpr,  # software pipelining depth of the tile loop (loads of later tiles in flight)
):
    if SC > 0:  # a dense channels-first map: the positions and channel strides are compile-time SC
        S, sd_c, sx_c, sg_c = SC, SC, SC, SC
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    mask_c = cols < C
    cols64 = cols.to(tl.int64)
    inv_c = 1.0 / C
    if HAS_W:
        w = tl.load(W + cols, mask=mask_c, other=0.0).to(tl.float32)
    if REDUCE_EACH:
        acc_w = tl.zeros([BLOCK_C], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_C], dtype=tl.float32)
    else:
        acc_w = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    # Fixed, strided tile assignment: the accumulation order never depends on timing.
    for t in tl.range(pid, num_tiles, G, num_stages=STAGES):
        if ONE_B:
            offs_s = t * BLOCK_S + tl.arange(0, BLOCK_S)
            s64 = offs_s.to(tl.int64)
            x_rows = X + s64 * sx_s
            dy_rows = DY + s64 * sd_s
            dx_rows = DX + s64 * sg_s
            stat = s64
        else:
            b = (t // tiles_per_b).to(tl.int64)
            offs_s = (t % tiles_per_b) * BLOCK_S + tl.arange(0, BLOCK_S)
            s64 = offs_s.to(tl.int64)
            x_rows = X + b * sx_b + s64 * sx_s
            dy_rows = DY + b * sd_b + s64 * sd_s
            dx_rows = DX + b * sg_b + s64 * sg_s
            stat = b * S + s64
        mask_s = offs_s < S
        mask = mask_s[:, None] & mask_c[None, :]
        x = tl.load(x_rows[:, None] + cols64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_rows[:, None] + cols64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + stat, mask=mask_s, other=0.0)
        rstd = tl.load(Rstd + stat, mask=mask_s, other=0.0)
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
        c1 = tl.sum(xhat * wdy, axis=1) * inv_c
        c2 = tl.sum(wdy, axis=1) * inv_c
        # dx = rstd * (wdy - xhat * c1 - c2), with rstd folded into the per-row terms (two FMAs per element).
        c1r = c1 * rstd
        c2r = c2 * rstd
        dx = wdy * rstd[:, None] - (xhat * c1r[:, None] + c2r[:, None])
        tl.store(dx_rows[:, None] + cols64[None, :] * sg_c, dx.to(DX.dtype.element_ty), mask=mask)
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
def _ln_bwd_chunk(x_base, dy_base, W, mean, rstd, mask_s, cc, C, sx_c, sd_c, HAS_W: tl.constexpr):
    """One [BLOCK_S, BLOCK_C] chunk of the looped backward: x-hat and dy (times the weight) in fp32,
    with the 64-bit channel offsets and the mask for the store."""
    mask_c = cc < C
    mask = mask_s[:, None] & mask_c[None, :]
    cc64 = cc.to(tl.int64)
    x = tl.load(x_base[:, None] + cc64[None, :] * sx_c, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_base[:, None] + cc64[None, :] * sd_c, mask=mask, other=0.0).to(tl.float32)
    if HAS_W:
        dy = dy * tl.load(W + cc, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    xhat = (x - mean[:, None]) * rstd[:, None]
    return xhat, dy, cc64, mask


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
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # positions and channels of a tile
    SC: tl.constexpr,
):
    if SC > 0:  # a dense channels-first map: the positions and channel strides are compile-time SC
        S, sd_c, sx_c, sg_c = SC, SC, SC, SC
    b, offs_s, mask_s, s64 = _positions(tiles_per_b, S, BLOCK_S)
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
        xhat, dy, _cc64, _mask = _ln_bwd_chunk(x_base, dy_base, W, mean, rstd, mask_s, c0 + cols, C, sx_c, sd_c,
                                               HAS_W)
        c1 += tl.sum(xhat * dy, axis=1)
        c2 += tl.sum(dy, axis=1)
    c1r = c1 / C * rstd
    c2r = c2 / C * rstd
    # Pass 2: dx.
    for c0 in range(0, C, BLOCK_C):
        xhat, dy, cc64, mask = _ln_bwd_chunk(x_base, dy_base, W, mean, rstd, mask_s, c0 + cols, C, sx_c, sd_c, HAS_W)
        dx = dy * rstd[:, None] - (xhat * c1r[:, None] + c2r[:, None])
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
    BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,  # positions and channels of a tile
    SC: tl.constexpr,
):
    if SC > 0:  # a dense channels-first map: the positions and channel strides are compile-time SC
        S, sd_c, sx_c = SC, SC, SC
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


@triton.jit
def _ln_bwd_finish_kernel(
    P,  # fp32 [G, 2, C]: partial sums of dy*xhat (part 0) and dy (part 1) per program of the backward
    DW,  # [C] out, the weight's dtype: sum over G of part 0
    DB,  # [C] out, the bias's dtype: sum over G of part 1
    G, C,
    FIRST: tl.constexpr,  # part handled by grid row 0 (1 when only dB is wanted)
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # grid = (cdiv(C, BLOCK_N), parts): a fixed-order sum over G, cast once (no atomics, same bits every run).
    pid_n = tl.program_id(0)
    part = FIRST + tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = cols < C
    rows = tl.arange(0, BLOCK_G)
    base = P + part.to(tl.int64) * C + cols
    acc = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + rows
        m = (g < G)[:, None] & mask_n[None, :]
        acc += tl.load(base[None, :] + (g.to(tl.int64) * (2 * C))[:, None], mask=m, other=0.0)
    total = tl.sum(acc, axis=0)
    if part == 0:
        tl.store(DW + cols, total.to(DW.dtype.element_ty), mask=mask_n)
    else:
        tl.store(DB + cols, total.to(DB.dtype.element_ty), mask=mask_n)


# --------------------------------------------------------------------------- host side


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


def _params(p: Optional[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x if p is None else (p if p.stride(0) == 1 else p.contiguous())


def _fwd_host(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], dim: int, eps: float, wrap=direct
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer norm of ``x`` over ``dim``: returns ``(y, mean, rstd)``; mean and rstd are fp32 ``[numel / C]``.
    ``wrap`` is applied to each kernel before launching (:mod:`snntrain.kernels.op_utils`)."""
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
    split = tuning.find_split(x, dim)
    if split is None:
        x = x.contiguous()
        split = tuning.find_split(x, dim)
    ys = tuning.strides3(y, dim, split)
    if ys is None:  # y is a fresh dense tensor, so this only guards odd groupings
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        ys = tuning.strides3(y, dim, split)
    p = tuning.plan_fwd(x, dim, split)
    xs = tuning.strides3(x, dim, split)
    wrap(_ln_fwd_kernel)[(p.num_tiles,)](
        x, y, _params(weight, x), _params(bias, x), mean, rstd,
        p.S, p.C, p.tiles_per_b,
        xs[0], xs[1], xs[2], ys[0], ys[1], ys[2],
        eps,
        HAS_W=weight is not None, HAS_B=bias is not None,
        BLOCK_S=p.block_s, BLOCK_C=p.block_c, SINGLE=p.single, SC=tuning.const_s(p, xs, ys), STORE_Y=True,
        num_warps=p.num_warps,
    )
    return y, mean, rstd


def layer_norm_stats(x: torch.Tensor, eps: float, dim: int = -3) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, rstd)`` of the layer norm of ``x`` over ``dim``, ``[numel / C]`` in the order of ``x``'s other
    dims (row-major, whatever the layout): one read of ``x`` by the forward kernel without its output (fp32
    statistics of fp32, fp16 or bf16 input), ``torch.var_mean`` for float64 input (float64 statistics). Not
    differentiable: for a consumer that normalises as it reads (a layer norm folded into a generated neuron,
    :func:`snntrain.kernels.step_neuron.ln_step_neuron`) and finishes the gradient with :func:`ln_input_grad`."""
    if x.dtype == torch.float64:
        with torch.no_grad():
            var, mean = torch.var_mean(x, dim=dim, correction=0)
            return mean.reshape(-1), torch.rsqrt(var + eps).reshape(-1)
    dim = _check(x, None, None, dim, eps)
    n_stats = x.numel() // x.shape[dim] if x.shape[dim] > 0 else 0
    mean = torch.empty(n_stats, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_stats, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return mean, rstd
    split = tuning.find_split(x, dim)
    if split is None:
        x = x.contiguous()
        split = tuning.find_split(x, dim)
    p = tuning.plan_fwd(x, dim, split)
    xs = tuning.strides3(x, dim, split)
    with profiled("snntrain::layer_norm_stats"):
        _ln_fwd_kernel[(p.num_tiles,)](
            x, x, x, x, mean, rstd, p.S, p.C, p.tiles_per_b, xs[0], xs[1], xs[2], xs[0], xs[1], xs[2], eps,
            HAS_W=False, HAS_B=False, BLOCK_S=p.block_s, BLOCK_C=p.block_c, SINGLE=p.single,
            SC=tuning.const_s(p, xs, xs), STORE_Y=False, num_warps=p.num_warps,
        )
    return mean, rstd


def _finish_dwdb(part: torch.Tensor, dw: torch.Tensor, db: torch.Tensor, need_dw: bool, need_db: bool,
                 wrap=direct) -> None:
    """dW, dB = fixed-order sums of the partials ``part`` [G, 2, C] over G, in one small kernel."""
    G, _, C = part.shape
    block_n = min(next_pow2(C), 16 if C <= 256 else 32)
    block_g = min(next_pow2(G), max(1, TUNING.finish_tile // block_n))
    grid = (cdiv(C, block_n), int(need_dw) + int(need_db))
    wrap(_ln_bwd_finish_kernel)[grid](
        part, dw if need_dw else db, db if need_db else dw, G, C,
        FIRST=0 if need_dw else 1, BLOCK_G=block_g, BLOCK_N=block_n,
        num_warps=tuning.warps_for(block_g * block_n, 512, 8),
    )


def _bwd_host(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dim: int,
    need_dw: bool,
    need_db: bool,
    wrap=direct,
    in_place: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dx, dw, db)`` of :func:`layer_norm_fwd`.

    ``dw`` (``db``) is empty when ``need_dw`` (``need_db``) is False or there is no weight (bias).
    ``bias`` is only read for its dtype. ``wrap`` as in :func:`_fwd_host`. ``in_place``: dx is written over
    ``dy`` (a temporary of the caller's; each tile is read before it is written, and a separate weight-sum pass
    runs first).
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
    dw = torch.empty(C, dtype=weight.dtype, device=x.device) if need_dw else empty
    db = torch.empty(C, dtype=bias.dtype, device=x.device) if need_db else empty.clone()
    split = tuning.find_split(x, dim)
    if split is None:
        x = x.contiguous()
        split = tuning.find_split(x, dim)
    ds = tuning.strides3(dy, dim, split)
    if ds is None:
        dy = dy.contiguous()
        ds = tuning.strides3(dy, dim, split)
    if in_place and dy.dtype == x.dtype:
        dx = dy
    gs = tuning.strides3(dx, dim, split)
    if gs is None:
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        gs = tuning.strides3(dx, dim, split)
    xs = tuning.strides3(x, dim, split)
    need_p = need_dw or need_db
    fuse_p = need_p and not tuning.separate_dwdb(x, dim, split)
    p = tuning.plan_bwd(x, dim, split, fuse_p)
    fuse_p = fuse_p and p.single
    sc = tuning.const_s(p, xs, ds, gs)
    w_arg = _params(weight, x)
    part = empty
    if need_p and not fuse_p:
        # dW, dB in a column-split pass of their own (see separate_dwdb; also the looped path), before dx (which
        # may overwrite dy)
        bs, bc, tiles_per_b, n_col, G = tuning.plan_dwdb(p, tuning.sm_count(x.device))
        part = torch.empty((G, 2, C), dtype=torch.float32, device=x.device)
        wrap(_ln_bwd_dwdb_kernel)[(n_col, G)](
            dy, x, mean, rstd, part,
            p.S, C, tiles_per_b, p.B0 * tiles_per_b,
            ds[0], ds[1], ds[2], xs[0], xs[1], xs[2],
            BLOCK_S=bs, BLOCK_C=bc, SC=sc,
            num_warps=tuning.warps_for(bs * bc, TUNING.bwd_warp_elems, TUNING.bwd_max_warps),
        )
    if p.single:
        if fuse_p:
            part = torch.empty((p.programs, 2, C), dtype=torch.float32, device=x.device)
        wrap(_ln_bwd_fused_kernel)[(p.programs,)](
            dy, x, w_arg, mean, rstd, dx, part,
            p.S, C, p.tiles_per_b, p.num_tiles,
            ds[0], ds[1], ds[2], xs[0], xs[1], xs[2], gs[0], gs[1], gs[2],
            HAS_W=weight is not None, NEED_P=fuse_p, REDUCE_EACH=p.s_unit and TUNING.cf_reduce_each,
            BLOCK_S=p.block_s, BLOCK_C=p.block_c, SC=sc, ONE_B=p.B0 == 1, STAGES=tuning.bwd_stages(p, x, dy),
            num_warps=p.num_warps, **tuning.reg_cap(p),
        )
    else:
        wrap(_ln_bwd_dx_looped_kernel)[(p.num_tiles,)](
            dy, x, w_arg, mean, rstd, dx,
            p.S, C, p.tiles_per_b,
            ds[0], ds[1], ds[2], xs[0], xs[1], xs[2], gs[0], gs[1], gs[2],
            HAS_W=weight is not None, BLOCK_S=p.block_s, BLOCK_C=p.block_c, SC=sc, num_warps=p.num_warps,
        )
    if need_p:
        _finish_dwdb(part, dw, db, need_dw, need_db, wrap)
    return dx, dw, db


def ln_input_grad(x: torch.Tensor, grad: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  mean: torch.Tensor, rstd: torch.Tensor, need_dw: bool, need_db: bool, dim: int = -3,
                  ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(dL/dx, dL/dweight, dL/dbias)`` of the layer norm ``y = (x - mean) * rstd * weight + bias`` of ``x`` over
    ``dim`` (statistics of :func:`layer_norm_stats`) from ``grad`` = dL/dy, laid out like ``x`` and in its dtype:
    ``dx = rstd * (w*dy - mean_C(w*dy) - xhat * mean_C(w*dy*xhat))`` per position. One pass of the backward
    kernel, which reads dL/dy and ``x`` and writes dL/dx over ``grad`` (a temporary of the caller's) with the
    weight's and bias's per-program sums; float64 in PyTorch. The weight gradients are None where not asked for
    (or without that parameter)."""
    if x.dtype != torch.float64:
        dx, dw, db = _bwd_host(grad, x, weight, bias, mean, rstd, dim, need_dw, need_db, in_place=True)
        return dx, dw if need_dw and weight is not None else None, db if need_db and bias is not None else None
    dim = dim % x.dim()
    shape = list(x.shape)
    shape[dim] = 1
    mean, rstd = mean.view(shape), rstd.view(shape)
    xhat = (x - mean) * rstd
    cshape = [1] * x.dim()
    cshape[dim] = -1
    wg = grad if weight is None else grad * weight.to(grad.dtype).view(cshape)
    dx = rstd * (wg - wg.mean(dim, keepdim=True) - xhat * (wg * xhat).mean(dim, keepdim=True))
    others = [d for d in range(x.dim()) if d != dim]
    dw = (grad * xhat).sum(others).to(weight.dtype) if need_dw and weight is not None else None
    db = grad.sum(others).to(bias.dtype) if need_db and bias is not None else None
    return dx, dw, db


def _layer_norm_fwd(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], dim: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, mean, rstd)`` of :func:`_fwd_host`."""
    return _fwd_host(x, weight, bias, dim, eps, op_wrap)


def _layer_norm_fwd_fake(x, weight, bias, dim, eps):
    return _fwd_host(x, weight, bias, dim, eps, no_launch)


def _layer_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], mean: torch.Tensor,
    rstd: torch.Tensor, dim: int, need_dw: bool, need_db: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dw, db)`` of :func:`_bwd_host`."""
    return _bwd_host(dy, x, weight, bias, mean, rstd, dim, need_dw, need_db, op_wrap)


def _layer_norm_bwd_fake(dy, x, weight, bias, mean, rstd, dim, need_dw, need_db):
    return _bwd_host(dy, x, weight, bias, mean, rstd, dim, need_dw, need_db, no_launch)


layer_norm_fwd = register_op("snntrain::layer_norm_fwd", _layer_norm_fwd, _layer_norm_fwd_fake)
layer_norm_bwd = register_op("snntrain::layer_norm_bwd", _layer_norm_bwd, _layer_norm_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, dim, _eps = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.dim = dim
    # mean and rstd are not differentiable; without set_materialize_grads(False) autograd
    # would still fill a zero gradient for each (two extra kernels) before every backward.
    ctx.mark_non_differentiable(mean, rstd)
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, _dmean, _drstd, bwd=None):
    if dy is None:
        return None, None, None, None, None
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = (bwd or layer_norm_bwd)(dy, x, weight, bias, mean, rstd, ctx.dim, need_dw, need_db)
    return (
        dx if need_dx else None,
        dw if need_dw and weight is not None else None,
        db if need_db and bias is not None else None,
        None,
        None,
    )


layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(dy, x, weight, bias, mean, rstd, dim, need_dw, need_db):
    with profiled("snntrain::layer_norm_bwd"):
        return _bwd_host(dy, x, weight, bias, mean, rstd, dim, need_dw, need_db)


# The registered ops' forward and backward without the operator machinery (eager calls).
_EagerLayerNorm = eager_function("snntrain::layer_norm_fwd", _fwd_host, _setup_context,
                                 functools.partial(_backward, bwd=_eager_bwd))


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
    fn = layer_norm_fwd if traced(x, weight, bias) else _EagerLayerNorm.apply
    return fn(x, weight, bias, dim, eps)[0]
