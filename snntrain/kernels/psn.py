"""The parallel spiking neuron (PSN) in Triton: ``S = heaviside(W X + b)`` over time, one kernel per direction.

Registered as ``torch.ops.snntrain.psn_fwd`` and ``torch.ops.snntrain.psn_bwd`` (``torch.library.triton_op``)
with autograd, like the scan neurons of :mod:`snntrain.kernels.lif`. The modules of
:mod:`snntrain.nn.psn` (``PSN``, ``MaskedPSN``, ``SlidingPSN``) hand their parameters over as they are and
the kernels form the ``[T, T]`` weight ``W`` themselves, in one of three forms (``FORM``):

* dense (``PSN``): ``W = weight`` ``[T, T]``;
* masked (``MaskedPSN``): ``W = weight * (lam * mask0 + (1 - lam) * mask1)`` with ``lam = min(lambda_, 1)``
  read on the GPU (no host synchronisation);
* sliding (``SlidingPSN``): ``W[t, j] = weight[K - 1 - (t - j)]`` for ``0 <= t - j < K``, else 0, from one
  row ``weight`` ``[K]`` (the zeros are skipped at compile time: ``min(K, T)`` terms per step, not ``T``).

The bias is read with a stride of 1 (``[T]`` or ``[T, 1]``) or 0 (one shared scalar). The weight gradient
comes back in the parameter's shape (masked: times the mask; sliding: the sums along each diagonal), so no
PyTorch op builds or differentiates ``W`` on the way: a call is the kernels and the allocations of their
outputs. Nothing here imports from ``snntrain.nn``.

Design
------
The neuron's charge is a matrix product over time, ``H[t, n] = sum_j W[t, j] X[j, n] + b[t]``, with a
tiny inner dimension (T, usually 4 to 32) and a huge outer one (every neuron of every sample). Done
as a cuBLAS product it writes H (the size of X) and reads it again to fire; the backward then writes
and reads dL/dH several times (dL/dX = W^T dL/dH, dL/dW = dL/dH X^T, dL/db). Here each direction is
one kernel that reads every input once:

* forward (``T <= VEC_MAX_T``): each program owns a block of neurons, loads their whole input column
  ``X[:, n]`` as ``T`` fp32 vectors (coalesced, 8 or 16 bytes per thread and load), forms each H[t] with
  the loops over T unrolled (``T`` is a compile-time constant, W read as scalars) and writes the spikes.
  Nothing is saved for the backward beyond X itself (which the caller holds anyway): no H, no spikes;
* backward (``T <= VEC_MAX_T``): a grid of persistent programs (a few per SM), each walking blocks of
  neurons: read X and dL/dS, recompute H, form dL/dH with the surrogate, write dL/dX = W^T dL/dH, and add
  dL/dH X^T and dL/dH into the program's sums. Up to ``VEC_BWD_MAX_T`` (the sliding form: up to
  ``VEC_MAX_T``, one sum per diagonal) those sums are per thread (``T * T + T`` vectors in registers, one
  block reduction per program at its end); beyond, dL/dW is
  accumulated by a tensor-core product of the block's ``[16, BLOCK]`` tiles of dL/dH and X
  (``tl.dot``, three TF32 products summing to fp32 accuracy), since ``T * T`` sums per thread would not
  fit in registers. Each program writes one row of partial sums (``[programs, T * T + T]`` fp32, a few
  hundred rows); one small kernel adds the rows in a fixed order (deterministic, no atomics) and maps
  them onto the parameters (mask, diagonals, shared bias);
* ``T > VEC_MAX_T``: ``[TP, BLOCK]`` tiles and fp32 products (``tl.dot``, IEEE precision by default: ``psn_tuning.DOT_PRECISION``) in both
  directions, the backward's programs walking several blocks with dL/dW in a ``[TP, TP]`` accumulator.

Bytes moved, for ``N`` neurons, ``T`` steps, elements of ``s`` bytes (the tutorial's ``[T, 64, 65536]``:
``N = 4 Mi``; ``P`` backward programs):

* forward: read X, write S: ``2 T N s`` (T = 4 fp32: 128 MiB; T = 16 bf16: 256 MiB);
* backward: read X and dL/dS, write dL/dX: ``3 T N s``, or ``2 T N s`` when dL/dS is one value per step
  (the gradient of ``.sum()``, stride 0; T = 4 fp32: 128 MiB); the partial sums, ``P (T * T + T) * 4``
  bytes written and read once (under 1 MiB), are noise.

That is two or three tensors of X's size per direction against about eleven for the cuBLAS form (H
written and read, dL/dH written and read three times). The arithmetic per neuron is ``T * T``
multiply-adds per product (forward: one, backward: two, plus dL/dW), under the memory time up to
T = 16 in fp32 (about a quarter of it at T = 16 in the forward). A tile holds ``W`` (``[TP, TP]``) in
registers, so the kernels take ``T <= MAX_T`` (:mod:`snntrain.kernels.psn_tuning`, which also holds the
launch sizes).

H is accumulated as ``sum_j W[t, j] X[j]`` in order and the bias added last; a cuBLAS or CPU product
may round differently, so a spike whose H is within rounding of 0 may differ from the torch backend
(``torch.addmm``). The surrogate gradient is taken at H, the formulas of :mod:`snntrain.nn.surrogate`.

Layouts: X is addressed as ``x[t, n] = x_ptr + t*stride_t + n*stride_n``, and channels-last maps are
read in place with every output laid out like X (the addressing of :mod:`snntrain.kernels.lif`).
Eager calls reuse a launch plan per layout (:class:`~snntrain.kernels.op_utils.Planned`). Under
``TRITON_INTERPRET=1`` the operators are opaque ``custom_op``s running the same kernels
(:mod:`snntrain.kernels.op_utils`).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import psn_tuning as tuning
from .lif import _empty, _neuron_order, _permuted, _single_stride, _time_major
from .neuron_step import SURROGATES, surrogate_grad
from .op_utils import (
    FLOAT_DTYPES,
    INT32_MAX,
    PlanCache,
    Planned,
    cdiv,
    direct,
    eager_function,
    next_pow2,
    op_wrap,
    profiled,
    register_op,
    sm_count,
    traced,
)
from .psn_tuning import MAX_T

__all__ = ["MAX_T", "SURROGATES", "DENSE", "MASKED", "SLIDING", "psn_multistep", "psn_fwd", "psn_bwd"]

# Bits of the operators' ``flags``: bits 0-1 the surrogate (index into SURROGATES), then the gradients asked for.
F_SURROGATE_MASK = 3
F_GRAD_X, F_GRAD_W, F_GRAD_B = 4, 8, 16

#: The weight forms (the kernels' ``FORM``): a dense ``[T, T]`` matrix, a masked one, a slid row.
DENSE, MASKED, SLIDING = 0, 1, 2


# ----------------------------------------------------------------------------
# Kernels: the weight
# ----------------------------------------------------------------------------


@triton.jit
def _lambda(lam_ptr, FORM: tl.constexpr):
    """The masked form's ``min(lambda_, 1)`` (fp32 scalar); 0 for the other forms (unused)."""
    if FORM == 1:
        lam = tl.minimum(tl.load(lam_ptr).to(tl.float32), 1.0)
    else:
        lam = 0.0
    return lam


@triton.jit
def _w(w_ptr, m0_ptr, m1_ptr, lam, t: tl.constexpr, j: tl.constexpr, T: tl.constexpr, FORM: tl.constexpr,
       K: tl.constexpr):
    """W[t, j] as an fp32 scalar, for an entry the form uses (sliding: ``0 <= t - j < K``)."""
    if FORM == 2:
        w = tl.load(w_ptr + (K - 1 - t + j))
    elif FORM == 1:
        m = lam * tl.load(m0_ptr + (t * T + j)) + (1.0 - lam) * tl.load(m1_ptr + (t * T + j))
        w = m * tl.load(w_ptr + (t * T + j))
    else:
        w = tl.load(w_ptr + (t * T + j))
    return w


@triton.jit
def _weights(w_ptr, m0_ptr, m1_ptr, lam, T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr):
    """Every W[t, j] as a tuple of ``T * T`` fp32 scalars, row-major; the sliding form's structural zeros as
    the constant 0.0 (never read: the loops skip them at compile time)."""
    ws = ()
    for t in tl.static_range(T):
        for j in tl.static_range(T):
            if FORM != 2 or (t >= j and t - j < K):
                ws = ws + (_w(w_ptr, m0_ptr, m1_ptr, lam, t, j, T, FORM, K),)
            else:
                ws = ws + (0.0,)
    return ws


@triton.jit
def _weight_tile(w_ptr, m0_ptr, m1_ptr, lam, r, c, T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr):
    """W[r, c] for index tiles ``r``, ``c`` (broadcast against each other), 0 outside ``[T, T]`` and outside the
    sliding form's band."""
    valid = (r < T) & (c < T)
    if FORM == 2:
        lag = r - c
        w = tl.load(w_ptr + (K - 1 - lag), mask=valid & (lag >= 0) & (lag < K), other=0.0)
    elif FORM == 1:
        idx = r * T + c
        m = lam * tl.load(m0_ptr + idx, mask=valid, other=0.0) + (1.0 - lam) * tl.load(m1_ptr + idx, mask=valid,
                                                                                           other=0.0)
        w = m * tl.load(w_ptr + idx, mask=valid, other=0.0)
    else:
        w = tl.load(w_ptr + r * T + c, mask=valid, other=0.0)
    return w


# ----------------------------------------------------------------------------
# Kernels: the vector forms (T <= VEC_MAX_T)
# ----------------------------------------------------------------------------


@triton.jit
def _load_rows(ptr, offs, mask, stride_t, stride_n, T: tl.constexpr):
    """``T`` fp32 rows ptr[t, offs] (t = 0 .. T-1) shaped like ``offs``; ``stride_t`` int64."""
    rows = ()
    for t in tl.static_range(T):
        rows = rows + (tl.load(ptr + t * stride_t + offs * stride_n, mask=mask, other=0.0).to(tl.float32),)
    return rows


@triton.jit
def _load_grads(gs_ptr, offs, mask, stride_gt, stride_gn, T: tl.constexpr, GS_BCAST: tl.constexpr):
    """dL/dS as ``T`` fp32 rows shaped like ``offs``, 0 past the last neuron. ``GS_BCAST``: one value per step
    (``stride_gn`` 0, the gradient of ``.sum()``), read once and broadcast in the rows' layout."""
    if GS_BCAST:
        rows = ()
        for t in tl.static_range(T):
            rows = rows + (tl.where(mask, tl.load(gs_ptr + t * stride_gt).to(tl.float32), 0.0),)
    else:
        rows = _load_rows(gs_ptr, offs, mask, stride_gt, stride_gn, T)
    return rows


@triton.jit
def _charge(xs, w_ptr, m0_ptr, m1_ptr, lam, b, t: tl.constexpr, T: tl.constexpr, FORM: tl.constexpr,
            K: tl.constexpr):
    """H[t] = sum_j W[t, j] X[j] + b in that order (fp32), W read as scalars, the sliding form's zeros skipped."""
    j0: tl.constexpr = t - K + 1 if FORM == 2 and t >= K else 0  # the sliding form's band: t - K < j <= t
    j1: tl.constexpr = t + 1 if FORM == 2 else T
    h = _w(w_ptr, m0_ptr, m1_ptr, lam, t, j0, T, FORM, K) * xs[j0]
    for j in tl.static_range(j0 + 1, j1):
        h += _w(w_ptr, m0_ptr, m1_ptr, lam, t, j, T, FORM, K) * xs[j]
    return h + b


@triton.jit
def _charge_w(xs, ws, b, t: tl.constexpr, T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr):
    """:func:`_charge` with W given as the scalars of :func:`_weights`."""
    j0: tl.constexpr = t - K + 1 if FORM == 2 and t >= K else 0
    j1: tl.constexpr = t + 1 if FORM == 2 else T
    h = ws[t * T + j0] * xs[j0]
    for j in tl.static_range(j0 + 1, j1):
        h += ws[t * T + j] * xs[j]
    return h + b


@triton.jit
def _grad_in(ghs, ws, j: tl.constexpr, T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr):
    """dL/dX[j] = sum_t W[t, j] dL/dH[t] in that order, W as the scalars of :func:`_weights`."""
    t0: tl.constexpr = j if FORM == 2 else 0  # the sliding form's band: j <= t < j + K
    t1: tl.constexpr = (j + K if j + K < T else T) if FORM == 2 else T
    g = ws[t0 * T + j] * ghs[t0]
    for t in tl.static_range(t0 + 1, t1):
        g += ws[t * T + j] * ghs[t]
    return g


@triton.jit
def _grad_in_ptr(ghs, w_ptr, m0_ptr, m1_ptr, lam, j: tl.constexpr, T: tl.constexpr, FORM: tl.constexpr,
                 K: tl.constexpr):
    """:func:`_grad_in` with W read as scalars."""
    t0: tl.constexpr = j if FORM == 2 else 0
    t1: tl.constexpr = (j + K if j + K < T else T) if FORM == 2 else T
    g = _w(w_ptr, m0_ptr, m1_ptr, lam, t0, j, T, FORM, K) * ghs[t0]
    for t in tl.static_range(t0 + 1, t1):
        g += _w(w_ptr, m0_ptr, m1_ptr, lam, t, j, T, FORM, K) * ghs[t]
    return g


@triton.jit
def _stack(vs, rows, T: tl.constexpr, TP: tl.constexpr, BLOCK: tl.constexpr):
    """The ``[TP, BLOCK]`` tile whose row t is ``vs[t]`` (``[1, BLOCK]`` each; rows from T on: 0). Each thread holds
    whole columns, so the selects fold into register moves."""
    tile = tl.zeros((TP, BLOCK), dtype=tl.float32)
    for t in tl.static_range(T):
        tile = tl.where(rows[:, None] == t, vs[t], tile)
    return tile


@triton.jit
def _psn_fwd_kernel(
    x_ptr,  # [T, N] input (fp32/fp16/bf16); x[t, n] at t*stride_xt + n*stride_xn
    w_ptr, m0_ptr, m1_ptr, lam_ptr,  # the weight's parameters (FORM); unused pointers point at w
    b_ptr,  # [T] or [1] fp32 bias, read at t * B_STRIDE
    s_ptr,  # [T, N] contiguous spikes out, dtype of x
    N, stride_xt, stride_xn,
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, B_STRIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    n64 = tl.cast(N, tl.int64)  # t * N and t * stride_xt may pass 2**31
    xs = _load_rows(x_ptr, offs, mask, tl.cast(stride_xt, tl.int64), stride_xn, T)
    lam = _lambda(lam_ptr, FORM)
    out_dtype = s_ptr.dtype.element_ty
    for t in tl.static_range(T):
        h = _charge(xs, w_ptr, m0_ptr, m1_ptr, lam, tl.load(b_ptr + t * B_STRIDE), t, T, FORM, K)
        tl.store(s_ptr + t * n64 + offs, tl.where(h >= 0.0, 1.0, 0.0).to(out_dtype), mask=mask)


@triton.jit
def _psn_bwd_kernel(
    x_ptr,  # [T, N] forward input; x[t, n] at t*stride_xt + n*stride_xn
    w_ptr, m0_ptr, m1_ptr, lam_ptr, b_ptr,  # as the forward's
    gs_ptr,  # [T, N] dL/dS at t*stride_gt + n*stride_gn (stride_gn 0: one value per step)
    gx_ptr,  # [T, N] contiguous dL/dX out, dtype of x, written when STORE_GX
    part_ptr,  # [num_programs, NW + NB] fp32 partial sums of dL/dW (NW) and dL/db (NB), one row per program
    N, n_blocks, stride_xt, stride_xn, stride_gt, stride_gn,  # neurons, blocks; the strides of x and dL/dS
    alpha, SURROGATE: tl.constexpr,  # the surrogate gradient
    STORE_GX: tl.constexpr, STORE_GW: tl.constexpr, STORE_GB: tl.constexpr,  # the gradients written
    GS_BCAST: tl.constexpr,  # dL/dS one value per step (stride_gn 0)
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, B_STRIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """T <= VEC_BWD_MAX_T (the sliding form: T <= VEC_MAX_T): each program walks the blocks ``pid, pid + num_programs, ...`` with its sums of dL/dW
    (the dense and masked forms: every W[t, j]; the sliding form: one per diagonal t - j < K) and dL/db (one per
    step, or one in all for a shared bias) as vectors per thread, reduced once at the end."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    alpha = tl.cast(alpha, tl.float32)
    n64 = tl.cast(N, tl.int64)
    stride_xt = tl.cast(stride_xt, tl.int64)
    stride_gt = tl.cast(stride_gt, tl.int64)
    ws = _weights(w_ptr, m0_ptr, m1_ptr, _lambda(lam_ptr, FORM), T, FORM, K)
    bs = ()
    for t in tl.static_range(T):
        bs = bs + (tl.load(b_ptr + t * B_STRIDE),)
    NL: tl.constexpr = K if K < T else T  # diagonals of the sliding form
    NW: tl.constexpr = NL if FORM == 2 else T * T
    NB: tl.constexpr = T if B_STRIDE == 1 else 1
    acc_w = ()
    for _i in tl.static_range(NW):
        acc_w = acc_w + (tl.zeros([BLOCK], dtype=tl.float32),)
    acc_b = ()
    for _i in tl.static_range(NB):
        acc_b = acc_b + (tl.zeros([BLOCK], dtype=tl.float32),)
    out_dtype = gx_ptr.dtype.element_ty
    for blk in range(pid, n_blocks, nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        # every load of the block before its first store (a store might alias them for the compiler)
        xs = _load_rows(x_ptr, offs, mask, stride_xt, stride_xn, T)
        gss = _load_grads(gs_ptr, offs, mask, stride_gt, stride_gn, T, GS_BCAST)
        # dL/dH[t] = dL/dS[t] * surrogate'(H[t]); zero past the last neuron (dL/dS loads as 0 there)
        ghs = ()
        for t in tl.static_range(T):
            ghs = ghs + (gss[t] * surrogate_grad(_charge_w(xs, ws, bs[t], t, T, FORM, K), alpha, SURROGATE),)
        if STORE_GX:
            for j in tl.static_range(T):
                tl.store(gx_ptr + j * n64 + offs, _grad_in(ghs, ws, j, T, FORM, K).to(out_dtype), mask=mask)
        if STORE_GW:
            new = ()
            if FORM == 2:
                for d in tl.static_range(NL):  # sum over t of dL/dH[t] X[t - d]
                    a = acc_w[d]
                    for t in tl.static_range(d, T):
                        a += ghs[t] * xs[t - d]
                    new = new + (a,)
            else:
                for t in tl.static_range(T):
                    for j in tl.static_range(T):
                        new = new + (acc_w[t * T + j] + ghs[t] * xs[j],)
            acc_w = new
        if STORE_GB:
            new = ()
            if B_STRIDE == 1:
                for t in tl.static_range(T):
                    new = new + (acc_b[t] + ghs[t],)
            else:
                a = acc_b[0]
                for t in tl.static_range(T):
                    a += ghs[t]
                new = new + (a,)
            acc_b = new
    row = part_ptr + tl.cast(pid, tl.int64) * (NW + NB)
    if STORE_GW:
        for i in tl.static_range(NW):
            tl.store(row + i, tl.sum(acc_w[i], axis=0))
    if STORE_GB:
        for i in tl.static_range(NB):
            tl.store(row + NW + i, tl.sum(acc_b[i], axis=0))


@triton.jit
def _psn_bwd_mma_kernel(
    x_ptr, w_ptr, m0_ptr, m1_ptr, lam_ptr, b_ptr, gs_ptr, gx_ptr, part_ptr,  # as _psn_bwd_kernel's
    N, n_blocks, stride_xt, stride_xn, stride_gt, stride_gn,
    alpha, SURROGATE: tl.constexpr,
    STORE_GX: tl.constexpr, STORE_GW: tl.constexpr, STORE_GB: tl.constexpr, GS_BCAST: tl.constexpr,
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, B_STRIDE: tl.constexpr, TP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """VEC_BWD_MAX_T < T <= VEC_MAX_T, dense and masked forms: as :func:`_psn_bwd_kernel`, H and dL/dX on ``T`` rows per block (W read
    as scalars), dL/dW accumulated by a tensor-core product of the block's ``[TP, BLOCK]`` tiles of dL/dH and X
    (three TF32 products, fp32 accuracy) and dL/db per thread; the partial rows as ``_psn_bwd_kernel``'s."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    alpha = tl.cast(alpha, tl.float32)
    n64 = tl.cast(N, tl.int64)
    stride_xt = tl.cast(stride_xt, tl.int64)
    stride_gt = tl.cast(stride_gt, tl.int64)
    lam = _lambda(lam_ptr, FORM)
    rows = tl.arange(0, TP)
    NL: tl.constexpr = K if K < T else T
    NW: tl.constexpr = NL if FORM == 2 else T * T
    NB: tl.constexpr = T if B_STRIDE == 1 else 1
    gw = tl.zeros((TP, TP), dtype=tl.float32)
    gb = tl.zeros((TP, BLOCK), dtype=tl.float32)
    out_dtype = gx_ptr.dtype.element_ty
    for blk in range(pid, n_blocks, nprog):
        # rows as [1, BLOCK] tiles: the layout of the [TP, BLOCK] tiles stacked from them (whole columns per thread)
        offs = (blk * BLOCK + tl.arange(0, BLOCK))[None, :]
        mask = offs < N
        xs = _load_rows(x_ptr, offs, mask, stride_xt, stride_xn, T)
        gss = _load_grads(gs_ptr, offs, mask, stride_gt, stride_gn, T, GS_BCAST)
        ghs = ()
        for t in tl.static_range(T):
            h = _charge(xs, w_ptr, m0_ptr, m1_ptr, lam, tl.load(b_ptr + t * B_STRIDE), t, T, FORM, K)
            ghs = ghs + (gss[t] * surrogate_grad(h, alpha, SURROGATE),)
        if STORE_GX:
            for j in tl.static_range(T):
                g = _grad_in_ptr(ghs, w_ptr, m0_ptr, m1_ptr, lam, j, T, FORM, K)
                tl.store(gx_ptr + j * n64 + offs, g.to(out_dtype), mask=mask)
        if STORE_GW or STORE_GB:
            gh_tile = _stack(ghs, rows, T, TP, BLOCK)
            if STORE_GW:
                gw = tl.dot(gh_tile, tl.trans(_stack(xs, rows, T, TP, BLOCK)), gw, input_precision="tf32x3")
            if STORE_GB:
                gb += gh_tile
    row = part_ptr + tl.cast(pid, tl.int64) * (NW + NB)
    if STORE_GW:
        if FORM == 2:
            lag = rows[:, None] - rows[None, :]
            for d in tl.static_range(NL):
                tl.store(row + d, tl.sum(tl.sum(tl.where(lag == d, gw, 0.0), axis=1), axis=0))
        else:
            tl.store(row + rows[:, None] * T + rows[None, :], gw, mask=(rows[:, None] < T) & (rows[None, :] < T))
    if STORE_GB:
        gb_t = tl.sum(gb, axis=1)
        if B_STRIDE == 1:
            tl.store(row + NW + rows, gb_t, mask=rows < T)
        else:
            tl.store(row + NW, tl.sum(gb_t, axis=0))


# ----------------------------------------------------------------------------
# Kernels: tiles and products (T > VEC_MAX_T)
# ----------------------------------------------------------------------------


@triton.jit
def _psn_fwd_dot_kernel(
    x_ptr, w_ptr, m0_ptr, m1_ptr, lam_ptr, b_ptr, s_ptr,  # as _psn_fwd_kernel's
    N, stride_xt, stride_xn,
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, B_STRIDE: tl.constexpr, TP: tl.constexpr,
    BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Longer sequences: H = W X on a ``[TP, BLOCK]`` tile as one fp32 product (``tl.dot`` in ``PRECISION``,
    :data:`~snntrain.kernels.psn_tuning.DOT_PRECISION`)."""
    pid = tl.program_id(0)
    rows = tl.arange(0, TP)
    rmask = rows < T
    rows64 = tl.cast(rows, tl.int64)
    w = _weight_tile(w_ptr, m0_ptr, m1_ptr, _lambda(lam_ptr, FORM), rows[:, None], rows[None, :], T, FORM, K)
    b = tl.load(b_ptr + rows * B_STRIDE, mask=rmask, other=0.0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m2 = rmask[:, None] & (offs < N)[None, :]
    x = tl.load(x_ptr + rows64[:, None] * stride_xt + offs[None, :] * stride_xn, mask=m2, other=0.0)
    h = tl.dot(w, x.to(tl.float32), input_precision=PRECISION) + b[:, None]
    out_dtype = s_ptr.dtype.element_ty
    tl.store(s_ptr + rows64[:, None] * tl.cast(N, tl.int64) + offs[None, :], tl.where(h >= 0.0, 1.0, 0.0).to(out_dtype),
             mask=m2)


@triton.jit
def _psn_bwd_dot_kernel(
    x_ptr, w_ptr, m0_ptr, m1_ptr, lam_ptr, b_ptr, gs_ptr, gx_ptr, part_ptr,  # as _psn_bwd_kernel's
    N, n_blocks, stride_xt, stride_xn, stride_gt, stride_gn,
    alpha, SURROGATE: tl.constexpr,
    STORE_GX: tl.constexpr, STORE_GW: tl.constexpr, STORE_GB: tl.constexpr, GS_BCAST: tl.constexpr,
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, B_STRIDE: tl.constexpr, TP: tl.constexpr,
    BLOCK: tl.constexpr, PRECISION: tl.constexpr,
):
    """Longer sequences: ``[TP, BLOCK]`` tiles (TP = T rounded up to a power of two, at least 16) and three
    fp32 products (``tl.dot`` in ``PRECISION``): H = W X, dL/dX = W^T dL/dH and dL/dW += dL/dH X^T. Each program
    walks the blocks ``pid, pid + num_programs, ...`` and keeps its partial dL/dW in a ``[TP, TP]`` accumulator,
    so the ``T * T`` sums over neurons leave the program once, not once per block."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    alpha = tl.cast(alpha, tl.float32)
    n64 = tl.cast(N, tl.int64)
    rows = tl.arange(0, TP)
    rmask = rows < T
    rows64 = tl.cast(rows, tl.int64)
    lam = _lambda(lam_ptr, FORM)
    w = _weight_tile(w_ptr, m0_ptr, m1_ptr, lam, rows[:, None], rows[None, :], T, FORM, K)  # w[t, j] = W[t, j]
    wt = _weight_tile(w_ptr, m0_ptr, m1_ptr, lam, rows[None, :], rows[:, None], T, FORM, K)  # wt[j, t] = W[t, j]
    b = tl.load(b_ptr + rows * B_STRIDE, mask=rmask, other=0.0)
    NL: tl.constexpr = K if K < T else T
    NW: tl.constexpr = NL if FORM == 2 else T * T
    NB: tl.constexpr = T if B_STRIDE == 1 else 1
    gw = tl.zeros([TP, TP], dtype=tl.float32)
    gb = tl.zeros([TP], dtype=tl.float32)
    x_rows = x_ptr + rows64[:, None] * stride_xt
    gs_rows = gs_ptr + rows64[:, None] * stride_gt
    out_dtype = gx_ptr.dtype.element_ty
    for blk in range(pid, n_blocks, nprog):
        offs = blk * BLOCK + tl.arange(0, BLOCK)
        m2 = rmask[:, None] & (offs < N)[None, :]
        x = tl.load(x_rows + offs[None, :] * stride_xn, mask=m2, other=0.0).to(tl.float32)
        h = tl.dot(w, x, input_precision=PRECISION) + b[:, None]
        if GS_BCAST:
            gs = tl.where(m2, tl.load(gs_rows, mask=rmask[:, None], other=0.0).to(tl.float32), 0.0)
        else:
            gs = tl.load(gs_rows + offs[None, :] * stride_gn, mask=m2, other=0.0).to(tl.float32)
        gh = gs * surrogate_grad(h, alpha, SURROGATE)  # zero outside the sequence and past the last neuron
        if STORE_GX:
            gx = tl.dot(wt, gh, input_precision=PRECISION)
            tl.store(gx_ptr + rows64[:, None] * n64 + offs[None, :], gx.to(out_dtype), mask=m2)
        if STORE_GW:
            gw = tl.dot(gh, tl.trans(x), gw, input_precision=PRECISION)
        if STORE_GB:
            gb += tl.sum(gh, axis=1)
    row = part_ptr + tl.cast(pid, tl.int64) * (NW + NB)
    if STORE_GW:
        if FORM == 2:
            lag = rows[:, None] - rows[None, :]
            for d in tl.static_range(NL):
                tl.store(row + d, tl.sum(tl.sum(tl.where(lag == d, gw, 0.0), axis=1), axis=0))
        else:
            tl.store(row + rows[:, None] * T + rows[None, :], gw, mask=rmask[:, None] & rmask[None, :])
    if STORE_GB:
        if B_STRIDE == 1:
            tl.store(row + NW + rows, gb, mask=rmask)
        else:
            tl.store(row + NW, tl.sum(gb, axis=0))


# ----------------------------------------------------------------------------
# Kernels: the parameters' gradients from the partial sums
# ----------------------------------------------------------------------------


@triton.jit
def _psn_grad_finish_kernel(
    part_ptr,  # [P, NW + NB] fp32 partial sums, one row per backward program
    gw_ptr,  # the weight's gradient, fp32 in its shape ([T, T], or [K] for the sliding form)
    gb_ptr,  # the bias's gradient, fp32, NB values ([T] or one shared value)
    m0_ptr, m1_ptr, lam_ptr,  # the masked form's mask and lambda (unused pointers point at the partial sums)
    P,
    T: tl.constexpr, FORM: tl.constexpr, K: tl.constexpr, NW: tl.constexpr, NB: tl.constexpr,
    STORE_GW: tl.constexpr, STORE_GB: tl.constexpr, COLS: tl.constexpr, ROWS: tl.constexpr,
):
    """One program: the column sums of the partial rows, added ``ROWS`` rows at a time in a fixed order
    (deterministic), then dL/dweight = dL/dW (dense), dL/dW times the mask (masked) or, for the sliding form,
    ``weight[K - 1 - d]`` gets the sum along diagonal d (0 for the weights no step reaches, d >= T)."""
    cols = tl.arange(0, COLS)
    width: tl.constexpr = NW + NB
    cmask = cols < width
    acc = tl.zeros([COLS], dtype=tl.float32)
    for r0 in range(0, P, ROWS):
        r = r0 + tl.arange(0, ROWS)
        tile = tl.load(part_ptr + tl.cast(r, tl.int64)[:, None] * width + cols[None, :],
                       mask=(r < P)[:, None] & cmask[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    wmask = cols < NW
    if STORE_GW:
        if FORM == 2:
            tl.store(gw_ptr + (K - 1 - cols), acc, mask=wmask)
            for z0 in range(0, K - NW, COLS):
                tl.store(gw_ptr + z0 + cols, tl.zeros([COLS], dtype=tl.float32), mask=z0 + cols < K - NW)
        elif FORM == 1:
            lam = _lambda(lam_ptr, FORM)
            m = lam * tl.load(m0_ptr + cols, mask=wmask, other=0.0) + (1.0 - lam) * tl.load(m1_ptr + cols, mask=wmask,
                                                                                             other=0.0)
            tl.store(gw_ptr + cols, acc * m, mask=wmask)
        else:
            tl.store(gw_ptr + cols, acc, mask=wmask)
    if STORE_GB:
        tl.store(gb_ptr + (cols - NW), acc, mask=(cols >= NW) & cmask)


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


def _form(weight: Tensor, mask0: Tensor | None) -> tuple[int, int]:
    """``(FORM, K)`` of a weight: a row ``[K]`` slides, a matrix with masks is masked, else dense (K unused: 1)."""
    if weight.dim() == 1:
        return SLIDING, int(weight.shape[0])
    return (MASKED if mask0 is not None else DENSE), 1


def _consts(T: int, weight: Tensor, bias: Tensor, mask0: Tensor | None) -> dict:
    form, K = _form(weight, mask0)
    return dict(T=T, FORM=form, K=K, B_STRIDE=1 if bias.numel() == T else 0)


def _partial_width(T: int, form: int, K: int, b_stride: int) -> tuple[int, int]:
    """``(NW, NB)``: the partial sums per backward program of dL/dW and of dL/db."""
    return (min(K, T) if form == SLIDING else T * T), (T if b_stride == 1 else 1)


def _copied(t: Tensor, order: tuple[int, ...]) -> bool:
    """Whether :func:`~snntrain.kernels.lif._time_major` reads ``t`` through a contiguous copy (an odd layout)."""
    t = _permuted(t, order, 1)
    if t.is_contiguous():
        return False
    stride_n = _single_stride(t.shape[1:], t.stride()[1:])
    return stride_n is None or (math.prod(t.shape[1:]) - 1) * stride_n > INT32_MAX


def _fwd_plan(x: Tensor, consts: dict, launches: bool) -> tuple:
    """``(order, copy, planned)``: the neuron order, whether x is read through a contiguous copy, the launch."""
    T = consts["T"]
    N = _check_n(x)
    order = _neuron_order(x, None)
    copy = _copied(x, order)
    if not launches or N == 0:
        return order, copy, None
    _, stride_xt, stride_xn = _time_major(x, order)
    args = ("x", "w", "m0", "m1", "lam", "b", "s", N, stride_xt, stride_xn)
    if T > tuning.vec_max_t(consts["FORM"] == MASKED):
        block, tp = tuning.dot_tiles(T)
        planned = Planned(_psn_fwd_dot_kernel, (cdiv(N, block),), args,
                          dict(**consts, TP=tp, BLOCK=block, PRECISION=tuning.DOT_PRECISION, num_warps=tuning.WARPS))
    else:
        block = tuning.fwd_block(T)
        planned = Planned(_psn_fwd_kernel, (cdiv(N, block),), args, dict(**consts, BLOCK=block, num_warps=tuning.WARPS))
    return order, copy, planned


def _bwd_plan(x: Tensor, grad_spikes: Tensor, consts: dict, alpha: float, flags: int, launches: bool) -> tuple:
    """``(order, x copied, dL/dS copied, shape of the partial sums, launches)``: the backward kernel, then (when a
    parameter's gradient is asked for) the finishing kernel."""
    T, form, K, b_stride = consts["T"], consts["FORM"], consts["K"], consts["B_STRIDE"]
    N = _check_n(x)
    order = _neuron_order(x, None)
    _, stride_xt, stride_xn = _time_major(x, order)
    _, stride_gt, stride_gn = _time_major(grad_spikes, order)
    x_copy, g_copy = _copied(x, order), _copied(grad_spikes, order)
    need_x, need_w, need_b = bool(flags & F_GRAD_X), bool(flags & F_GRAD_W), bool(flags & F_GRAD_B)
    sms = sm_count(x.device)
    nw, nb = _partial_width(T, form, K, b_stride)
    if T > tuning.vec_max_t(form == MASKED):
        block, tp = tuning.dot_tiles(T)
        kernel, extra = _psn_bwd_dot_kernel, dict(TP=tp, PRECISION=tuning.DOT_PRECISION)
        programs = tuning.dot_programs(N, block, sms, T, form == MASKED)
    elif T > tuning.VEC_BWD_MAX_T and form != SLIDING:
        block, tp = tuning.mma_block(T)
        kernel, extra = _psn_bwd_mma_kernel, dict(TP=tp, num_stages=tuning.MMA_STAGES)
        programs = tuning.bwd_programs(tuning.MMA_PROGRAMS_PER_SM, cdiv(N, block), sms)
    else:  # per-thread sums: every W[t, j] up to VEC_BWD_MAX_T, the sliding form's diagonals up to VEC_MAX_T
        block = tuning.bwd_block(T, nw + nb)
        kernel, extra = _psn_bwd_kernel, {}
        per_sm = tuning.bwd_programs_per_sm(T, nw + nb, nw if form == SLIDING else T * T, block)
        programs = tuning.bwd_programs(per_sm, cdiv(N, block), sms)
    part_shape = (programs, nw + nb) if need_w or need_b else (0,)
    if not launches or N == 0:
        return order, x_copy, g_copy, part_shape, ()
    out = [Planned(kernel, (programs,),
                   ("x", "w", "m0", "m1", "lam", "b", "gs", "gx", "part", N, cdiv(N, block), stride_xt, stride_xn,
                    stride_gt, stride_gn, alpha),
                   dict(SURROGATE=flags & F_SURROGATE_MASK, STORE_GX=need_x, STORE_GW=need_w, STORE_GB=need_b,
                        GS_BCAST=stride_gn == 0, **consts, **extra, BLOCK=block, num_warps=tuning.WARPS))]
    if need_w or need_b:
        cols = next_pow2(nw + nb)
        out.append(Planned(_psn_grad_finish_kernel, (1,), ("part", "gw", "gb", "m0", "m1", "lam", programs),
                           dict(T=T, FORM=form, K=K, NW=nw, NB=nb, STORE_GW=need_w, STORE_GB=need_b, COLS=cols,
                                ROWS=tuning.finish_rows(cols), num_warps=4)))
    return order, x_copy, g_copy, part_shape, tuple(out)


_FWD_PLANS = PlanCache()
_BWD_PLANS = PlanCache()


def clear_plans() -> None:
    """Forget the eager launch plans (after launch sizes in :mod:`snntrain.kernels.psn_tuning` changed)."""
    _FWD_PLANS.clear()
    _BWD_PLANS.clear()


def _tensors(x, weight, bias, mask0, mask1, lam) -> dict:
    """The kernels' pointer arguments by name; the masked form's tensors point at the weight in the other forms."""
    return {"x": x, "w": weight, "m0": weight if mask0 is None else mask0, "m1": weight if mask1 is None else mask1,
            "lam": weight if lam is None else lam, "b": bias}


def _fwd_host(x: Tensor, weight: Tensor, bias: Tensor, mask0: Tensor | None, mask1: Tensor | None,
              lam: Tensor | None, params: list[float], flags: int, launch: bool, wrap=direct) -> Tensor:
    if launch and wrap is direct:  # eager: the plan by what decides it, read off the tensors cheaply
        key = (x.shape, x.stride(), weight.dim(), weight.shape[0], mask0 is None, bias.numel())
        plan = _FWD_PLANS.get(key)
        if plan is None:
            plan = _FWD_PLANS.put(key, _fwd_plan(x, _consts(_steps(x), weight, bias, mask0), True))
    else:
        plan = _fwd_plan(x, _consts(_steps(x), weight, bias, mask0), launch)
    order, copy, planned = plan
    spikes = _empty(x.shape, order, 1, x.dtype, x.device)
    if launch and planned is not None:
        tensors = _tensors(_time_major(x, order)[0] if copy else x, weight, bias, mask0, mask1, lam)
        tensors["s"] = spikes
        planned(wrap, tensors)
    return spikes


def _bwd_host(x: Tensor, weight: Tensor, bias: Tensor, mask0: Tensor | None, mask1: Tensor | None,
              lam: Tensor | None, grad_spikes: Tensor, params: list[float], flags: int, launch: bool,
              wrap=direct) -> tuple[Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias)``, the last two fp32 in the parameters' shapes; each empty unless asked for
    (F_GRAD_X, F_GRAD_W, F_GRAD_B)."""
    alpha = params[0]
    if launch and wrap is direct:
        key = (x.shape, x.stride(), grad_spikes.stride(), x.get_device(), weight.dim(), weight.shape[0],
               mask0 is None, bias.numel(), flags, alpha)
        plan = _BWD_PLANS.get(key)
        if plan is None:
            consts = _consts(_steps(x), weight, bias, mask0)
            plan = _BWD_PLANS.put(key, _bwd_plan(x, grad_spikes, consts, float(alpha), flags, True))
    else:
        plan = _bwd_plan(x, grad_spikes, _consts(_steps(x), weight, bias, mask0), float(alpha), flags, launch)
    order, x_copy, g_copy, part_shape, launches = plan
    dev = x.device
    need_x, need_w, need_b = flags & F_GRAD_X, flags & F_GRAD_W, flags & F_GRAD_B
    # the kernel takes its output dtype from grad_x: always pass a tensor
    grad_x = _empty(x.shape, order, 1, x.dtype, dev) if need_x else torch.empty((0,), dtype=x.dtype, device=dev)
    grad_w = torch.empty(weight.shape if need_w else (0,), dtype=torch.float32, device=dev)
    grad_b = torch.empty(bias.shape if need_b else (0,), dtype=torch.float32, device=dev)
    if not (launch and launches):
        if need_w:  # no neurons: nothing to sum
            grad_w.zero_()
        if need_b:
            grad_b.zero_()
        return grad_x, grad_w, grad_b
    part = torch.empty(part_shape, dtype=torch.float32, device=dev)
    tensors = _tensors(_time_major(x, order)[0] if x_copy else x, weight, bias, mask0, mask1, lam)
    tensors.update(gs=_time_major(grad_spikes, order)[0] if g_copy else grad_spikes, gx=grad_x, part=part,
                   gw=grad_w if need_w else part, gb=grad_b if need_b else part)
    if mask0 is None:  # the finishing kernel's unused pointers
        tensors.update(m0=part, m1=part, lam=part)
    for planned in launches:
        planned(wrap, tensors)
    return grad_x, grad_w, grad_b


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _psn_fwd(x: Tensor, weight: Tensor, bias: Tensor, mask0: Tensor | None, mask1: Tensor | None,
             lam: Tensor | None, params: list[float], flags: int) -> Tensor:
    """Spikes ``[T, ...]`` of ``heaviside(W @ x + bias)``, ``W`` formed from ``weight`` (``[T, T]``; masked by
    ``mask0``, ``mask1`` and ``lam`` when given; a row ``[K]`` slid along time), fp32 parameters."""
    return _fwd_host(x, weight, bias, mask0, mask1, lam, params, flags, launch=True, wrap=op_wrap)


def _psn_fwd_fake(x, weight, bias, mask0, mask1, lam, params, flags):
    return _fwd_host(x, weight, bias, mask0, mask1, lam, params, flags, launch=False)


def _psn_bwd(x: Tensor, weight: Tensor, bias: Tensor, mask0: Tensor | None, mask1: Tensor | None,
             lam: Tensor | None, grad_spikes: Tensor, params: list[float], flags: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dweight, dL/dbias)``, each empty unless F_GRAD_X/F_GRAD_W/F_GRAD_B."""
    return _bwd_host(x, weight, bias, mask0, mask1, lam, grad_spikes, params, flags, launch=True, wrap=op_wrap)


def _psn_bwd_fake(x, weight, bias, mask0, mask1, lam, grad_spikes, params, flags):
    return _bwd_host(x, weight, bias, mask0, mask1, lam, grad_spikes, params, flags, launch=False)


psn_fwd = register_op("snntrain::psn_fwd", _psn_fwd, _psn_fwd_fake)
psn_bwd = register_op("snntrain::psn_bwd", _psn_bwd, _psn_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, mask0, mask1, lam, params, flags = inputs
    ctx.save_for_backward(x, weight, bias, mask0, mask1, lam)
    ctx.params, ctx.flags = params, flags


def _backward(ctx, grad_spikes, bwd=None):
    x, weight, bias, mask0, mask1, lam = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    if grad_spikes is None or not (need_x or need_w or need_b):
        return None, None, None, None, None, None, None, None
    flags = ctx.flags | (F_GRAD_X if need_x else 0) | (F_GRAD_W if need_w else 0) | (F_GRAD_B if need_b else 0)
    grad_x, grad_w, grad_b = (bwd or psn_bwd)(x, weight, bias, mask0, mask1, lam, grad_spikes, ctx.params, flags)
    return (grad_x if need_x else None, grad_w if need_w else None, grad_b if need_b else None,
            None, None, None, None, None)


psn_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(x, weight, bias, mask0, mask1, lam, grad_spikes, params, flags):
    with profiled("snntrain::psn_bwd"):
        return _bwd_host(x, weight, bias, mask0, mask1, lam, grad_spikes, params, flags, launch=True)


# The same forward and backward as the registered ops, launched without the operator machinery.
_EagerPSN = eager_function("snntrain::psn_fwd", functools.partial(_fwd_host, launch=True), _setup_context,
                           functools.partial(_backward, bwd=_eager_bwd))


def _fp32(t: Tensor, device: torch.device) -> Tensor:
    """``t`` as a contiguous fp32 tensor on ``device`` (itself when it is one already: no op on the way)."""
    if t.dtype is torch.float32 and t.device == device and t.is_contiguous():
        return t
    return t.to(device=device, dtype=torch.float32).contiguous()


def psn_multistep(x: Tensor, weight: Tensor, bias: Tensor, surrogate: str = "atan", alpha: float = 2.0, *,
                  mask0: Tensor | None = None, mask1: Tensor | None = None, lambda_: Tensor | None = None) -> Tensor:
    """Spikes of ``heaviside(W @ x.flatten(1) + b)`` reshaped like ``x`` ``[T, ...]``, with the surrogate gradient
    ``surrogate`` of sharpness ``alpha``. ``W`` is ``weight`` ``[T, T]``; with ``mask0``, ``mask1`` ``[T, T]`` and
    ``lambda_`` (a one-element tensor) it is ``weight * (lam * mask0 + (1 - lam) * mask1)``, ``lam =
    min(lambda_, 1)``; a ``weight`` row ``[K]`` is slid along time (``W[t, j] = weight[K - 1 - (t - j)]`` for
    ``0 <= t - j < K``, else 0). ``bias`` has ``T`` elements (one per step, e.g. ``[T, 1]``) or one (shared).
    Differentiable in ``x``, ``weight`` and ``bias`` (taken in fp32, their gradients come back in their dtypes and
    shapes); the masks and ``lambda_`` are constants. Spikes in ``x``'s dtype. Arguments are expected to be
    validated already (:mod:`snntrain.nn.psn`)."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the Triton PSN kernels take float32, float16 or bfloat16 "
                        "(use backend='torch' for other dtypes)")
    T = x.shape[0]
    if T > MAX_T:
        raise ValueError(f"T={T} time steps; the Triton PSN kernels take at most {MAX_T} (use backend='torch')")
    if surrogate not in SURROGATES:
        raise ValueError(f"surrogate={surrogate!r} is not valid; choose one of {', '.join(SURROGATES)}")
    if weight.dim() != 1 and tuple(weight.shape) != (T, T):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; the Triton PSN kernels take [T, T] = [{T}, {T}] "
                         "or a row [K] slid along time")
    if bias.numel() not in (T, 1):
        raise ValueError(f"bias has {bias.numel()} elements; the Triton PSN kernels take T={T} (one per step) or 1")
    if (mask0 is None) != (mask1 is None) or (mask0 is None) != (lambda_ is None) or \
            (mask0 is not None and weight.dim() == 1):
        raise ValueError("mask0, mask1 and lambda_ come together, with a [T, T] weight")
    dev = x.device
    weight, bias = _fp32(weight, dev), _fp32(bias, dev)
    if mask0 is not None:
        mask0, mask1, lambda_ = _fp32(mask0, dev), _fp32(mask1, dev), _fp32(lambda_, dev)
    params, flags = [float(alpha)], SURROGATES.index(surrogate)
    if traced(x, weight, bias, mask0, mask1, lambda_):
        return psn_fwd(x, weight, bias, mask0, mask1, lambda_, params, flags)
    return _EagerPSN.apply(x, weight, bias, mask0, mask1, lambda_, params, flags)
