"""Multi-step IF/LIF/PLIF neurons in Triton: a forward scan and a hand-written backward scan.

Registered as ``torch.ops.snntrain.neuron_fwd`` and ``torch.ops.snntrain.neuron_bwd``
(``torch.library.triton_op``) with autograd, so they show by name in profiler traces,
trace under ``torch.compile(fullgraph=True)`` and never synchronise with the host.
The dynamics and every option follow the PyTorch reference
(the torch backend, ``snntrain.nn.functional``); nothing here imports from ``snntrain.nn``.

Design: what the forward saves for the backward
-----------------------------------------------
Each program owns ``BLOCK`` neurons and scans over ``T`` with the membrane state in
fp32 registers. Per element-step the minimal algorithm of the benchmark harness moves
five tensors of the input's size: the forward reads X and writes S, the loss reads S,
the backward reads X (or a saved state of that size) and writes dX; the incoming dS of
``y.sum().backward()`` is an expanded (stride-0) tensor, read as one scalar per step.
That is 20 B per element-step for fp32 input and 10 B for fp16/bf16.

Three ways to give the backward what it needs (H_t, the charged membrane):

* save H in fp32, as SpikingJelly does: +4 B per element-step, 24 B = 1.20x the
  minimal bytes for fp32 (1.40x for 16-bit input) before any other cost;
* save H - v_threshold rounded to 16 bits: exactly the minimal bytes, but inexact
  surrogate gradients and a sign-of-zero hazard on the spike decision;
* chosen: checkpointed recomputation. The forward also stores the fp32 state V at
  the start of every chunk of ``CHUNK`` = 8 steps except the first (the first
  chunk starts from ``v_init`` or the reset value, which the backward rebuilds).
  The backward walks the chunks in reverse: it reloads the chunk's checkpoint,
  re-reads the chunk's X rows and recomputes H for those steps in registers (a
  tuple of 8 values, unrolled with ``tl.static_range``), then runs the reverse-time
  scan over the chunk. Forward and recomputation use the same ``@triton.jit`` step
  functions (:mod:`snntrain.kernels.neuron_step`), and the charge's multiply is an
  explicitly rounded ``mul.rn.f32`` (never contracted into an FMA), so the recomputed
  spikes equal the forward's bit for bit, and the reference's too.

  Cost: 4 B written and 4 B read per neuron every 8 steps, at most 1 B per
  element-step and none for T <= 8. fp32 at T=32 moves 20.75 B per element-step
  (1.04x the minimal bytes), 16-bit input 10.75 B (1.075x). The forward writes
  nothing else unless asked: the final state only with ``return_state``, the fp32
  membrane trace only with ``return_membrane``, checkpoints only when a gradient is
  needed. For T <= 4 the chunk is 4 steps (``SHORT_CHUNK``, one more compiled
  variant) so that T=4 computes no padded steps; otherwise T is a runtime argument
  (``do_not_specialize``) and one compiled kernel serves every T.

Within a chunk all loads are issued before the first store (a load cannot be moved
above a store to a pointer that may alias it), so each thread keeps a chunk's loads
in flight at once.

The backward is one kernel. dL/dX is written in the input's dtype; PLIF's dL/dk
(k = 1/tau = sigmoid(w)) is reduced per program into a partial-sum buffer, then
summed in a fixed order by a one-program kernel: deterministic, no float atomics;
autograd carries it through ``sigmoid`` to ``w``. The gradient of the initial state is
written when ``v_init`` requires it; gradients of the final state and of the membrane
trace are read when they exist.

Layouts: X is addressed as ``x[t, n] = x_ptr + t*stride_t + n*stride_n``, which covers
contiguous tensors, a stride-0 (expanded) time axis, time-minor layouts such as a
transposed ``[N, T]`` tensor, and inner dimensions that form one strided run (e.g.
every other element). Inner dims that are dense in another order (channels-last maps,
``[T, B, C, H, W]`` with C fastest) are read in place with the neurons numbered in memory
order, and every output and gradient gets the input's layout (``_neuron_order``), so a
channels-last network never transposes around a neuron. Other inner layouts are copied
once. The gradient of the spikes uses the same addressing and has a scalar mode for a
gradient that is constant over neurons. Outputs are otherwise contiguous.

Under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests without a
GPU) the operators are registered with ``torch.library.custom_op`` instead, since an
interpreted kernel cannot be traced into a graph; the kernels are the same
(:mod:`snntrain.kernels.op_utils`).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .neuron_step import (
    CHUNK,
    F_DECAY_INPUT,
    F_DETACH_RESET,
    F_GRAD_K,
    F_GRAD_V_INIT,
    F_GRAD_X,
    F_HARD_RESET,
    F_LEAK,
    F_RETURN_MEMBRANE,
    F_RETURN_STATE,
    F_SAVE_CKPT,
    F_SURROGATE_SHIFT,
    NO_FMA,
    SUM_BLOCK,
    SURROGATES,
    chunk_backward,
    chunk_steps,
    neuron_flags,
    scalars,
    step,
    sum_kernel,
)
from .op_utils import FLOAT_DTYPES, INT32_MAX, direct, eager_function, op_wrap, profiled, register_op, traced

__all__ = ["SURROGATES", "CHUNK", "neuron_multistep", "neuron_flags", "neuron_fwd", "neuron_bwd"]

# Launch configuration: BLOCK neurons per program, num_warps warps. The forward
# keeps one state per neuron; the backward also keeps CHUNK charged states (and X
# for PLIF) per neuron in registers, so it uses smaller blocks. Chosen from a sweep on
# an H200 at [32, 64, 65536] (scripts/bench_neurons.py --sweep, docs/experiments.md):
# fwd 512/4 was best for fp32 and bf16; bwd 256/4 for fp32, 512/8 for 16-bit input.
FWD_BLOCK, FWD_WARPS = 512, 4
BWD_BLOCK, BWD_WARPS = 256, 4
BWD16_BLOCK, BWD16_WARPS = 512, 8


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


@triton.jit
def _start(k_ptr, k, v_threshold, v_reset, v_init_ptr, offs, mask, K_FROM_PTR: tl.constexpr,
           HARD_RESET: tl.constexpr, HAS_V_INIT: tl.constexpr, BLOCK: tl.constexpr):
    """:func:`~snntrain.kernels.neuron_step.scalars` and the initial state of a block."""
    k, v_threshold, v_reset, v_r = scalars(k_ptr, k, v_threshold, v_reset, K_FROM_PTR, HARD_RESET)
    if HAS_V_INIT:
        v = tl.load(v_init_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        v = tl.zeros([BLOCK], dtype=tl.float32) + v_r
    return k, v_threshold, v_reset, v_r, v


@triton.jit
def _block_start(k_ptr, k, v_threshold, v_reset, v_init_ptr, N, K_FROM_PTR: tl.constexpr, HARD_RESET: tl.constexpr,
                 HAS_V_INIT: tl.constexpr, BLOCK: tl.constexpr):
    """The neurons of this program (offsets and mask), then :func:`_start`'s scalars and initial state."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    k, v_threshold, v_reset, v_r, v = _start(k_ptr, k, v_threshold, v_reset, v_init_ptr, offs, mask, K_FROM_PTR,
                                             HARD_RESET, HAS_V_INIT, BLOCK)
    return offs, mask, k, v_threshold, v_reset, v_r, v


@triton.jit(do_not_specialize=["T"])
def _neuron_fwd_kernel(
    x_ptr,  # [T, N] input (fp32/fp16/bf16); x[t, n] at t*stride_xt + n*stride_xn
    k_ptr,  # [1] fp32 k = 1/tau, read when K_FROM_PTR (PLIF: sigmoid(w))
    v_init_ptr,  # [N] fp32 initial state, read when HAS_V_INIT
    s_ptr,  # [T, N] contiguous spikes out, dtype of x
    v_final_ptr,  # [N] fp32 state after the last step, written when STORE_V_FINAL
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, N] fp32: row c-1 = state before chunk c; when STORE_CKPT
    v_seq_ptr,  # [T, N] contiguous fp32 state after each step's reset, when STORE_V_SEQ
    T,
    N,
    stride_xt,
    stride_xn,
    k,
    v_threshold,
    v_reset,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    K_FROM_PTR: tl.constexpr,
    HAS_V_INIT: tl.constexpr,
    STORE_V_FINAL: tl.constexpr, STORE_CKPT: tl.constexpr, STORE_V_SEQ: tl.constexpr,  # the outputs written
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,  # the charge's rounding, steps per chunk, neurons
):
    offs, mask, k, v_threshold, v_reset, v_r, v = _block_start(k_ptr, k, v_threshold, v_reset, v_init_ptr, N,
                                                                K_FROM_PTR, HARD_RESET, HAS_V_INIT, BLOCK)
    x_base = x_ptr + offs * stride_xn
    out_dtype = s_ptr.dtype.element_ty
    n_chunks = tl.cdiv(T, CHUNK)
    for c_iter in range(n_chunks):
        c = tl.cast(c_iter, tl.int32)  # a tensor also where the loop yields Python ints (interpreter)
        t0 = c * CHUNK
        if STORE_CKPT:
            row = tl.cast(c - 1, tl.int64) * N
            tl.store(ckpt_ptr + row + offs, v, mask=offs < tl.where(c > 0, N, 0))
        # Issue the chunk's loads before its first store (the compiler cannot move a load
        # above a store to a pointer that might alias it).
        xs = ()
        for j in tl.static_range(CHUNK):
            m = offs < tl.where(t0 + j < T, N, 0)  # the neuron mask, empty past the last step
            xs = xs + (tl.load(x_base + tl.cast(t0 + j, tl.int64) * stride_xt, mask=m, other=0.0),)
        for j in tl.static_range(CHUNK):
            t = t0 + j
            valid = t < T
            m = offs < tl.where(valid, N, 0)
            t64 = tl.cast(t, tl.int64)
            x = xs[j].to(tl.float32)
            _h, spike, v_new = step(x, v, k, v_r, v_threshold, v_reset, LEAK, DECAY_INPUT, HARD_RESET, NO_FMA)
            tl.store(s_ptr + t64 * N + offs, tl.where(spike, 1.0, 0.0).to(out_dtype), mask=m)
            if STORE_V_SEQ:
                tl.store(v_seq_ptr + t64 * N + offs, v_new, mask=m)
            v = tl.where(valid, v_new, v)
    if STORE_V_FINAL:
        tl.store(v_final_ptr + offs, v, mask=mask)



@triton.jit(do_not_specialize=["T"])
def _neuron_bwd_kernel(
    x_ptr,  # [T, N] forward input; x[t, n] at t*stride_xt + n*stride_xn
    ckpt_ptr,  # [cdiv(T, CHUNK) - 1, N] fp32 checkpoints written by the forward
    v_init_ptr,  # [N] fp32 initial state, read when HAS_V_INIT
    k_ptr,  # [1] fp32 k, read when K_FROM_PTR
    gs_ptr,  # [T, N] dL/dS; GS_MODE 1: at t*stride_gt + n*stride_gn; 2: one value per step at t*stride_gt
    gvf_ptr,  # [N] dL/dV_final at n*stride_gvf, read when HAS_GVF
    gvseq_ptr,  # [T, N] dL/dV_seq at t*stride_gqt + n*stride_gqn, read when HAS_GVSEQ
    gx_ptr,  # [T, N] contiguous dL/dX out, dtype of x, written when STORE_GX
    gv_init_ptr,  # [N] fp32 dL/dv_init out, written when STORE_GV_INIT
    gk_part_ptr,  # [num_programs] fp32 per-program partial dL/dk, written when STORE_GK
    T,
    N,
    stride_xt,
    stride_xn,
    stride_gt,
    stride_gn,
    stride_gvf,
    stride_gqt,
    stride_gqn,
    k,
    v_threshold,
    v_reset,
    alpha,
    LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,  # the neuron (F_* flags)
    DETACH_RESET: tl.constexpr, SURROGATE: tl.constexpr,  # its gradient
    K_FROM_PTR: tl.constexpr,
    HAS_V_INIT: tl.constexpr,
    GS_MODE: tl.constexpr,
    HAS_GVF: tl.constexpr, HAS_GVSEQ: tl.constexpr,  # the gradients read
    STORE_GX: tl.constexpr, STORE_GV_INIT: tl.constexpr, STORE_GK: tl.constexpr,  # the gradients written
    NO_FMA: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,  # the charge's rounding, steps per chunk, neurons
):
    offs, mask, k, v_threshold, v_reset, v_r, v0 = _block_start(k_ptr, k, v_threshold, v_reset, v_init_ptr, N,
                                                                 K_FROM_PTR, HARD_RESET, HAS_V_INIT, BLOCK)
    alpha = tl.cast(alpha, tl.float32)
    one_minus_k = 1.0 - k
    if HAS_GVF:
        gv = tl.load(gvf_ptr + offs * stride_gvf, mask=mask, other=0.0).to(tl.float32)
    else:
        gv = tl.zeros([BLOCK], dtype=tl.float32)
    gk = tl.zeros([BLOCK], dtype=tl.float32)
    x_base = x_ptr + offs * stride_xn
    if GS_MODE == 1:
        gs_base = gs_ptr + offs * stride_gn
    if HAS_GVSEQ:
        gq_base = gvseq_ptr + offs * stride_gqn
    out_dtype = gx_ptr.dtype.element_ty
    n_chunks = tl.cdiv(T, CHUNK)
    for cc in range(n_chunks):
        c = n_chunks - 1 - tl.cast(cc, tl.int32)
        t0 = c * CHUNK
        # State before the chunk: a checkpoint, or the initial state for chunk 0.
        v_ck = tl.load(ckpt_ptr + tl.cast(c - 1, tl.int64) * N + offs, mask=offs < tl.where(c > 0, N, 0), other=0.0)
        v_start = tl.where(c > 0, v_ck, v0)
        # Load the chunk's inputs and incoming gradients before the first store of dX (loads cannot pass
        # stores), recompute its charged states H in registers, then run the reverse-time scan over it.
        xs = ()
        gss = ()
        gqs = ()
        for j in tl.static_range(CHUNK):
            t64 = tl.cast(t0 + j, tl.int64)
            m = offs < tl.where(t0 + j < T, N, 0)
            xs = xs + (tl.load(x_base + t64 * stride_xt, mask=m, other=0.0).to(tl.float32),)
            if GS_MODE == 1:
                gss = gss + (tl.load(gs_base + t64 * stride_gt, mask=m, other=0.0),)
            elif GS_MODE == 2:
                gss = gss + (tl.load(gs_ptr + t64 * stride_gt, mask=t0 + j < T, other=0.0),)
            if HAS_GVSEQ:
                gqs = gqs + (tl.load(gq_base + t64 * stride_gqt, mask=m, other=0.0),)
        if GS_MODE == 0:
            gss = xs  # not read
        if not HAS_GVSEQ:
            gqs = xs  # not read
        out = chunk_backward(xs, v_start, gss, gqs, gv, gk, t0, T, mask, k, one_minus_k, v_threshold, v_reset, v_r, alpha,
                             LEAK, DECAY_INPUT, HARD_RESET, DETACH_RESET, SURROGATE, 0 if GS_MODE == 0 else 1, HAS_GVSEQ,
                             STORE_GK, NO_FMA, CHUNK)
        gv, gk = out[CHUNK], out[CHUNK + 1]  # dL/dV before the chunk, PLIF's dL/dk so far
        if STORE_GX:
            for j in tl.static_range(CHUNK - 1, -1, -1):  # in the scan's order (fewer registers live)
                m = offs < tl.where(t0 + j < T, N, 0)
                tl.store(gx_ptr + tl.cast(t0 + j, tl.int64) * N + offs, out[j].to(out_dtype), mask=m)
    if STORE_GV_INIT:
        tl.store(gv_init_ptr + offs, gv, mask=mask)
    if STORE_GK:
        tl.store(gk_part_ptr + tl.program_id(0), tl.sum(gk, axis=0))


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _single_stride(shape, strides) -> int | None:
    """The stride s that addresses element i (row-major) of a tensor at ``i * s``, or None if there is none."""
    s = None
    run = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1:
            if s is None:
                s = stride
            elif stride != s * run:
                return None
            run *= size
    return 1 if s is None else s


def _neuron_order(x: Tensor, v_init: Tensor | None) -> tuple[int, ...]:
    """The order of ``x``'s inner dims (dims 1..) in which the kernels number the neurons.

    Row-major unless ``x``'s inner dims are dense in another order (a channels-last map
    ``[T, B, C, H, W]`` with strides ``(., HWC, 1, WC, C)``): then the neurons are numbered
    in memory order, ``x`` is read in place and every output and gradient is laid out like
    it, so the next convolution reads channels-last without a transpose. Forward and backward
    compute the same order from the same ``x``."""
    key = (tuple(x.shape[1:]), tuple(x.stride()[1:]), None if v_init is None else tuple(v_init.shape))
    try:
        return _order_cached(*key)  # a few microseconds of host time per call, saved
    except TypeError:  # symbolic sizes while tracing are not hashable
        return _order(*key)


def _order(shape, strides, v_init_shape) -> tuple[int, ...]:
    identity = tuple(range(len(shape)))
    if _single_stride(shape, strides) is not None:
        return identity
    if v_init_shape is not None and v_init_shape != tuple(shape):
        return identity
    order = tuple(sorted(identity, key=lambda d: -strides[d] if shape[d] != 1 else 0))
    if _single_stride([shape[d] for d in order], [strides[d] for d in order]) is None:
        return identity
    return order


_order_cached = functools.lru_cache(maxsize=1024)(_order)


def _permuted(t: Tensor, order: tuple[int, ...], lead: int) -> Tensor:
    """``t`` with its dims after the first ``lead`` permuted into ``order`` (a view)."""
    if order == tuple(range(len(order))):
        return t
    return t.permute(*range(lead), *[lead + d for d in order])


def _empty(shape, order: tuple[int, ...], lead: int, dtype: torch.dtype, dev) -> Tensor:
    """An uninitialised tensor of ``shape`` whose dims after the first ``lead`` are laid out in ``order``."""
    shape = list(shape)
    if order == tuple(range(len(order))) or len(shape) != lead + len(order):
        return torch.empty(shape, dtype=dtype, device=dev)
    inner = shape[lead:]
    t = torch.empty(shape[:lead] + [inner[d] for d in order], dtype=dtype, device=dev)
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    return t.permute(*range(lead), *[lead + i for i in inverse])


def _time_major(t: Tensor, order: tuple[int, ...] | None = None) -> tuple[Tensor, int, int]:
    """``(tensor, stride_t, stride_n)`` addressing ``t`` ``[T, ...]`` as ``[T, N]`` with the neurons
    numbered in ``order`` (row-major when None); copies only odd layouts."""
    if order is not None:
        t = _permuted(t, order, 1)
    if t.is_contiguous():
        return t, math.prod(t.shape[1:]), 1
    stride = t.stride()
    stride_n = _single_stride(t.shape[1:], stride[1:])
    # The kernels form n * stride_n in 32 bits.
    if stride_n is None or (math.prod(t.shape[1:]) - 1) * stride_n > INT32_MAX:
        t = t.contiguous()
        return t, math.prod(t.shape[1:]), 1
    return t, stride[0], stride_n



def _fwd_host(x: Tensor, v_init: Tensor | None, k_tensor: Tensor | None, params: list[float], flags: int,
              launch: bool, wrap=direct, eager: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Allocate the outputs and launch the forward. The registered op returns empty tensors for
    outputs that were not asked for; the ``eager`` path returns None there (fewer allocations)."""
    T = x.shape[0]
    N = math.prod(x.shape[1:])
    if N > INT32_MAX:
        raise ValueError(f"a time step has {N} neurons; the Triton neuron kernels support at most {INT32_MAX}")
    dev = x.device
    return_state = bool(flags & F_RETURN_STATE)
    return_membrane = bool(flags & F_RETURN_MEMBRANE)
    chunk = chunk_steps(T)
    n_ckpt = max((T + chunk - 1) // chunk - 1, 0) if flags & F_SAVE_CKPT else 0
    order = _neuron_order(x, v_init)
    spikes = _empty(x.shape, order, 1, x.dtype, dev)
    ckpt = torch.empty((n_ckpt, N), dtype=torch.float32, device=dev)
    if eager:
        v_final = _empty(x.shape[1:], order, 0, torch.float32, dev) if return_state else None
        v_seq = _empty(x.shape, order, 1, torch.float32, dev) if return_membrane else None
    else:
        v_final = _empty(x.shape[1:] if return_state else (0,), order, 0, torch.float32, dev)
        v_seq = _empty(x.shape if return_membrane else (0,), order, 1, torch.float32, dev)
    if launch and N > 0:
        xk, stride_xt, stride_xn = _time_major(x, order)
        if v_init is not None:
            v_init = _permuted(v_init, order, 0).contiguous()
        k, v_threshold, v_reset, _alpha = params
        wrap(_neuron_fwd_kernel)[((N + FWD_BLOCK - 1) // FWD_BLOCK,)](
            xk, k_tensor, v_init,
            spikes, v_final, ckpt, v_seq,
            T, N, stride_xt, stride_xn, k, v_threshold, v_reset,
            LEAK=bool(flags & F_LEAK), DECAY_INPUT=bool(flags & F_DECAY_INPUT),
            HARD_RESET=bool(flags & F_HARD_RESET), K_FROM_PTR=k_tensor is not None, HAS_V_INIT=v_init is not None,
            STORE_V_FINAL=return_state, STORE_CKPT=n_ckpt > 0, STORE_V_SEQ=return_membrane,
            NO_FMA=NO_FMA, CHUNK=chunk, BLOCK=FWD_BLOCK, num_warps=FWD_WARPS,
        )
    return spikes, v_final, ckpt, v_seq


def _bwd_host(x: Tensor, ckpt: Tensor, v_init: Tensor | None, k_tensor: Tensor | None, grad_spikes: Tensor | None,
              grad_v_final: Tensor | None, grad_v_seq: Tensor | None, params: list[float], flags: int,
              launch: bool, wrap=direct, eager: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    T = x.shape[0]
    N = math.prod(x.shape[1:])
    dev = x.device
    need_x = bool(flags & F_GRAD_X)
    need_v = bool(flags & F_GRAD_V_INIT) and v_init is not None
    need_k = bool(flags & F_GRAD_K) and k_tensor is not None
    order = _neuron_order(x, v_init)
    # the kernel takes its output dtype from grad_x: always pass a tensor
    grad_x = _empty(x.shape if need_x else (0,), order, 1, x.dtype, dev)
    if eager:
        grad_v_init = _empty(x.shape[1:], order, 0, torch.float32, dev) if need_v else None
        grad_k = torch.empty(k_tensor.shape, dtype=torch.float32, device=dev) if need_k else None
    else:
        grad_v_init = _empty(x.shape[1:] if need_v else (0,), order, 0, torch.float32, dev)
        grad_k = torch.empty(k_tensor.shape if need_k else (0,), dtype=torch.float32, device=dev)
    if not launch:
        return grad_x, grad_v_init, grad_k
    if N == 0:
        if need_k:
            grad_k.zero_()
        return grad_x, grad_v_init, grad_k
    xk, stride_xt, stride_xn = _time_major(x, order)
    if v_init is not None:
        v_init = _permuted(v_init, order, 0).contiguous()
    gs_mode, gs, stride_gt, stride_gn = 0, None, 0, 0
    if grad_spikes is not None:
        gs, stride_gt, stride_gn = _time_major(grad_spikes, order)
        gs_mode = 2 if stride_gn == 0 else 1  # 2: one value per step (an expanded gradient)
    gvf, stride_gvf = None, 0
    if grad_v_final is not None:
        gvf = _permuted(grad_v_final, order, 0)
        stride_gvf = _single_stride(gvf.shape, gvf.stride())
        if stride_gvf is None:
            gvf, stride_gvf = gvf.contiguous(), 1
    gq, stride_gqt, stride_gqn = None, 0, 0
    if grad_v_seq is not None:
        gq, stride_gqt, stride_gqn = _time_major(grad_v_seq, order)
    block, warps = (BWD_BLOCK, BWD_WARPS) if x.element_size() == 4 else (BWD16_BLOCK, BWD16_WARPS)
    grid_n = (N + block - 1) // block
    gk_part = torch.empty((grid_n,), dtype=torch.float32, device=dev) if need_k or not eager else None
    k, v_threshold, v_reset, alpha = params
    wrap(_neuron_bwd_kernel)[(grid_n,)](
        xk, ckpt, v_init, k_tensor,
        gs, gvf, gq, grad_x, grad_v_init, gk_part,
        T, N, stride_xt, stride_xn, stride_gt, stride_gn, stride_gvf, stride_gqt, stride_gqn,
        k, v_threshold, v_reset, alpha,
        LEAK=bool(flags & F_LEAK), DECAY_INPUT=bool(flags & F_DECAY_INPUT), HARD_RESET=bool(flags & F_HARD_RESET),
        DETACH_RESET=bool(flags & F_DETACH_RESET), SURROGATE=(flags >> F_SURROGATE_SHIFT) & 3,
        K_FROM_PTR=k_tensor is not None, HAS_V_INIT=v_init is not None,
        GS_MODE=gs_mode, HAS_GVF=grad_v_final is not None, HAS_GVSEQ=grad_v_seq is not None,
        STORE_GX=need_x, STORE_GV_INIT=need_v, STORE_GK=need_k,
        NO_FMA=NO_FMA, CHUNK=chunk_steps(T), BLOCK=block, num_warps=warps,
    )
    if need_k:
        wrap(sum_kernel)[(1,)](gk_part, grad_k, grid_n, BLOCK=SUM_BLOCK, num_warps=4)
    return grad_x, grad_v_init, grad_k


# ----------------------------------------------------------------------------
# Operator registration
# ----------------------------------------------------------------------------


def _neuron_fwd(
    x: Tensor, v_init: Tensor | None, k_tensor: Tensor | None, params: list[float], flags: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(spikes [T, ...], v_final, checkpoints, v_seq)``; ``v_final``/``v_seq`` are empty unless
    F_RETURN_STATE/F_RETURN_MEMBRANE, checkpoints empty unless F_SAVE_CKPT and T > CHUNK."""
    return _fwd_host(x, v_init, k_tensor, params, flags, launch=True, wrap=op_wrap)


def _neuron_fwd_fake(x, v_init, k_tensor, params, flags):
    return _fwd_host(x, v_init, k_tensor, params, flags, launch=False)


def _neuron_bwd(
    x: Tensor,
    ckpt: Tensor,
    v_init: Tensor | None,
    k_tensor: Tensor | None,
    grad_spikes: Tensor | None,
    grad_v_final: Tensor | None,
    grad_v_seq: Tensor | None,
    params: list[float],
    flags: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dL/dx, dL/dv_init, dL/dk)``, each empty unless F_GRAD_X/F_GRAD_V_INIT/F_GRAD_K."""
    return _bwd_host(x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, params, flags, launch=True,
                     wrap=op_wrap)


def _neuron_bwd_fake(x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, params, flags):
    return _bwd_host(x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, params, flags, launch=False)


neuron_fwd = register_op("snntrain::neuron_fwd", _neuron_fwd, _neuron_fwd_fake)
neuron_bwd = register_op("snntrain::neuron_bwd", _neuron_bwd, _neuron_bwd_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, v_init, k_tensor, params, flags = inputs
    _spikes, v_final, ckpt, v_seq = output
    ctx.save_for_backward(x, ckpt, v_init, k_tensor)
    ctx.params, ctx.flags = params, flags
    # Unused outputs get None instead of zero-filled gradients.
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(ckpt)
    if not flags & F_RETURN_STATE and v_final is not None:
        ctx.mark_non_differentiable(v_final)
    if not flags & F_RETURN_MEMBRANE and v_seq is not None:
        ctx.mark_non_differentiable(v_seq)


def _backward(ctx, grad_spikes, grad_v_final, _grad_ckpt, grad_v_seq, bwd=None):
    x, ckpt, v_init, k_tensor = ctx.saved_tensors
    need_x, need_v, need_k = ctx.needs_input_grad[:3]
    if not (need_x or need_v or need_k):
        return None, None, None, None, None
    flags = ctx.flags | (F_GRAD_X if need_x else 0) | (F_GRAD_V_INIT if need_v else 0) | (F_GRAD_K if need_k else 0)
    if not ctx.flags & F_RETURN_STATE:
        grad_v_final = None
    if not ctx.flags & F_RETURN_MEMBRANE:
        grad_v_seq = None
    grad_x, grad_v_init, grad_k = (bwd or neuron_bwd)(
        x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, ctx.params, flags
    )
    return grad_x if need_x else None, grad_v_init if need_v else None, grad_k if need_k else None, None, None


neuron_fwd.register_autograd(_backward, setup_context=_setup_context)


def _eager_bwd(x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, params, flags):
    with profiled("snntrain::neuron_bwd"):
        return _bwd_host(x, ckpt, v_init, k_tensor, grad_spikes, grad_v_final, grad_v_seq, params, flags, launch=True,
                         eager=True)


# The same forward and backward as the registered ops, launched without the operator machinery.
_EagerNeuron = eager_function("snntrain::neuron_fwd", functools.partial(_fwd_host, launch=True, eager=True),
                              _setup_context, functools.partial(_backward, bwd=_eager_bwd))


def neuron_multistep(
    x: Tensor,
    kind: str,
    *,
    tau: float = 2.0,
    w: Tensor | None = None,
    v_threshold: float = 1.0,
    v_reset: float | None = 0.0,
    decay_input: bool = True,
    detach_reset: bool = False,
    surrogate: str = "sigmoid",
    alpha: float = 4.0,
    v_init: Tensor | None = None,
    return_state: bool = True,
    return_membrane: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Run an IF (``kind="if"``), LIF (``"lif"``, time constant ``tau``) or PLIF (``"plif"``,
    ``1/tau = sigmoid(w)``) neuron over ``x`` ``[T, ...]`` with the Triton kernels.

    Returns ``(spikes, v_final or None, v_seq or None)``: spikes in ``x``'s dtype, the
    fp32 state after the last step when ``return_state``, the fp32 membrane after
    every step's reset when ``return_membrane``. Differentiable in ``x``, ``v_init``
    and ``w``. Arguments are expected to be validated already (``NeuronParams``).
    """
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the Triton neuron kernels take float32, float16 or bfloat16 "
                        "(use backend='torch' for other dtypes)")
    flags, k, k_tensor = neuron_flags(kind, tau, w, v_reset, decay_input, detach_reset, surrogate)
    if v_init is not None:
        v_init = v_init.to(device=x.device, dtype=torch.float32).contiguous()
    if return_state:
        flags |= F_RETURN_STATE
    if return_membrane:
        flags |= F_RETURN_MEMBRANE
    if torch.is_grad_enabled() and (
        x.requires_grad
        or (v_init is not None and v_init.requires_grad)
        or (k_tensor is not None and k_tensor.requires_grad)
    ):
        flags |= F_SAVE_CKPT
    params = [float(k), float(v_threshold), 0.0 if v_reset is None else float(v_reset), float(alpha)]
    fn = neuron_fwd if traced(x, v_init, k_tensor) else _EagerNeuron.apply
    spikes, v_final, _ckpt, v_seq = fn(x, v_init, k_tensor, params, flags)
    return spikes, v_final if return_state else None, v_seq if return_membrane else None
