"""What the fused channel norm -> multi-step IF/LIF/PLIF neuron families share.

Two families, one file each: batch norm (:mod:`snntrain.kernels.bn_neuron`) and layer norm over
channels (:mod:`snntrain.kernels.ln_neuron`), each followed by the neuron scan over T of
:mod:`snntrain.kernels.lif` (the step and the scans of :mod:`snntrain.kernels.neuron_step`,
every neuron option); launch sizes in :mod:`snntrain.kernels.norm_neuron_tuning`.

Input is the convolution's output ``[T, B, C, H, W]``, or ``[B, C, H, W]`` with a number
of steps ``T`` (``T=``; direct encoding: the same input current at every step, as a stride-0 time
axis; batch statistics then count each element once, exactly like the unfused model,
which normalises the stem output before repeating it). Every tensor is addressed as
``[T, B, C, S]`` (``S = H * W`` folded into one strided run) through its strides, so
contiguous NCHW and channels-last maps are read in place; other layouts are copied once.
Spikes come back in the input's dtype and memory format; statistics, the membrane and
all sums are fp32.

A program owns a tile of ``BLOCK_S`` positions of one sample x ``BLOCK_C`` channels (all
``C`` channels for layer norm) and scans T with the state in registers. Triton lays the
tile along the unit-stride axis (positions for NCHW, channels for channels-last).
For T > 4 the fp32 state is checkpointed every 8 steps as in :mod:`snntrain.kernels.lif`.
Per-channel sums and PLIF's dL/dk are per-program partials finished in a fixed order:
deterministic, no host synchronisation.

Host side. An eager call is host-bound at these sizes (a layer's kernels run for tens of
microseconds), so its host function keeps one plan per layout (input shape and strides,
flags, options): the allocations' shapes and each kernel's grid and scalar arguments, with the
launches bound once (:class:`~snntrain.kernels.op_utils.Planned`); a call allocates its
outputs and launches with its tensors. Traced calls (``torch.compile``, ``torch.export``)
build the same plan afresh and launch through ``wrap_triton``.

This module holds what both families use: on the device, a program's tile and pointers, the
two norms' arithmetic (:func:`_bn_apply`, :func:`_ln_rows`), the forward over T of a tile
(:func:`_fwd_scan`; the backward's scans are
:mod:`snntrain.kernels.neuron_step`'s) and the fixed-order sum of partial sums; on the host,
the plans' common parts, the backward's host function and the checks of the entry points'
arguments.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from .neuron_step import (
    F_DECAY_INPUT,
    F_GRAD_K,
    F_GRAD_X,
    F_HARD_RESET,
    F_LEAK,
    F_SAVE_CKPT,
    charge,
    chunk_steps,
    fire,
    neuron_flags,
    reset,
)
from .op_utils import (
    FLOAT_DTYPES,
    INT32_MAX,
    PlanCache,
    direct,
)

#: Where a residual joins a norm-neuron's forward (``RESIDUAL`` of :func:`_fwd_scan`): added to the spikes it stores
#: (SEW's ADD), or to the normalised input before the neuron; or what is stored is the spikes times it (SEW's AND) or
#: one minus the spikes times it (SEW's IAND).
ADD_TO_SPIKES, ADD_TO_INPUT, AND_SPIKES, IAND_SPIKES = 1, 2, 3, 4

#: Flag bit beyond the neuron's (:mod:`snntrain.kernels.neuron_step`): gradients of the norm's weight and bias.
#: The batch-norm family adds two more (:mod:`snntrain.kernels.bn_neuron`).
F_GRAD_WB = 1 << 14


# ----------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------


@triton.jit
def _tile(pid0, pid1, s_tiles, S, C, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
    """Sample, position and channel offsets of program (pid0, pid1) and the tile's mask."""
    b = (pid0 // s_tiles).to(tl.int64)
    offs_s = (pid0 % s_tiles) * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_c = pid1 * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    mask = (offs_s < S)[:, None] & mask_c[None, :]
    return b, offs_s, offs_c, mask_c, mask


@triton.jit
def _at(ptr, b, offs_s, offs_c, s_b, s_s, s_c):
    """[BLOCK_S, BLOCK_C] pointers to element (b, c, s) of a strided [B, C, S] step."""
    return ptr + b * s_b + offs_s.to(tl.int64)[:, None] * s_s + offs_c.to(tl.int64)[None, :] * s_c


@triton.jit
def _bn_apply(x, scale, shift):
    # one rounding (fma) in both the forward and the backward's recomputation
    return tl.math.fma(x, scale, shift)


@triton.jit
def _ln_rows(x, mask, C, eps, w, bias):
    """Layer norm of each row of a [BLOCK_S, BLOCK_C] tile over its C channels: (y, xhat, rstd)."""
    mean = tl.sum(x, axis=1) / C
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / C + eps)
    xhat = xc * rstd[:, None]
    return xhat * w[None, :] + bias[None, :], xhat, rstd


@triton.jit
def _normalise(x, mask, C, eps, a, b, LAYER_NORM: tl.constexpr):
    """Batch norm's ``x * a + b`` (``a``, ``b`` the folded per-channel scale and shift), or layer norm over the C
    channels of each row with weight ``a`` and bias ``b`` (``LAYER_NORM``)."""
    if LAYER_NORM:
        y, _xhat, _rstd = _ln_rows(x, mask, C, eps, a, b)
    else:
        y = _bn_apply(x, a, b)
    return y


@triton.jit
def _ckpt_at(ckpt_ptr, b, offs_s, offs_c, C, S, CL: tl.constexpr):
    """The tile's pointers at step 0 into the checkpoints (rows ``B * C * S`` apart, each a ``[B, C, S]`` map laid
    out channels-first, or with ``CL`` channels-last, as ``[B, S, C]``: a channels-last tile then reads its
    checkpoints in the layout it reads its input in, and needs no exchange of them through shared memory).

    Each pointer a kernel stores through comes from its own call of :func:`_at` or this (one pointer argument per
    call), with offsets from helpers that take no pointer (:func:`_tile`): PyTorch's analysis of which arguments a
    Triton kernel writes (``torch.compile``'s ``identify_accessed_tensors``) counts a store at an address computed
    from anything a helper returned as a write to every pointer that helper took, and would take the kernel's
    inputs for mutated ones (``tests/test_kernel_writes.py``)."""
    if CL:
        return _at(ckpt_ptr, b, offs_s, offs_c, C * S, C, 1)
    return _at(ckpt_ptr, b, offs_s, offs_c, C * S, 1, S)


@triton.jit
def _load_chunk(ptrs, stride_t, t0, T, mask, CHUNK: tl.constexpr):
    """The CHUNK steps from ``t0`` of a tensor whose step t is at ``ptrs + t * stride_t``: a tuple, in the tensor's
    dtype, zero past T."""
    vals = ()
    for j in tl.static_range(CHUNK):
        vals = vals + (tl.load(ptrs + tl.cast(t0 + j, tl.int64) * stride_t, mask=mask & (t0 + j < T), other=0.0),)
    return vals


@triton.jit
def _fwd_scan(x_ptrs, sx_t, s_ptrs, so_t, ck_ptrs, NCK, T, mask, v, norm_a, norm_b, C, eps, k, v_r, v_threshold,
              v_reset, LEAK: tl.constexpr, DECAY_INPUT: tl.constexpr, HARD_RESET: tl.constexpr,
              LAYER_NORM: tl.constexpr, EXPANDED: tl.constexpr, STORE_CKPT: tl.constexpr, COUNT: tl.constexpr,
              NO_FMA: tl.constexpr, CHUNK: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
              r_ptrs, RESIDUAL: tl.constexpr):
    """The forward over T of a tile from the state ``v``: chunk by chunk, the chunk's inputs loaded (step t at
    ``x_ptrs + t * sx_t``), then each step's input normalised by :func:`_normalise` and the neuron's step, its
    spikes stored at ``s_ptrs + t * so_t`` before the reset (the order these kernels were tuned in) and, with
    ``COUNT``, counted; the state checkpointed before every chunk but the first at ``ck_ptrs + (c - 1) * NCK``
    (``STORE_CKPT``). A stride-0 time axis (``EXPANDED``) is read and normalised once. ``RESIDUAL`` (the tensor at
    ``r_ptrs``, at the spikes' strides): 1 (:data:`ADD_TO_SPIKES`), what is stored is the spikes plus it, added in
    float32 and rounded once, as PyTorch adds the two; 2 (:data:`ADD_TO_INPUT`), it is added in float32 to the
    normalised input before the neuron's step; 3 (:data:`AND_SPIKES`) and 4 (:data:`IAND_SPIKES`), what is stored is
    ``spikes * r`` and ``(1 - spikes) * r`` (exact: each factor 0 or 1 times r). Returns the spikes of each element (``COUNT``; zero otherwise)."""
    out_dtype = s_ptrs.dtype.element_ty
    if EXPANDED:
        y_e = _normalise(tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32), mask, C, eps, norm_a, norm_b,
                         LAYER_NORM)
    fired = tl.zeros([BLOCK_S, BLOCK_C], dtype=tl.float32)
    for c_iter in range(tl.cdiv(T, CHUNK)):
        c = tl.cast(c_iter, tl.int32)
        t0 = c * CHUNK
        if STORE_CKPT:
            tl.store(ck_ptrs + tl.cast(c - 1, tl.int64) * NCK, v, mask=mask & (c > 0))
        if not EXPANDED:
            xs = _load_chunk(x_ptrs, sx_t, t0, T, mask, CHUNK)
        for j in tl.static_range(CHUNK):
            t = t0 + j
            valid = t < T
            if EXPANDED:
                y = y_e
            else:
                y = _normalise(xs[j].to(tl.float32), mask, C, eps, norm_a, norm_b, LAYER_NORM)
            if RESIDUAL == 2:  # a residual added to the neuron's input (Spiking ResNet's blocks)
                y += tl.load(r_ptrs + tl.cast(t, tl.int64) * so_t, mask=mask & valid, other=0.0).to(tl.float32)
            h = charge(y, v, k, v_r, LEAK, DECAY_INPUT, NO_FMA)
            spike = fire(h, v_threshold)
            out = tl.where(spike, 1.0, 0.0)
            if RESIDUAL == 1 or RESIDUAL >= 3:  # SEW's connection: the block's output in place of its spikes
                r = tl.load(r_ptrs + tl.cast(t, tl.int64) * so_t, mask=mask & valid, other=0.0).to(tl.float32)
                if RESIDUAL == 1:  # ADD
                    out += r
                elif RESIDUAL == 3:  # AND
                    out = tl.where(spike, r, 0.0)
                else:  # IAND
                    out = tl.where(spike, 0.0, r)
            tl.store(s_ptrs + tl.cast(t, tl.int64) * so_t, out.to(out_dtype), mask=mask & valid)
            if COUNT:
                fired += tl.where(spike & mask & valid, 1.0, 0.0)
            v = tl.where(valid, reset(h, spike, v_threshold, v_reset, HARD_RESET), v)
    return fired


@triton.jit
def _state_before(ck_ptrs, NCK, c, mask, v0):
    """The state before chunk ``c`` in a backward: the forward's checkpoint (row ``c - 1`` of ``ck_ptrs``, rows
    ``NCK`` apart), or ``v0`` before chunk 0."""
    return tl.where(c > 0, tl.load(ck_ptrs + tl.cast(c - 1, tl.int64) * NCK, mask=mask & (c > 0), other=0.0), v0)


@triton.jit
def _pair_sum_kernel(
    part_ptr,  # [G0, 2, C] fp32 partial sums
    out0_ptr,  # [C] fp32 out: sum over G0 of part[:, 0], in a fixed order
    out1_ptr,  # [C] fp32 out: sum over G0 of part[:, 1]
    G0, C,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    _pair_sum(part_ptr, out0_ptr, out1_ptr, offs_c, offs_c < C, G0, C, BLOCK_R, BLOCK_C)


@triton.jit
def _pair_sum(part_ptr, out0_ptr, out1_ptr, offs_c, mask_c, G0, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The channels ``offs_c`` of the two sums over the G0 partial rows of ``part_ptr``, in a fixed order."""
    acc0 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    for r0 in range(0, G0, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        m = (rows < G0)[:, None] & mask_c[None, :]
        base = part_ptr + rows.to(tl.int64)[:, None] * 2 * C + offs_c[None, :]
        acc0 += tl.load(base, mask=m, other=0.0, cache_modifier=".cg")
        acc1 += tl.load(base + C, mask=m, other=0.0, cache_modifier=".cg")
    tl.store(out0_ptr + offs_c, tl.sum(acc0, axis=0), mask=mask_c)
    tl.store(out1_ptr + offs_c, tl.sum(acc1, axis=0), mask=mask_c)


# ----------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------


def _map(x: Tensor, T: int | None) -> tuple[Tensor, int, int, int, int, tuple[int, int, int, int]]:
    """``(x, B, C, H, W, (st, sb, sc, ss))``: ``x`` addressed as [T, B, C, S] (st = 0 for
    [B, C, H, W] input repeated over T); copies only layouts whose H, W do not fold into one run."""
    if T is None:
        _, B, C, H, W = x.shape
    else:
        B, C, H, W = x.shape
    for _ in range(2):
        if T is None:
            st, sb, sc, sh, sw = x.stride()
        else:
            st, (sb, sc, sh, sw) = 0, x.stride()
        if H == 1:
            ss = sw
        elif W == 1 or sh == W * sw:
            ss = sw if W > 1 else sh
        else:
            x = x.contiguous()
            continue
        return x, B, C, H, W, (st, sb, sc, ss)
    raise AssertionError("unreachable")


def _strides(t: Tensor, expanded: bool) -> tuple[int, int, int, int]:
    """(st, sb, sc, ss) of a tensor whose H, W fold into one run (outputs, gradients made so)."""
    if expanded and t.dim() == 4:
        sb, sc, sh, sw = t.stride()
        st = 0
    else:
        st, sb, sc, sh, sw = t.stride()
    H, W = t.shape[-2:]
    return st, sb, sc, (sw if W > 1 else sh)


def _grad_map(g: Tensor) -> tuple[Tensor, tuple[int, int, int, int]]:
    """dL/dS addressed as [T, B, C, S]; an odd layout is copied once."""
    T, B, C, H, W = g.shape
    st, sb, sc, sh, sw = g.stride()
    if H > 1 and W > 1 and sh != W * sw:
        g = g.contiguous()
        st, sb, sc, sh, sw = g.stride()
    return g, (st, sb, sc, sw if W > 1 else sh)


@functools.lru_cache(maxsize=None)
def _neuron_consts(flags: int) -> dict:
    return dict(LEAK=bool(flags & F_LEAK), DECAY_INPUT=bool(flags & F_DECAY_INPUT),
                HARD_RESET=bool(flags & F_HARD_RESET))


def _n_ckpt(T: int, flags: int) -> int:
    chunk = chunk_steps(T)
    return max((T + chunk - 1) // chunk - 1, 0) if flags & F_SAVE_CKPT else 0


def _check_size(B: int, C: int, S: int) -> None:
    if B * C * S > INT32_MAX:
        raise ValueError(f"a time step has {B * C * S} elements; the fused norm-neuron kernels support at most "
                         f"{INT32_MAX}")


class _FwdPlan:
    """What a forward launches for one layout (input shape and strides, flags, options): the allocations' shapes
    and the kernels' launches (:class:`~snntrain.kernels.op_utils.Planned`)."""

    __slots__ = ("copy", "out_shape", "out_strides", "ckpt_shape", "C", "part_shape", "ws", "launches")


def _fwd_plan(x: Tensor, T: int, flags: int) -> tuple[_FwdPlan, bool, int, int, int, tuple[int, ...]]:
    """A forward plan with its outputs' shapes (spikes in x's memory format), whether x is ``[B, C, H, W]``
    repeated over T (``expanded``), and ``B, C, S = H * W`` and x's strides as ``_map`` gives them."""
    expanded = x.dim() == 4
    xk, B, C, H, W, strides = _map(x, T if expanded else None)
    _check_size(B, C, H * W)
    plan = _FwdPlan()
    plan.copy, plan.C, plan.part_shape, plan.launches = xk is not x, C, None, ()
    S = H * W
    plan.out_shape, plan.out_strides = spike_layout(x, T)
    plan.ckpt_shape = (_n_ckpt(T, flags), B, C, S)
    plan.ws = None
    return plan, expanded, B, C, S, strides


def spike_layout(x: Tensor, T: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides of the spikes of a forward of ``x`` (``[T, B, C, H, W]``, or ``[B, C, H, W]`` repeated
    over ``T``): ``[T, B, C, H, W]``, channels-last where ``x`` is (its channels of stride 1), else contiguous."""
    B, C, H, W = x.shape[-4:]
    S = H * W
    channels_last = C > 1 and S > 1 and x.stride()[-3] == 1
    return (T, B, C, H, W), ((B * S * C, S * C, 1, W * C, C) if channels_last else (B * C * S, C * S, S, W, 1))


def _spike_strides(plan: _FwdPlan) -> tuple[int, int, int, int]:
    """(st, sb, sc, ss) of the spikes :func:`_spikes` makes: their W stride steps along S."""
    st, sb, sc, _sh, sw = plan.out_strides
    return st, sb, sc, sw


def _fwd_outputs(plan: _FwdPlan, x: Tensor) -> tuple[Tensor, Tensor]:
    """The spikes (x's dtype and memory format) and the checkpoints of a forward."""
    return _spikes(plan, x), torch.empty(plan.ckpt_shape, dtype=torch.float32, device=x.device)


def _spikes(plan: _FwdPlan, x: Tensor) -> Tensor:
    return torch.empty_strided(plan.out_shape, plan.out_strides, dtype=x.dtype, device=x.device)


def _plan(cache: PlanCache, key: tuple, build):
    """An eager call's plan: ``build(launches=True, fuse=True)``, kept in ``cache`` under ``key`` (traced and fake
    calls build theirs afresh, without ``fuse``)."""
    plan = cache.get(key)
    return cache.put(key, build(True, True)) if plan is None else plan


def _wb(sums: tuple[Tensor, Tensor], weight: Tensor | None, bias: Tensor | None, need_wb: bool, iw: int,
        ib: int) -> tuple[Tensor, Tensor]:
    """dL/dweight and dL/dbias (sums ``iw``, ``ib``, fp32) in the parameters' dtypes; empty if not needed."""
    if not need_wb:
        return sums[0].new_empty(0), sums[0].new_empty(0)  # two tensors: an op's outputs may not alias
    gw = sums[iw] if weight.dtype == torch.float32 else sums[iw].to(weight.dtype)
    if bias is None:
        return gw, sums[0].new_empty(0)
    return gw, sums[ib] if bias.dtype == torch.float32 else sums[ib].to(bias.dtype)


class _BwdPlan:
    """What a backward launches for one layout (input and gradient strides, flags, options)."""

    __slots__ = ("copy_x", "copy_g", "need_x", "need_wb", "need_k", "C", "part_shape", "gk_shape", "launches")


def _bwd_plan(x: Tensor, T: int, flags: int, has_w: bool, has_k: bool):
    """A backward plan with what it needs, x mapped as ``_map`` does, whether it is expanded (as in
    :func:`_fwd_plan`), ``B, C, S`` and its strides."""
    expanded = x.dim() == 4
    xk, B, C, H, W, strides = _map(x, T if expanded else None)
    plan = _BwdPlan()
    plan.copy_x, plan.copy_g, plan.C, plan.part_shape, plan.gk_shape, plan.launches = xk is not x, False, C, None, \
        None, ()
    plan.need_x = bool(flags & F_GRAD_X)
    plan.need_wb = bool(flags & F_GRAD_WB) and has_w
    plan.need_k = bool(flags & F_GRAD_K) and has_k
    return plan, xk, expanded, B, C, H * W, strides


def _bwd_grad_maps(plan: _BwdPlan, xk: Tensor, grad_spikes: Tensor, expanded: bool):
    """dL/dS's strides (``plan.copy_g`` where it is copied) and dL/dx's (in the layout of the mapped input)."""
    gs, sg = _grad_map(grad_spikes)
    plan.copy_g = gs is not grad_spikes
    sd = _strides(torch.empty_like(xk, device="meta"), expanded) if plan.need_x else (0, 0, 0, 0)
    return sg, sd


def _bwd_outputs(plan: _BwdPlan, x: Tensor, k_tensor: Tensor | None, launch: bool,
                 eager: bool) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None, dict]:
    """dL/dx (empty unless needed), the two per-channel sums, dL/dk (empty unless needed; None in an eager call)
    and the partial sums' buffers of a backward. The sums are separate tensors: they become the parameters'
    gradients, which keep their storage alive."""
    dev = x.device
    grad_x = torch.empty_like(x) if plan.need_x else torch.empty(0, dtype=x.dtype, device=dev)
    sums = (torch.empty(plan.C, dtype=torch.float32, device=dev), torch.empty(plan.C, dtype=torch.float32, device=dev))
    grad_k = None if eager and not plan.need_k else \
        torch.empty(k_tensor.shape if plan.need_k else (0,), dtype=torch.float32, device=dev)
    scratch = {}
    if launch and plan.part_shape is not None:
        scratch["part"] = torch.empty(plan.part_shape, dtype=torch.float32, device=dev)
    if launch and plan.gk_shape is not None:
        scratch["gk_part"] = torch.empty(plan.gk_shape, dtype=torch.float32, device=dev)
    return grad_x, sums, grad_k, scratch


def _bwd_run(plan: _BwdPlan, wrap, x: Tensor, grad_x: Tensor, sums: tuple[Tensor, Tensor], grad_k: Tensor | None,
             grad_spikes: Tensor, **tensors) -> None:
    """Launch a backward plan (the sums are zero where it launches nothing)."""
    if not plan.launches:
        for t in (*sums, grad_k):
            if t is not None:
                t.zero_()
        return
    tensors.update(x=x, gs=grad_spikes.contiguous() if plan.copy_g else grad_spikes, sum0=sums[0], sum1=sums[1],
                   grad_x=grad_x, grad_k=grad_k)
    for planned in plan.launches:
        planned(wrap, tensors)


def _bwd_host(cache: PlanCache, plan_fn, x: Tensor, weight: Tensor | None, bias: Tensor | None,
              k_tensor: Tensor | None, grad_spikes: Tensor, T: int, params: list[float], flags: int, launch: bool,
              wrap, wb: tuple[int, int], eager: bool, residual: Tensor | None = None,
              residual_to: int = ADD_TO_INPUT, **saved: Tensor | None) -> tuple[Tensor, ...]:
    """A backward's host function over its norm's ``plan_fn`` (calls that launch directly reuse the plan of their
    layout): ``(dL/dx, dL/dweight, dL/dbias, dL/dk)``, the weight and bias gradients the sums ``wb``; ``eager``:
    not the operator (dL/dk is None where not asked for); ``saved`` are the forward's tensors the kernels read
    besides x, the parameters and dL/dS. ``residual``: the tensor the forward added to the neuron's input
    (``ADD_TO_INPUT``; ``plan_fn`` takes it), whose gradient, dL/dy in dL/dx's layout, is a fifth result; or (with
    ``residual_to`` ``AND_SPIKES``, ``IAND_SPIKES``) the tensor the forward's stored spikes were gated by,
    ``grad_spikes`` the gradient of that output, and its gradient (in its layout) the fifth result."""
    def build(launches: bool, fuse: bool = False) -> _BwdPlan:
        more = {} if residual is None else {"residual": residual, "residual_to": residual_to}
        return plan_fn(x, grad_spikes, T, params, flags, weight is not None, bias is not None, k_tensor is not None,
                       launches, fuse, **more)

    if launch and wrap is direct:
        plan = _plan(cache, (x.shape, x.stride(), grad_spikes.stride(), x.device, T, flags, weight is None,
                             bias is None, k_tensor is None, None if residual is None else residual.stride(),
                             residual_to, *params),
                     build)
    else:
        plan = build(launch)
    if plan.copy_x:
        x = x.contiguous()
    grad_x, sums, grad_k, scratch = _bwd_outputs(plan, x, k_tensor, launch, eager)
    if residual is not None:
        scratch.update(residual=residual,
                       grad_r=torch.empty_like(x if residual_to == ADD_TO_INPUT else residual))
    if launch:
        _bwd_run(plan, wrap, x, grad_x, sums, grad_k, grad_spikes, weight=weight, bias=bias, k=k_tensor, **saved,
                 **scratch)
    out = grad_x, *_wb(sums, weight, bias, plan.need_wb, *wb), grad_k
    return out if residual is None else (*out, scratch["grad_r"])


def _grad_flags(ctx, flags: int, i_x: int, i_w: int, i_b: int, i_k: int) -> tuple[int, bool, bool, bool, bool]:
    need = ctx.needs_input_grad
    nx, nw, nb, nk = need[i_x], need[i_w], need[i_b], need[i_k]
    flags |= (F_GRAD_X if nx else 0) | (F_GRAD_WB if nw or nb else 0) | (F_GRAD_K if nk else 0)
    return flags, nx, nw, nb, nk


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------


def _prepare(x: Tensor, T: int | None, neuron: dict) -> tuple[int, int, float, Tensor | None]:
    """``(T, flags, k, k_tensor)``: the steps of ``x`` ``[T, B, C, H, W]``, or ``T`` for ``[B, C, H, W]`` (the
    shapes and T as :class:`snntrain.nn.NormNeuron` checked them), and the neuron's option bits."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the fused norm-neuron kernels take float32, float16 or bfloat16 "
                        "(use backend='torch' for other dtypes)")
    if T is None:
        T = x.shape[0]
    flags, k, k_tensor = neuron_flags(neuron["kind"], neuron.get("tau", 2.0), neuron.get("w"),
                                      neuron.get("v_reset", 0.0), neuron.get("decay_input", True),
                                      neuron.get("detach_reset", False), neuron.get("surrogate", "sigmoid"))
    return T, flags, k, k_tensor


def _params(k: float, neuron: dict, eps: float) -> list[float]:
    v_reset = neuron.get("v_reset", 0.0)
    return [float(k), float(neuron.get("v_threshold", 1.0)), 0.0 if v_reset is None else float(v_reset),
            float(neuron.get("alpha", 4.0)), float(eps)]


def _needs_ckpt(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
