"""The parallel spiking neuron (PSN) in Triton: ``S = heaviside(W X + b)`` over time, one kernel per direction.

Registered as ``torch.ops.snntrain.psn_fwd`` and ``torch.ops.snntrain.psn_bwd`` (``torch.library.triton_op``)
with autograd, like the scan neurons of :mod:`snntrain.kernels.lif`. The modules of
:mod:`snntrain.nn.psn` (``PSN``, ``MaskedPSN``, ``SlidingPSN``) differ only in how they build the
``[T, T]`` weight (masked, or one shared row slid along time), which they do in PyTorch; every one of
them runs these two kernels. Nothing here imports from ``snntrain.nn``.

Design
------
The neuron's charge is a matrix product over time, ``H[t, n] = sum_j W[t, j] X[j, n] + b[t]``, with a
tiny inner dimension (T, usually 4 to 32) and a huge outer one (every neuron of every sample). Done
as a cuBLAS product it writes H (the size of X) and reads it again to fire; the backward then writes
and reads dL/dH several times (dL/dX = W^T dL/dH, dL/dW = dL/dH X^T, dL/db). Here each direction is
one kernel that reads every input once:

* forward: each program owns ``BLOCK`` neurons and holds their whole input column ``X[:, n]`` in
  registers, forms each H[t] in fp32 and writes the spikes. Short sequences (``T < DOT_MIN_T``) as
  ``T`` fp32 vectors with the loops over T unrolled (``T`` is a compile-time constant), longer ones as
  a ``[TP, BLOCK]`` tile and one fp32 product (``tl.dot``, IEEE precision). Nothing is saved for the
  backward beyond X itself (which the caller holds anyway): no H, no spikes;
* backward: read X and dL/dS once, recompute H, form dL/dH with the surrogate, write
  dL/dX = W^T dL/dH, and reduce the partial sums of dL/dW and dL/db per program into small fp32
  buffers, summed afterwards over programs in a fixed order (deterministic, no atomics). Short
  sequences (``T < DOT_MIN_T``) do this on ``T`` vectors per block, with ``T * T`` block sums for
  dL/dW; longer ones on ``[TP, BLOCK]`` tiles with three fp32 products,
  each program walking several blocks with dL/dW in a ``[TP, TP]`` accumulator, so that the sums
  over neurons stay inside the product instead of costing a block reduction each.

Per element-step that is two tensors of X's size moved in each direction (plus an expanded dL/dS read
as one value per step), against about eleven for the cuBLAS form (H written and read, dL/dH written
and read three times). A tile holds ``W`` (``[TP, TP]``) in registers, so the kernels take
``T <= MAX_T`` (:mod:`snntrain.kernels.psn_tuning`, which also holds the launch sizes).

H is accumulated as ``sum_j W[t, j] X[j]`` in order and the bias added last; a cuBLAS or CPU product
may round differently, so a spike whose H is within rounding of 0 may differ from the torch backend
(``torch.addmm``). The surrogate gradient is taken at H, the formulas of :mod:`snntrain.nn.surrogate`.

Layouts: X is addressed as ``x[t, n] = x_ptr + t*stride_t + n*stride_n``, and channels-last maps are
read in place with every output laid out like X (the addressing of :mod:`snntrain.kernels.lif`).
Under ``TRITON_INTERPRET=1`` the operators are opaque ``custom_op``s running the same kernels
(:mod:`snntrain.kernels.op_utils`).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .lif import _empty, _neuron_order, _time_major
from .neuron_step import SURROGATES, surrogate_grad
from .op_utils import (
    FLOAT_DTYPES,
    INT32_MAX,
    cdiv,
    direct,
    eager_function,
    op_wrap,
    profiled,
    register_op,
    sm_count,
    traced,
)
from .psn_tuning import DOT_MIN_T, MAX_T, WARPS, blocks, dot_programs, dot_tiles

__all__ = ["MAX_T", "SURROGATES", "psn_multistep", "psn_fwd", "psn_bwd"]

# Bits of the operators' ``flags``: bits 0-1 the surrogate (index into SURROGATES), then the gradients asked for.
F_SURROGATE_MASK = 3
F_GRAD_X, F_GRAD_W, F_GRAD_B = 4, 8, 16


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit
def _load_column(x_ptr, offs, mask, stride_xt, stride_xn, T: tl.constexpr):
    """The input column of the block's neurons, ``T`` fp32 vectors (X[0], ..., X[T-1]); ``stride_xt`` int64."""
    xs = ()
    for j in tl.static_range(T):
        xs = xs + (tl.load(x_ptr + j * stride_xt + offs * stride_xn, mask=mask, other=0.0).to(tl.float32),)
    return xs


@triton.jit
def _charge(xs, w_ptr, b_ptr, t: tl.constexpr, T: tl.constexpr):
    """H[t] = sum_j W[t, j] X[j] + b[t] (fp32; W and b read as scalars)."""
    h = tl.load(w_ptr + t * T) * xs[0]
    for j in tl.static_range(1, T):
        h += tl.load(w_ptr + t * T + j) * xs[j]
    return h + tl.load(b_ptr + t)


@triton.jit
def _psn_fwd_kernel(
    x_ptr,  # [T, N] input (fp32/fp16/bf16); x[t, n] at t*stride_xt + n*stride_xn
    w_ptr,  # [T, T] contiguous fp32 weight
    b_ptr,  # [T] fp32 bias
    s_ptr,  # [T, N] contiguous spikes out, dtype of x
    N, stride_xt, stride_xn,
    T: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    n64 = tl.cast(N, tl.int64)  # t * N and t * stride_xt may pass 2**31
    xs = _load_column(x_ptr, offs, mask, tl.cast(stride_xt, tl.int64), stride_xn, T)
    out_dtype = s_ptr.dtype.element_ty
    for t in tl.static_range(T):
        h = _charge(xs, w_ptr, b_ptr, t, T)
        tl.store(s_ptr + t * n64 + offs, tl.where(h >= 0.0, 1.0, 0.0).to(out_dtype), mask=mask)


@triton.jit
def _psn_fwd_dot_kernel(
    x_ptr,  # [T, N] input (fp32/fp16/bf16); x[t, n] at t*stride_xt + n*stride_xn
    w_ptr,  # [T, T] contiguous fp32 weight
    b_ptr,  # [T] fp32 bias
    s_ptr,  # [T, N] contiguous spikes out, dtype of x
    N, stride_xt, stride_xn,
    T: tl.constexpr, TP: tl.constexpr, BLOCK: tl.constexpr,
):
    """Longer sequences: H = W X on a ``[TP, BLOCK]`` tile as one fp32 product (``tl.dot``, IEEE precision)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, TP)
    rmask = rows < T
    rows64 = tl.cast(rows, tl.int64)
    w = tl.load(w_ptr + rows[:, None] * T + rows[None, :], mask=rmask[:, None] & rmask[None, :], other=0.0)
    b = tl.load(b_ptr + rows, mask=rmask, other=0.0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m2 = rmask[:, None] & (offs < N)[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_xt + offs[None, :] * stride_xn, mask=m2, other=0.0)
    h = tl.dot(w, x.to(tl.float32), input_precision="ieee") + b[:, None]
    out_dtype = s_ptr.dtype.element_ty
    tl.store(s_ptr + rows64[:, None] * tl.cast(N, tl.int64) + offs[None, :], tl.where(h >= 0.0, 1.0, 0.0).to(out_dtype),
             mask=m2)


@triton.jit
def _psn_bwd_kernel(
    x_ptr,  # [T, N] forward input; x[t, n] at t*stride_xt + n*stride_xn
    w_ptr,  # [T, T] contiguous fp32 weight
    b_ptr,  # [T] fp32 bias
    gs_ptr,  # [T, N] dL/dS at t*stride_gt + n*stride_gn (stride_gn 0: one value per step)
    gx_ptr,  # [T, N] contiguous dL/dX out, dtype of x, written when STORE_GX
    gw_part_ptr,  # [num_programs, T, T] fp32 per-program partial dL/dW, written when STORE_GW
    gb_part_ptr,  # [num_programs, T] fp32 per-program partial dL/db, written when STORE_GB
    N, stride_xt, stride_xn, stride_gt, stride_gn,  # neurons; the strides of x and dL/dS
    alpha, SURROGATE: tl.constexpr,  # the surrogate gradient
    STORE_GX: tl.constexpr, STORE_GW: tl.constexpr, STORE_GB: tl.constexpr,  # the gradients written
    T: tl.constexpr, BLOCK: tl.constexpr,
):
    """Short sequences (T < DOT_MIN_T): one block of neurons per program, the input column and dL/dH as
    ``T`` vectors each; dL/dW and dL/db reduced per program (``T * T + T`` block sums)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    alpha = tl.cast(alpha, tl.float32)
    n64 = tl.cast(N, tl.int64)
    stride_gt = tl.cast(stride_gt, tl.int64)
    xs = _load_column(x_ptr, offs, mask, tl.cast(stride_xt, tl.int64), stride_xn, T)
    # dL/dH[t] = dL/dS[t] * surrogate'(H[t]); zero for the padding neurons (their dL/dS loads as 0)
    ghs = ()
    for t in tl.static_range(T):
        h = _charge(xs, w_ptr, b_ptr, t, T)
        gs = tl.load(gs_ptr + t * stride_gt + offs * stride_gn, mask=mask, other=0.0).to(tl.float32)
        ghs = ghs + (gs * surrogate_grad(h, alpha, SURROGATE),)
    if STORE_GX:
        out_dtype = gx_ptr.dtype.element_ty
        for j in tl.static_range(T):
            gx = tl.load(w_ptr + j) * ghs[0]
            for t in tl.static_range(1, T):
                gx += tl.load(w_ptr + t * T + j) * ghs[t]
            tl.store(gx_ptr + j * n64 + offs, gx.to(out_dtype), mask=mask)
    row = tl.cast(pid, tl.int64)
    if STORE_GB:
        for t in tl.static_range(T):
            tl.store(gb_part_ptr + row * T + t, tl.sum(ghs[t], axis=0))
    if STORE_GW:
        for t in tl.static_range(T):
            for j in tl.static_range(T):
                tl.store(gw_part_ptr + row * (T * T) + t * T + j, tl.sum(ghs[t] * xs[j], axis=0))


@triton.jit
def _psn_bwd_dot_kernel(
    x_ptr, w_ptr, b_ptr, gs_ptr, gx_ptr, gw_part_ptr, gb_part_ptr,  # as _psn_bwd_kernel's
    N, n_blocks, stride_xt, stride_xn, stride_gt, stride_gn,  # neurons, blocks; the strides of x and dL/dS
    alpha, SURROGATE: tl.constexpr,  # the surrogate gradient
    STORE_GX: tl.constexpr, STORE_GW: tl.constexpr, STORE_GB: tl.constexpr,  # the gradients written
    T: tl.constexpr, TP: tl.constexpr, BLOCK: tl.constexpr,
):
    """Longer sequences: ``[TP, BLOCK]`` tiles (TP = T rounded up to a power of two, at least 16) and three
    fp32 products (``tl.dot``, IEEE precision): H = W X, dL/dX = W^T dL/dH and dL/dW += dL/dH X^T. Each program
    walks the blocks ``pid, pid + num_programs, ...`` and keeps its partial dL/dW in a ``[TP, TP]`` accumulator,
    so the ``T * T`` sums over neurons leave the program once, not once per block."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    alpha = tl.cast(alpha, tl.float32)
    n64 = tl.cast(N, tl.int64)
    rows = tl.arange(0, TP)
    rmask = rows < T
    rows64 = tl.cast(rows, tl.int64)
    wmask = rmask[:, None] & rmask[None, :]
    w = tl.load(w_ptr + rows[:, None] * T + rows[None, :], mask=wmask, other=0.0)  # w[t, j] = W[t, j]
    wt = tl.load(w_ptr + rows[None, :] * T + rows[:, None], mask=wmask, other=0.0)  # wt[j, t] = W[t, j]
    b = tl.load(b_ptr + rows, mask=rmask, other=0.0)
    gw = tl.zeros([TP, TP], dtype=tl.float32)
    gb = tl.zeros([TP], dtype=tl.float32)
    x_rows = x_ptr + rows64[:, None] * stride_xt
    gs_rows = gs_ptr + rows64[:, None] * stride_gt
    out_dtype = gx_ptr.dtype.element_ty
    for blk in range(pid, n_blocks, nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        m2 = rmask[:, None] & (offs < N)[None, :]
        x = tl.load(x_rows + offs[None, :] * stride_xn, mask=m2, other=0.0).to(tl.float32)
        h = tl.dot(w, x, input_precision="ieee") + b[:, None]
        gs = tl.load(gs_rows + offs[None, :] * stride_gn, mask=m2, other=0.0).to(tl.float32)
        gh = gs * surrogate_grad(h, alpha, SURROGATE)  # zero outside the sequence and past the last neuron
        if STORE_GX:
            gx = tl.dot(wt, gh, input_precision="ieee")
            tl.store(gx_ptr + rows64[:, None] * n64 + offs[None, :], gx.to(out_dtype), mask=m2)
        if STORE_GW:
            gw = tl.dot(gh, tl.trans(x), gw, input_precision="ieee")
        if STORE_GB:
            gb += tl.sum(gh, axis=1)
    row = tl.cast(pid, tl.int64)
    if STORE_GW:
        tl.store(gw_part_ptr + row * (T * T) + rows[:, None] * T + rows[None, :], gw, mask=wmask)
    if STORE_GB:
        tl.store(gb_part_ptr + row * T + rows, gb, mask=rmask)


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _steps(x: Tensor) -> int:
    """T as a Python int: the kernels are compiled for each T (a symbolic size under ``torch.compile(dynamic=True)``
    is specialised here)."""
    return int(x.shape[0])


def _check_n(x: Tensor) -> int:
    N = math.prod(x.shape[1:])
    if N > INT32_MAX:
        raise ValueError(f"a time step has {N} neurons; the Triton PSN kernels support at most {INT32_MAX}")
    return N


def _fwd_host(x: Tensor, weight: Tensor, bias: Tensor, params: list[float], flags: int, launch: bool,
              wrap=direct) -> Tensor:
    T = _steps(x)
    N = _check_n(x)
    order = _neuron_order(x, None)
    spikes = _empty(x.shape, order, 1, x.dtype, x.device)
    if launch and N > 0:
        xk, stride_xt, stride_xn = _time_major(x, order)
        if T >= DOT_MIN_T:
            block, tp = dot_tiles(T)
            wrap(_psn_fwd_dot_kernel)[(cdiv(N, block),)](
                xk, weight, bias, spikes, N, stride_xt, stride_xn, T=T, TP=tp, BLOCK=block, num_warps=WARPS)
        else:
            block, _ = blocks(T)
            wrap(_psn_fwd_kernel)[(cdiv(N, block),)](
                xk, weight, bias, spikes, N, stride_xt, stride_xn, T=T, BLOCK=block, num_warps=WARPS)
    return spikes


def _bwd_host(x: Tensor, weight: Tensor, bias: Tensor, grad_spikes: Tensor, params: list[float], flags: int,
              launch: bool, wrap=direct) -> tuple[Tensor, Tensor, Tensor]:
    T = _steps(x)
    N = _check_n(x)
    dev = x.device
    need_x, need_w, need_b = bool(flags & F_GRAD_X), bool(flags & F_GRAD_W), bool(flags & F_GRAD_B)
    order = _neuron_order(x, None)
    # the kernel takes its output dtype from grad_x: always pass a tensor
    grad_x = _empty(x.shape if need_x else (0,), order, 1, x.dtype, dev)
    dot = T >= DOT_MIN_T
    if dot:
        block, tp = dot_tiles(T)
        grid = dot_programs(N, block, sm_count(dev))
    else:
        block = blocks(T)[1]
        grid = cdiv(N, block)
    gw_part = torch.empty((grid if need_w else 0, T, T), dtype=torch.float32, device=dev)
    gb_part = torch.empty((grid if need_b else 0, T), dtype=torch.float32, device=dev)
    if launch and N > 0:
        xk, stride_xt, stride_xn = _time_major(x, order)
        gs, stride_gt, stride_gn = _time_major(grad_spikes, order)
        options = dict(SURROGATE=flags & F_SURROGATE_MASK, STORE_GX=need_x, STORE_GW=need_w, STORE_GB=need_b, T=T,
                       BLOCK=block, num_warps=WARPS)
        if dot:
            wrap(_psn_bwd_dot_kernel)[(grid,)](
                xk, weight, bias, gs, grad_x, gw_part, gb_part,
                N, cdiv(N, block), stride_xt, stride_xn, stride_gt, stride_gn, float(params[0]), TP=tp, **options)
        else:
            wrap(_psn_bwd_kernel)[(grid,)](
                xk, weight, bias, gs, grad_x, gw_part, gb_part,
                N, stride_xt, stride_xn, stride_gt, stride_gn, float(params[0]), **options)
    # the sums over programs, in a fixed order; zeros where there were no neurons
    grad_w = gw_part.sum(0) if need_w else torch.empty((0,), dtype=torch.float32, device=dev)
    grad_b = gb_part.sum(0) if need_b else torch.empty((0,), dtype=torch.float32, device=dev)
    return grad_x, grad_w, grad_b


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _psn_fwd(x: Tensor, weight: Tensor, bias: Tensor, params: list[float], flags: int) -> Tensor:
    """Spikes ``[T, ...]`` of ``heaviside(weight @ x + bias)`` (``weight`` ``[T, T]``, ``bias`` ``[T]``, fp32)."""
    return _fwd_host(x, weight, bias, params, flags, launch=True, wrap=op_wrap)


def _psn_fwd_fake(x, weight, bias, params, flags):
    return _fwd_host(x, weight, bias, params, flags, launch=False)


def _psn_bwd(x: Tensor, weight: Tensor, bias: Tensor, grad_spikes: Tensor, params: list[float],
             flags: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias)``, each empty unless F_GRAD_X/F_GRAD_W/F_GRAD_B."""
    return _bwd_host(x, weight, bias, grad_spikes, params, flags, launch=True, wrap=op_wrap)


def _psn_bwd_fake(x, weight, bias, grad_spikes, params, flags):
    return _bwd_host(x, weight, bias, grad_spikes, params, flags, launch=False)


psn_fwd = register_op("snntrain::psn_fwd", _psn_fwd, _psn_fwd_fake)
psn_bwd = register_op("snntrain::psn_bwd", _psn_bwd, _psn_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, params, flags = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.params, ctx.flags = params, flags


def _backward(ctx, grad_spikes, bwd=None):
    x, weight, bias = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if grad_spikes is None or not (need_x or need_w or need_b):
        return None, None, None, None, None
    flags = ctx.flags | (F_GRAD_X if need_x else 0) | (F_GRAD_W if need_w else 0) | (F_GRAD_B if need_b else 0)
    grad_x, grad_w, grad_b = (bwd or psn_bwd)(x, weight, bias, grad_spikes, ctx.params, flags)
    return grad_x if need_x else None, grad_w if need_w else None, grad_b if need_b else None, None, None


psn_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(x, weight, bias, grad_spikes, params, flags):
    with profiled("snntrain::psn_bwd"):
        return _bwd_host(x, weight, bias, grad_spikes, params, flags, launch=True)


# The same forward and backward as the registered ops, launched without the operator machinery.
_EagerPSN = eager_function("snntrain::psn_fwd", functools.partial(_fwd_host, launch=True), _setup_context,
                           functools.partial(_backward, bwd=_eager_bwd))


def psn_multistep(x: Tensor, weight: Tensor, bias: Tensor, surrogate: str = "atan", alpha: float = 2.0) -> Tensor:
    """Spikes of ``heaviside(weight @ x.flatten(1) + bias[:, None])`` reshaped like ``x`` ``[T, ...]``, with the
    surrogate gradient ``surrogate`` of sharpness ``alpha``; differentiable in ``x``, ``weight`` ``[T, T]`` and
    ``bias`` ``[T]`` (both taken in fp32, their gradients come back in their dtypes). Spikes in ``x``'s dtype.
    Arguments are expected to be validated already (:mod:`snntrain.nn.psn`)."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the Triton PSN kernels take float32, float16 or bfloat16 "
                        "(use backend='torch' for other dtypes)")
    T = x.shape[0]
    if T > MAX_T:
        raise ValueError(f"T={T} time steps; the Triton PSN kernels take at most {MAX_T} (use backend='torch')")
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate={surrogate!r} is not valid; choose one of {', '.join(SURROGATES)}")
    weight = weight.to(device=x.device, dtype=torch.float32).contiguous()
    bias = bias.to(device=x.device, dtype=torch.float32).reshape(T).contiguous()
    params, flags = [float(alpha)], SURROGATES.index(surrogate)
    fn = psn_fwd if traced(x, weight, bias) else _EagerPSN.apply
    return fn(x, weight, bias, params, flags)
