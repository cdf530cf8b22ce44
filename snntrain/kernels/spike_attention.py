"""Spiking self-attention in Triton: ``S = neuron(scale * Q K^T V)`` per head, the product and the neuron fused.

Registered as ``torch.ops.snntrain.spike_kv`` (``K^T V`` per head and step) and
``torch.ops.snntrain.ssa_neuron_fwd`` / ``ssa_neuron_bwd`` (the product with ``Q`` and the neuron after it),
with autograd; the PyTorch reference is :func:`snntrain.nn.attention.ssa_reference` followed by the neuron.

Shapes: ``q``, ``k``, ``v`` are spike tokens ``[T, B, N, C]`` (any strides with the channels dense, e.g. three
slices of one ``[T, B, N, 3C]`` projection), split into ``H`` heads of ``D = C / H`` channels.

* ``spike_kv``: one program per (step, sample, head) sums ``K_n^T V_n`` over the tokens in blocks
  (``tl.dot`` in tf32, which holds spikes exactly, accumulated in float32: exact integer counts, whatever the input
  dtype) and writes ``KV`` ``[T, B, H, D, D]`` in float32. Its backward is two batched products in PyTorch.
* ``ssa_neuron_fwd``: one program per block of tokens (:func:`_block_n`) of one (sample, head) scans T with the
  membrane of its ``BLOCK_N x D`` neurons in registers; each step computes the current ``y = scale * Q_t KV_t`` in
  registers (one ``tl.dot``, exact) and runs the neuron step of :mod:`snntrain.kernels.neuron_step`, writing only
  the spikes.
  The current, ``[T, B, N, C]`` in float32, never reaches memory: neither written, nor saved for the backward.
  When a gradient is needed the forward stores the fp32 membrane at the start of every chunk of steps after the
  first (:func:`~snntrain.kernels.neuron_step.chunk_steps`; none for T <= 4), as the neuron kernels do.
* ``ssa_neuron_bwd``: per chunk in reverse, reload the checkpoint, recompute the chunk's currents (as ``D`` outer
  products in registers: the chunk's steps are unrolled, and a ``tl.dot`` per step would stage each step's operands
  in shared memory) and charged membranes (exact integer products: the spikes are the forward's, bit for bit),
  then the reverse-time scan gives ``dL/dy`` in ``q``'s dtype, PLIF's ``dL/dk`` as per-program partial sums added
  in a fixed order. ``dL/dQ = scale dL/dy KV^T`` and ``dL/dKV = scale Q^T dL/dy`` are batched products in the
  autograd backward.

Bytes per element-step of the attention (16-bit spikes): the forward reads Q and writes S (4 B), where the
unfused path writes the current, reads it back in the neuron and keeps it for the backward (4 B more in
16-bit, 8 in float32, and the saved tensor). Nothing synchronises with the host. Under ``TRITON_INTERPRET=1``
the operators are opaque custom ops (:mod:`snntrain.kernels.op_utils`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from .neuron_step import (
    F_DECAY_INPUT,
    F_DETACH_RESET,
    F_GRAD_K,
    F_HARD_RESET,
    F_LEAK,
    F_SAVE_CKPT,
    F_SURROGATE_SHIFT,
    NO_FMA,
    SUM_BLOCK,
    backward_scan,
    chunk_steps,
    neuron_flags,
    scalars,
    step,
    sum_kernel,
)
from .op_utils import (
    FLOAT_DTYPES,
    INT32_MAX,
    cdiv,
    direct,
    eager_function,
    next_pow2,
    op_wrap,
    profiled,
    register_op,
    traced,
)

__all__ = ["spike_kv", "ssa_neuron", "ssa_neuron_fwd", "ssa_neuron_bwd", "spike_kv_op"]

#: Elements of a program's ``tokens x head channels`` tile: at least 16 tokens (``tl.dot``), fewer with larger heads;
#: the backward keeps a chunk's membranes (4 steps, 8 for T > 4) in registers: a quarter of the forward's tile
#: (``scripts/kernel_resources.py --family attention``: no spills on sm_90).
TILE = 2048
KV_BLOCK_N = 64
WARPS = 4


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit
def _kv_kernel(
    k_ptr,  # [T, B, N, C] spikes; k[t, b, n, c] at t*sk_t + b*sk_b + n*sk_n + c
    v_ptr,  # [T, B, N, C] spikes; likewise with sv_*
    kv_ptr,  # [T, B, H, D, D] contiguous fp32 out: sum over n of k[n, h*D + i] * v[n, h*D + j]
    B, N, H, D,
    sk_t, sk_b, sk_n, sv_t, sv_b, sv_n,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # (t * B + b) * H + h
    h = pid % H
    tb = pid // H
    b = tb % B
    t = tb // B
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    k_base = k_ptr + tl.cast(t, tl.int64) * sk_t + tl.cast(b, tl.int64) * sk_b + h * D
    v_base = v_ptr + tl.cast(t, tl.int64) * sv_t + tl.cast(b, tl.int64) * sv_b + h * D
    acc = tl.zeros([BLOCK_D, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        m = (offs_n < N)[:, None] & mask_d[None, :]
        kt = tl.load(k_base + tl.cast(offs_n, tl.int64)[:, None] * sk_n + offs_d[None, :], mask=m, other=0.0)
        vt = tl.load(v_base + tl.cast(offs_n, tl.int64)[:, None] * sv_n + offs_d[None, :], mask=m, other=0.0)
        # spikes are 0/1, exact in tf32; the products' sums are exact in the fp32 accumulator
        acc += tl.dot(tl.trans(kt.to(tl.float32)), vt.to(tl.float32), input_precision="tf32")
    out = kv_ptr + tl.cast(pid, tl.int64) * D * D + offs_d[:, None] * D + offs_d[None, :]
    tl.store(out, acc, mask=mask_d[:, None] & mask_d[None, :])


@triton.jit
def _current(q_base, kv_ptr, t, tb_h, offs_n, offs_d, mask, mask_d, sq_t, sq_n, D, scale, PRECISION: tl.constexpr):
    """``scale * Q_t KV_t`` for a block of tokens, ``[BLOCK_N, BLOCK_D]`` fp32, as one ``tl.dot``. Exact: Q is 0/1 and
    KV holds counts of at most N, which tf32 represents exactly up to 2048 (``PRECISION`` is ``ieee`` beyond)."""
    q = tl.load(q_base + tl.cast(t, tl.int64) * sq_t + tl.cast(offs_n, tl.int64)[:, None] * sq_n + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    kv_at = kv_ptr + (tl.cast(t, tl.int64) * tb_h) * D * D
    kv = tl.load(kv_at + offs_d[:, None] * D + offs_d[None, :], mask=mask_d[:, None] & mask_d[None, :], other=0.0)
    return tl.dot(q, kv, input_precision=PRECISION) * scale


@triton.jit
def _current_fma(q_base, kv_ptr, t, tb_h, offs_n, offs_d, mask_n, mask_d, sq_t, sq_n, D, valid, scale,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """:func:`_current` as ``D`` outer products in registers (no shared memory: the backward recomputes a chunk's
    steps unrolled). The same value bit for bit: every product and partial sum is an exact integer."""
    q_rows = q_base + tl.cast(t, tl.int64) * sq_t + tl.cast(offs_n, tl.int64) * sq_n  # [BLOCK_N]
    kv_at = kv_ptr + (tl.cast(t, tl.int64) * tb_h) * D * D
    y = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for i in range(D):
        qi = tl.load(q_rows + i, mask=mask_n & valid, other=0.0).to(tl.float32)  # column i of Q
        kvi = tl.load(kv_at + i * D + offs_d, mask=mask_d & valid, other=0.0)  # row i of KV
        y += qi[:, None] * kvi[None, :]
    return y * scale


@triton.jit
def _block(B, N, H, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The tokens and head of program ``(token block, b * H + h)``: ``(b, b * H + h, offs_n, offs_d, mask_d, mask,
    the block's offsets within one step of the contiguous ``[T, B, N, C]`` outputs, a step's size)``. It takes no
    pointer: PyTorch's analysis of the arguments a kernel writes (``torch.compile``) would count every pointer a
    helper takes as written where what it returns addresses a store
    (:func:`~snntrain.kernels.norm_neuron_base._ckpt_at`)."""
    pid_bh = tl.program_id(1)  # b * H + h
    h = pid_bh % H
    b = pid_bh // H
    C = H * D
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    mask = (offs_n < N)[:, None] & mask_d[None, :]
    out_offs = tl.cast(b, tl.int64) * N * C + tl.cast(offs_n, tl.int64)[:, None] * C + h * D + offs_d[None, :]
    return b, pid_bh, offs_n, offs_d, mask_d, mask, out_offs, tl.cast(B, tl.int64) * N * C


@triton.jit
def _bases(q_ptr, kv_ptr, b, pid_bh, H, D, sq_b):
    """Q's and KV's block pointers of program ``(token block, b * H + h)`` (read only)."""
    return q_ptr + tl.cast(b, tl.int64) * sq_b + (pid_bh % H) * D, kv_ptr + tl.cast(pid_bh, tl.int64) * D * D


@triton.jit(do_not_specialize=["T"])
def _ssa_fwd_kernel(
    q_ptr,  # [T, B, N, C] spikes; q[t, b, n, c] at t*sq_t + b*sq_b + n*sq_n + c
    kv_ptr,  # [T, B, H, D, D] fp32 from _kv_kernel
    k_ptr,  # [1] fp32 k = 1/tau, read when K_FROM_PTR (PLIF)
    s_ptr,  # [T, B, N, C] contiguous spikes out, dtype of q
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, N, C] fp32 membrane before chunk c (row c - 1), when STORE_CKPT
    T, B, N, H, D,
    sq_t, sq_b, sq_n,
    scale, k, v_threshold, v_reset,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    K_FROM_PTR: tl.constexpr,
    STORE_CKPT: tl.constexpr,
    PRECISION: tl.constexpr,
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per chunk
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # tokens and head channels of a program
):
    b, pid_bh, offs_n, offs_d, mask_d, mask, out_offs, step_size = _block(B, N, H, D, BLOCK_N, BLOCK_D)
    q_base, kv_base = _bases(q_ptr, kv_ptr, b, pid_bh, H, D, sq_b)
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    scale = tl.cast(scale, tl.float32)
    out_dtype = s_ptr.dtype.element_ty
    v = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32) + v_r
    # a loop over the steps, not unrolled: one product's operands staged in shared memory at a time
    for t_iter in range(T):
        t = tl.cast(t_iter, tl.int32)
        if STORE_CKPT:  # the membrane before each chunk after the first
            row = tl.cast(t // CHUNK - 1, tl.int64) * step_size
            tl.store(ckpt_ptr + row + out_offs, v, mask=mask & (t % CHUNK == 0) & (t > 0))
        y = _current(q_base, kv_base, t, B * H, offs_n, offs_d, mask, mask_d, sq_t, sq_n, D, scale, PRECISION)
        _h, spike, v = step(y, v, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA)
        tl.store(s_ptr + tl.cast(t, tl.int64) * step_size + out_offs, tl.where(spike, 1.0, 0.0).to(out_dtype),
                 mask=mask)


@triton.jit(do_not_specialize=["T"])
def _ssa_bwd_kernel(
    q_ptr,  # [T, B, N, C] forward spikes Q (strides sq_*)
    kv_ptr,  # [T, B, H, D, D] fp32
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, B, N, C] fp32 checkpoints of the forward
    k_ptr,  # [1] fp32 k, read when K_FROM_PTR
    gs_ptr,  # [T, B, N, C] dL/dS; gs[t, b, n, c] at t*sg_t + b*sg_b + n*sg_n + c
    gy_ptr,  # [T, B, N, C] contiguous dL/dy out (dL/d(scale Q KV)), dtype of q
    gk_part_ptr,  # [num programs] fp32 partial dL/dk, when STORE_GK
    T, B, N, H, D,
    sq_t, sq_b, sq_n, sg_t, sg_b, sg_n,
    scale, k, v_threshold, v_reset, alpha,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr,  # its gradient
    K_FROM_PTR: tl.constexpr, STORE_GK: tl.constexpr,
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr,  # the charge's rounding, steps per chunk
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,  # tokens and head channels of a program
):
    b, pid_bh, offs_n, offs_d, mask_d, mask, out_offs, step_size = _block(B, N, H, D, BLOCK_N, BLOCK_D)
    q_base, kv_base = _bases(q_ptr, kv_ptr, b, pid_bh, H, D, sq_b)
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    scale = tl.cast(scale, tl.float32)
    alpha = tl.cast(alpha, tl.float32)
    one_minus_k = 1.0 - k
    h = pid_bh % H
    gs_base = gs_ptr + tl.cast(b, tl.int64) * sg_b + h * D + tl.cast(offs_n, tl.int64)[:, None] * sg_n \
        + offs_d[None, :]
    out_dtype = gy_ptr.dtype.element_ty
    gv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    gk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    v0 = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32) + v_r
    n_chunks = tl.cdiv(T, CHUNK)
    for cc in range(n_chunks):
        c = n_chunks - 1 - tl.cast(cc, tl.int32)
        t0 = c * CHUNK
        v_ck = tl.load(ckpt_ptr + tl.cast(c - 1, tl.int64) * step_size + out_offs, mask=mask & (c > 0), other=0.0)
        v_start = tl.where(c > 0, v_ck, v0)
        # The chunk's currents and charged states recomputed (each current dead after its step unless PLIF's dL/dk
        # reads it), then the reverse-time scan over the chunk.
        v = v_start
        hs = ()
        ys = ()
        for j in tl.static_range(CHUNK):
            y = _current_fma(q_base, kv_base, t0 + j, B * H, offs_n, offs_d, offs_n < N, mask_d, sq_t, sq_n, D,
                             t0 + j < T, scale, BLOCK_N, BLOCK_D)
            h_t, _spike, v = step(y, v, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA)
            hs = hs + (h_t,)
            ys = ys + (y,)
        # dL/dS read step by step as the scan reaches it
        out = backward_scan(hs, ys, gs_base + tl.cast(t0, tl.int64) * sg_t, sg_t, ys, gv, gk, v_start, t0, T, mask,
                            k, one_minus_k, v_threshold, v_reset, v_r, alpha, LEAK, DECAY_INPUT, HARD_RESET,
                            DETACH_RESET, SURROGATE, 2, False, STORE_GK, CHUNK)
        gv, gk = out[CHUNK], out[CHUNK + 1]  # dL/dV before the chunk, PLIF's dL/dk so far
        for j in tl.static_range(CHUNK - 1, -1, -1):  # in the scan's order (fewer registers live)
            t = t0 + j
            tl.store(gy_ptr + tl.cast(t, tl.int64) * step_size + out_offs, out[j].to(out_dtype), mask=mask & (t < T))
    if STORE_GK:
        tl.store(gk_part_ptr + pid_bh * tl.num_programs(0) + tl.program_id(0), tl.sum(tl.sum(gk, axis=1), axis=0))


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _tokens(x: Tensor) -> tuple[Tensor, int, int, int]:
    """``(x, stride_t, stride_b, stride_n)`` of tokens ``[T, B, N, C]`` with dense channels (a copy otherwise)."""
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        x = x.contiguous()
    st, sb, sn = x.stride()[:3]
    return x, st, sb, sn


def _dims(x: Tensor, heads: int) -> tuple[int, int, int, int, int]:
    T, B, N, C = x.shape
    if C % heads:
        raise ValueError(f"{C} channels do not split into heads={heads}")
    if x.numel() > INT32_MAX * 4:
        raise ValueError(f"the attention's tokens have {x.numel()} elements; the kernels address at most "
                         f"{INT32_MAX * 4}")
    return T, B, N, heads, C // heads


def _block_d(D: int) -> int:
    return max(16, next_pow2(D))


def _precision(N: int) -> str:
    """The product's input precision: tf32 holds the counts of ``K^T V`` (at most N) exactly up to 2048."""
    return "tf32" if N <= 2048 else "ieee"


def _block_n(D: int, T: int, backward: bool = False) -> int:
    """Tokens per program of the product-neuron kernels."""
    tile = TILE // (4 if backward else 1) // (2 if backward and chunk_steps(T) > 4 else 1)
    return max(16, tile // _block_d(D))


def _kv_host(k: Tensor, v: Tensor, heads: int, launch: bool, wrap=direct) -> Tensor:
    T, B, N, H, D = _dims(k, heads)
    kv = torch.empty((T, B, H, D, D), dtype=torch.float32, device=k.device)
    if launch and kv.numel():
        k, sk_t, sk_b, sk_n = _tokens(k)
        v, sv_t, sv_b, sv_n = _tokens(v)
        wrap(_kv_kernel)[(T * B * H,)](k, v, kv, B, N, H, D, sk_t, sk_b, sk_n, sv_t, sv_b, sv_n,
                                       BLOCK_N=KV_BLOCK_N, BLOCK_D=_block_d(D), num_warps=WARPS)
    return kv


def _n_ckpt(T: int, flags: int) -> int:
    return max(cdiv(T, chunk_steps(T)) - 1, 0) if flags & F_SAVE_CKPT else 0


def _consts(flags: int) -> dict:
    return dict(LEAK=bool(flags & F_LEAK), DECAY_INPUT=bool(flags & F_DECAY_INPUT),
                HARD_RESET=bool(flags & F_HARD_RESET))


def _fwd_host(q: Tensor, kv: Tensor, k_tensor: Tensor | None, params: list[float], flags: int, heads: int,
              launch: bool, wrap=direct) -> tuple[Tensor, Tensor]:
    """``(spikes, checkpoints)``; ``params = [k, v_threshold, v_reset, alpha, scale]``."""
    T, B, N, H, D = _dims(q, heads)
    spikes = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    ckpt = torch.empty((_n_ckpt(T, flags), B, N, H * D), dtype=torch.float32, device=q.device)
    if launch and q.numel():
        q, sq_t, sq_b, sq_n = _tokens(q)
        kk, v_threshold, v_reset, _alpha, scale = params
        bn = _block_n(D, T)
        wrap(_ssa_fwd_kernel)[(cdiv(N, bn), B * H)](
            q, kv, k_tensor, spikes, ckpt, T, B, N, H, D, sq_t, sq_b, sq_n, scale, kk, v_threshold, v_reset,
            **_consts(flags), K_FROM_PTR=k_tensor is not None, STORE_CKPT=ckpt.shape[0] > 0, NO_FMA=NO_FMA,
            PRECISION=_precision(N), CHUNK=chunk_steps(T), BLOCK_N=bn, BLOCK_D=_block_d(D), num_warps=WARPS,
        )
    return spikes, ckpt


def _bwd_host(q: Tensor, kv: Tensor, ckpt: Tensor, k_tensor: Tensor | None, grad_spikes: Tensor,
              params: list[float], flags: int, heads: int, launch: bool, wrap=direct) -> tuple[Tensor, Tensor]:
    """``(dL/dy, dL/dk)``: the gradient of the attention current ``y = scale Q KV`` (dtype of q) and, with
    F_GRAD_K, of PLIF's ``k`` (empty otherwise)."""
    T, B, N, H, D = _dims(q, heads)
    need_k = bool(flags & F_GRAD_K) and k_tensor is not None
    grad_y = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    grad_k = torch.empty(k_tensor.shape if need_k else (0,), dtype=torch.float32, device=q.device)
    if not launch:
        return grad_y, grad_k
    if not q.numel():
        if need_k:
            grad_k.zero_()
        return grad_y, grad_k
    q, sq_t, sq_b, sq_n = _tokens(q)
    gs, sg_t, sg_b, sg_n = _tokens(grad_spikes)
    bn = _block_n(D, T, backward=True)
    grid = (cdiv(N, bn), B * H)
    gk_part = torch.empty((grid[0] * grid[1],), dtype=torch.float32, device=q.device)
    kk, v_threshold, v_reset, alpha, scale = params
    wrap(_ssa_bwd_kernel)[grid](
        q, kv, ckpt, k_tensor, gs, grad_y, gk_part, T, B, N, H, D, sq_t, sq_b, sq_n, sg_t, sg_b, sg_n,
        scale, kk, v_threshold, v_reset, alpha, **_consts(flags), DETACH_RESET=bool(flags & F_DETACH_RESET),
        SURROGATE=(flags >> F_SURROGATE_SHIFT) & 3, K_FROM_PTR=k_tensor is not None, STORE_GK=need_k, NO_FMA=NO_FMA,
        CHUNK=chunk_steps(T), BLOCK_N=bn, BLOCK_D=_block_d(D), num_warps=WARPS,
    )
    if need_k:
        wrap(sum_kernel)[(1,)](gk_part, grad_k, gk_part.numel(), BLOCK=SUM_BLOCK, num_warps=4)
    return grad_y, grad_k


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _kv_op(k: Tensor, v: Tensor, heads: int) -> Tensor:
    """``K^T V`` per head and step, ``[T, B, H, D, D]`` float32."""
    return _kv_host(k, v, heads, True, op_wrap)


def _kv_fake(k, v, heads):
    return _kv_host(k, v, heads, False)


def _fwd_op(q: Tensor, kv: Tensor, k_tensor: Tensor | None, params: list[float], flags: int,
            heads: int) -> tuple[Tensor, Tensor]:
    """``(spikes, checkpoints)`` of ``neuron(scale Q KV)``."""
    return _fwd_host(q, kv, k_tensor, params, flags, heads, True, op_wrap)


def _fwd_fake(q, kv, k_tensor, params, flags, heads):
    return _fwd_host(q, kv, k_tensor, params, flags, heads, False)


def _bwd_op(q: Tensor, kv: Tensor, ckpt: Tensor, k_tensor: Tensor | None, grad_spikes: Tensor, params: list[float],
            flags: int, heads: int) -> tuple[Tensor, Tensor]:
    """``(dL/dy, dL/dk)``."""
    return _bwd_host(q, kv, ckpt, k_tensor, grad_spikes, params, flags, heads, True, op_wrap)


def _bwd_fake(q, kv, ckpt, k_tensor, grad_spikes, params, flags, heads):
    return _bwd_host(q, kv, ckpt, k_tensor, grad_spikes, params, flags, heads, False)


spike_kv_op = register_op("snntrain::spike_kv", _kv_op, _kv_fake)
ssa_neuron_fwd = register_op("snntrain::ssa_neuron_fwd", _fwd_op, _fwd_fake)
ssa_neuron_bwd = register_op("snntrain::ssa_neuron_bwd", _bwd_op, _bwd_fake)


def _heads(x: Tensor, heads: int) -> Tensor:
    """Tokens ``[T, B, N, C]`` as ``[T, B, H, N, D]`` (a view)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(2, 3)


def _tokens_of(x: Tensor) -> Tensor:
    """``[T, B, H, N, D]`` back to tokens ``[T, B, N, C]``."""
    return x.transpose(2, 3).flatten(-2)


def _kv_setup_context(ctx, inputs, output) -> None:
    k, v, heads = inputs
    ctx.save_for_backward(k, v)
    ctx.heads = heads


def _kv_backward(ctx, grad_kv):
    k, v = ctx.saved_tensors
    if grad_kv is None:
        return None, None, None
    g = grad_kv.to(k.dtype)
    grad_k = _tokens_of(_heads(v, ctx.heads) @ g.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
    grad_v = _tokens_of(_heads(k, ctx.heads) @ g) if ctx.needs_input_grad[1] else None
    return grad_k, grad_v, None


spike_kv_op.register_autograd(_kv_backward, setup_context=_kv_setup_context)


def _setup_context(ctx, inputs, output) -> None:
    q, kv, k_tensor, params, flags, heads = inputs
    _spikes, ckpt = output
    ctx.save_for_backward(q, kv, ckpt, k_tensor)
    ctx.params, ctx.flags, ctx.heads = params, flags, heads
    ctx.mark_non_differentiable(ckpt)


def _backward(ctx, grad_spikes, _grad_ckpt, bwd=None):
    q, kv, ckpt, k_tensor = ctx.saved_tensors
    need_q, need_kv, need_k = ctx.needs_input_grad[:3]
    if grad_spikes is None or not (need_q or need_kv or need_k):
        return None, None, None, None, None, None
    flags = ctx.flags | (F_GRAD_K if need_k else 0)
    grad_y, grad_k = (bwd or ssa_neuron_bwd)(q, kv, ckpt, k_tensor, grad_spikes, ctx.params, flags, ctx.heads)
    scale, heads = ctx.params[4], ctx.heads
    gy = _heads(grad_y, heads)
    grad_q = _tokens_of(gy @ kv.to(gy.dtype).transpose(-1, -2)) * scale if need_q else None
    grad_kv = (_heads(q, heads).transpose(-1, -2) @ gy).float() * scale if need_kv else None
    return grad_q, grad_kv, grad_k if need_k else None, None, None, None


ssa_neuron_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(*args):
    with profiled("snntrain::ssa_neuron_bwd"):
        return _bwd_host(*args, launch=True)


# The same forwards and backwards as the registered ops, launched without the operator machinery.
_EagerKV = eager_function("snntrain::spike_kv", functools.partial(_kv_host, launch=True), _kv_setup_context,
                          _kv_backward)
_EagerSSA = eager_function("snntrain::ssa_neuron_fwd", functools.partial(_fwd_host, launch=True), _setup_context,
                           functools.partial(_backward, bwd=_eager_bwd))


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------


def _check(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must be tokens [T, B, N, C] of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in FLOAT_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; the Triton attention kernels take one "
                        "of float32, float16, bfloat16 (use backend='torch' for others)")


def spike_kv(k: Tensor, v: Tensor, heads: int) -> Tensor:
    """``K^T V`` per head and step of spike tokens ``[T, B, N, C]``: ``[T, B, H, D, D]`` float32 (exact counts),
    differentiable in ``k`` and ``v``."""
    _check(k, k, v)
    fn = spike_kv_op if traced(k, v) else _EagerKV.apply
    return fn(k, v, heads)


def ssa_neuron(
    q: Tensor, k: Tensor, v: Tensor, heads: int, scale: float, *, kind: str, tau: float = 2.0,
    w: Tensor | None = None, v_threshold: float = 1.0, v_reset: float | None = 0.0, decay_input: bool = True,
    detach_reset: bool = False, surrogate: str = "sigmoid", alpha: float = 4.0,
) -> Tensor:
    """Spikes ``[T, B, N, C]`` (dtype of ``q``) of an IF/LIF/PLIF neuron (``kind``) driven by ``scale * Q K^T V`` per
    head, the product computed in registers. Differentiable in ``q``, ``k``, ``v`` and PLIF's ``w``. Neuron
    arguments are expected to be validated already (``NeuronParams``)."""
    _check(q, k, v)
    if q.shape[-1] % heads:
        raise ValueError(f"{q.shape[-1]} channels do not split into heads={heads}")
    flags, kk, k_tensor = neuron_flags(kind, tau, w, v_reset, decay_input, detach_reset, surrogate)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (k_tensor is not None and k_tensor.requires_grad)):
        flags |= F_SAVE_CKPT
    params = [float(kk), float(v_threshold), 0.0 if v_reset is None else float(v_reset), float(alpha), float(scale)]
    if traced(q, k, v, k_tensor):
        kv = spike_kv_op(k, v, heads)
        spikes, _ckpt = ssa_neuron_fwd(q, kv, k_tensor, params, flags, heads)
    else:
        kv = _EagerKV.apply(k, v, heads)
        spikes, _ckpt = _EagerSSA.apply(q, kv, k_tensor, params, flags, heads)
    return spikes
